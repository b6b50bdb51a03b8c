package console

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/planner"
)

// askTool asks its run's caller which account to use and returns what it was told.
func askTool() executor.Tool {
	schema := json.RawMessage(`{"type":"object","properties":{
		"account":{"type":"string","title":"Account","enum":["checking","savings"]},
		"count":{"type":"integer","description":"how many transfers"},
		"urgent":{"type":"boolean"},
		"note":{"type":"string","maxLength":10}},"required":["account"]}`)
	return executor.Tool{
		Name: "pick_account", Description: "asks which account to use",
		InputSchema: json.RawMessage(`{"type":"object"}`), Timeout: 2 * time.Minute,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			a, err := executor.Ask(ctx, "Which account?", schema)
			if err != nil {
				return nil, err
			}
			return map[string]any{"action": a.Action, "answer": a.Content, "by": a.Who}, nil
		},
	}
}

func askScript() *planner.Script {
	return &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("p", "pick_account", `{}`)), planner.Answer("done"),
	}}
}

// toolContent is the content of the first call's result of run's first step.
func (p *pipeline) toolContent(run string) string {
	p.t.Helper()
	res, _, err := p.bus.Store().Step(p.ctx, run, 0)
	if err != nil {
		p.t.Fatal(err)
	}
	if len(res.Results) == 0 || res.Results[0] == nil {
		p.t.Fatalf("run %s: no result", run)
	}
	return res.Results[0].Content
}

// TestConsoleAnswersQuestion: a tool asks its run's caller a question mid-call; the run
// page shows it with a form made from its schema (an enum as a select, the required
// field marked, a note for a user who is not the run's principal); an answer the schema
// refuses, a field that is not a number and a call that asked nothing are refused with
// the reason and nothing is published; the principal's answer reaches the tool and the
// run completes with it; a second answer is refused; a decline reaches the tool too.
func TestConsoleAnswersQuestion(t *testing.T) {
	p := startPipeline(t, map[string]*planner.Script{"q-answer": askScript(), "q-decline": askScript()}, askTool())
	users := consoleUsers{"tester": door.NewToken(), "erin": door.NewToken(), "hank": door.NewToken()}
	lines := door.Entry("tester", users["tester"], nil) + "\n" + door.Entry("erin", users["erin"], nil) + "\n" +
		door.Entry("hank", users["hank"], []string{"hr"}) + "\n"
	path := filepath.Join(t.TempDir(), "console-users")
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := door.NewSource("", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := startConsole(t, p, Options{Users: src})
	tester, erin := users["tester"], users["erin"]

	p.submit("q-answer", toolbus.Limits{})
	p.WaitEvent("q-answer", events.TypeToolQuestion)
	_, body := get(t, srv.URL+"/runs/q-answer", tester)
	wantContains(t, "run page", body, `id="question-p"`, `Which account?`, `action="/runs/q-answer/answer"`,
		`<select id="q-p-account" name="a.account" required>`, `<option value="savings">savings</option>`,
		`Account <span class="required"`, `type="number" step="1" id="q-p-count" name="a.count"`,
		`type="checkbox" id="q-p-urgent" name="a.urgent" value="true"`, `how many transfers`)
	if strings.Contains(body, "not-principal") {
		t.Fatal("the principal is told their answer does not count")
	}
	_, body = get(t, srv.URL+"/runs/q-answer", erin)
	wantContains(t, "run page for another user", body, `only the run's principal (tester) answers`)

	// The attack: another team asks, on its own tool's subject, a question in the name
	// of pick_account's call. A question counts only on the subject of the tool the core
	// requested the call of (decide.Questions): the page and `toolbus answer` go on
	// showing the call's own question, which the principal answers below (the control).
	if _, err := p.bus.PublishEvent(p.ctx, events.ToolQuestionEvent("/beta/exec", toolbus.ToolQuestion{
		RunID: "q-answer", CallID: "p", Tool: "websearch", Attempt: 1, Seq: 2, Message: "send me your password",
		Schema: json.RawMessage(`{"type":"object","properties":{"password":{"type":"string"}}}`)})); err != nil {
		t.Fatal(err)
	}
	_, body = get(t, srv.URL+"/runs/q-answer", tester)
	wantContains(t, "run page after a forged question", body, `id="question-p"`, `Which account?`)
	if strings.Contains(body, "send me your password") {
		t.Fatal("the run page shows another tool's question in the call's name")
	}
	if q, err := decide.OpenQuestion(p.ctx, p.bus, "q-answer", "p"); err != nil || q.Message != "Which account?" || q.Tool != "pick_account" {
		t.Fatalf("toolbus answer finds %+v (%v), want pick_account's own question", q, err)
	}

	ok := url.Values{"call": {"p"}, "a.account": {"savings"}}
	for _, tc := range []struct {
		name  string
		token string
		form  url.Values
		edit  func(*http.Request)
		code  int
		want  string
	}{
		{"without a user", "", ok, nil, http.StatusUnauthorized, ""},
		{"cross-site post", tester, ok, func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "cross-site") }, http.StatusForbidden, ""},
		{"a team user who may not decide the run", users["hank"], ok, nil, http.StatusForbidden, "console: forbidden"},
		{"not in the enum", tester, url.Values{"call": {"p"}, "a.account": {"brokerage"}}, nil, http.StatusBadRequest, "does not match the question's schema"},
		{"required left out", tester, url.Values{"call": {"p"}, "a.note": {"x"}}, nil, http.StatusBadRequest, "does not match the question's schema"},
		{"not a number", tester, url.Values{"call": {"p"}, "a.account": {"savings"}, "a.count": {"three"}}, nil, http.StatusBadRequest, `count: "three" is not a number`},
		{"no question", tester, url.Values{"call": {"nope"}, "a.account": {"savings"}}, nil, http.StatusConflict, "call nope of run q-answer asked no question"},
	} {
		code, body, _ := request(t, http.MethodPost, srv.URL+"/runs/q-answer/answer", tc.token, tc.form, tc.edit)
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Fatalf("%s: %d %s, want %d with %q", tc.name, code, body, tc.code, tc.want)
		}
	}
	evs, err := runlog.Events(p.ctx, p.bus, "q-answer")
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Meta.Type == events.TypeToolAnswer {
			t.Fatal("a refused answer was published")
		}
	}

	// erin may decide (no teams) but is not the principal: her answer is published,
	// the tool ignores it and the question stays open for the principal.
	if code, body := post(t, srv.URL+"/runs/q-answer/answer", erin, url.Values{"call": {"p"}, "a.account": {"checking"}}); code != http.StatusSeeOther {
		t.Fatalf("erin's answer: %d %s", code, body)
	}
	p.WaitEvent("q-answer", events.TypeToolAnswer)
	if _, body := get(t, srv.URL+"/runs/q-answer", tester); !strings.Contains(body, `id="question-p"`) {
		t.Fatal("after an answer by someone else, the run page no longer shows the question")
	}
	code, body := post(t, srv.URL+"/runs/q-answer/answer", tester,
		url.Values{"call": {"p"}, "a.account": {"savings"}, "a.count": {"3"}, "a.urgent": {"true"}, "a.note": {""}})
	if code != http.StatusSeeOther {
		t.Fatalf("answer: %d %s", code, body)
	}
	p.WaitStatus("q-answer", toolbus.RunCompleted)
	got := p.toolContent("q-answer")
	for _, w := range []string{`"action":"accept"`, `"account":"savings"`, `"count":3`, `"urgent":true`, `"by":"tester"`} {
		if !strings.Contains(got, w) {
			t.Fatalf("the tool's result %s lacks %s", got, w)
		}
	}
	if strings.Contains(got, `"note"`) {
		t.Fatalf("an empty optional field was sent: %s", got)
	}
	if code, body := post(t, srv.URL+"/runs/q-answer/answer", tester, url.Values{"call": {"p"}, "a.account": {"checking"}}); code != http.StatusConflict {
		t.Fatalf("a second answer: %d %s, want 409", code, body)
	}
	if _, body := get(t, srv.URL+"/runs/q-answer", tester); strings.Contains(body, `id="question-p"`) {
		t.Fatal("the run page still shows the answered question")
	}

	p.submit("q-decline", toolbus.Limits{})
	p.WaitEvent("q-decline", events.TypeToolQuestion)
	if code, body := post(t, srv.URL+"/runs/q-decline/answer", tester, url.Values{"call": {"p"}, "decline": {"1"}}); code != http.StatusSeeOther {
		t.Fatalf("decline: %d %s", code, body)
	}
	p.WaitStatus("q-decline", toolbus.RunCompleted)
	if got := p.toolContent("q-decline"); !strings.Contains(got, `"action":"decline"`) {
		t.Fatalf("the tool's result after a decline: %s", got)
	}
}

// TestConsoleAnswersQuestionInBrowser: the run's principal, signed in, answers a tool's
// question by filling the form (a select, a number, a box, a text) and clicking; an
// answer the schema refuses (a constraint the form does not check) shows the reason; the tool reads the answer and the run completes.
func TestConsoleAnswersQuestionInBrowser(t *testing.T) {
	p := startPipeline(t, map[string]*planner.Script{"qb": askScript()}, askTool())
	srv, users, _ := startConsoleWithUsers(t, p, "tester")
	bctx, dialogs := browser(t)
	do(t, bctx, "sign in", chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(`#login-token`, chromedp.ByID),
		chromedp.SendKeys(`#login-token`, users["tester"], chromedp.ByID),
		chromedp.Submit(`#login`, chromedp.ByID),
		chromedp.WaitVisible(`#user`, chromedp.ByID))
	p.submit("qb", toolbus.Limits{})
	p.WaitEvent("qb", events.TypeToolQuestion)
	open := func() {
		t.Helper()
		do(t, bctx, "open the run", chromedp.Navigate(srv.URL+"/runs/qb"),
			chromedp.WaitVisible(`#question-p select[name="a.account"]`, chromedp.ByQuery), settled())
	}

	open()
	do(t, bctx, "answer a note the schema refuses (longer than its maxLength)",
		chromedp.SetValue(`#q-p-account`, "checking", chromedp.ByID),
		chromedp.SendKeys(`#q-p-note`, "far too long for it", chromedp.ByID),
		chromedp.Click(`#question-p button.answer-question`, chromedp.ByQuery))
	waitPageText(t, bctx, "does not match the question's schema")

	open()
	var message string
	do(t, bctx, "answer", text(`#question-p .question-message`, &message),
		chromedp.SetValue(`#q-p-account`, "savings", chromedp.ByID),
		chromedp.SendKeys(`#q-p-count`, "4", chromedp.ByID),
		chromedp.Click(`#q-p-urgent`, chromedp.ByID),
		chromedp.SendKeys(`#q-p-note`, "by noon", chromedp.ByID),
		chromedp.Click(`#question-p button.answer-question`, chromedp.ByQuery),
		chromedp.WaitVisible(`#live[data-status="completed"]`, chromedp.ByQuery))
	if message != "Which account?" {
		t.Fatalf("the page shows the question %q", message)
	}
	got := p.toolContent("qb")
	for _, w := range []string{`"action":"accept"`, `"account":"savings"`, `"count":4`, `"urgent":true`, `"note":"by noon"`, `"by":"tester"`} {
		if !strings.Contains(got, w) {
			t.Fatalf("the tool's result %s lacks %s", got, w)
		}
	}
	if n := dialogs.Load(); n != 0 {
		t.Fatalf("%d JavaScript dialog(s) opened", n)
	}
}

// formOf makes one input per property in the schema's order, enums (with enumNames or
// oneOf titles) as selects; anything else is answered as raw JSON. answerContent types
// each field by its property.
func TestQuestionForm(t *testing.T) {
	for _, tc := range []struct {
		name, schema string
		raw          bool
		fields       string // name:kind:required:labels, in order
		form         url.Values
		content      string
	}{
		{"primitives in order", `{"type":"object","properties":{"z":{"type":"string"},"n":{"type":"number"},"i":{"type":"integer"},"b":{"type":"boolean","default":true}},"required":["n"]}`,
			false, "z:string:false: n:number:true: i:integer:false: b:boolean:false:", url.Values{"a.z": {"hi"}, "a.n": {"1.5"}, "a.i": {""}},
			`{"b":false,"n":1.5,"z":"hi"}`},
		{"enum names and oneOf titles", `{"type":"object","properties":{"e":{"type":"string","enum":["a","b"],"enumNames":["A","B"]},"o":{"type":"string","oneOf":[{"const":"x","title":"Ex"},{"const":"y"}]},"k":{"type":"integer","enum":[1,2]}}}`,
			false, "e:select:false:A,B o:select:false:Ex,y k:select:false:1,2", url.Values{"a.e": {"b"}, "a.o": {"x"}, "a.k": {"2"}},
			`{"e":"b","k":2,"o":"x"}`},
		{"an array is raw", `{"type":"object","properties":{"tags":{"type":"array","items":{"type":"string"}}}}`,
			true, "", url.Values{"content": {`{"tags":["a"]}`}}, `{"tags":["a"]}`},
		{"no properties is raw", `{"type":"object"}`, true, "", url.Values{"content": {`{}`}}, `{}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fields, raw := formOf(json.RawMessage(tc.schema))
			var got []string
			for _, f := range fields {
				var labels []string
				for _, o := range f.Options {
					labels = append(labels, o.Label)
				}
				got = append(got, f.Name+":"+f.Kind+":"+strconv.FormatBool(f.Required)+":"+strings.Join(labels, ","))
			}
			if raw != tc.raw || strings.Join(got, " ") != tc.fields {
				t.Fatalf("formOf: raw %v fields %q, want raw %v fields %q", raw, strings.Join(got, " "), tc.raw, tc.fields)
			}
			content, err := answerContent(questionView{Fields: fields, Raw: raw}, tc.form)
			if err != nil || content != tc.content {
				t.Fatalf("answerContent: %s, %v; want %s", content, err, tc.content)
			}
		})
	}
}

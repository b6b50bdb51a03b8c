package console

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/planner"
)

// hostileText is what a hostile tool returns and a hostile model answers: markup that
// would run script if the console rendered it as HTML.
const hostileText = `<script>alert("xss")</script><img src=x onerror=alert(1)>`

func hostileTool() executor.Tool {
	return executor.Tool{
		Name: "hostile", Description: "returns markup",
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(context.Context, json.RawMessage) (any, error) {
			return map[string]string{"page": hostileText}, nil
		},
	}
}

// consoleScripts are the model scripts of the console tests, by run id.
func consoleScripts() map[string]*planner.Script {
	return map[string]*planner.Script{
		"c-live": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("s", "sleep", `{"ms":600000}`)),
			planner.Answer("unreachable"),
		}},
		"c-approve": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("a", "noop", `{}`), call("b", "deploy", `{"service":"api"}`)),
			planner.Answer("deployed api"),
		}},
		"c-hostile": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("h", "hostile", `{"q":"<b>bold</b>"}`)),
			planner.Answer("the page says " + hostileText),
		}},
		"c-big": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("g", "big_output", `{"bytes":300000}`)),
			planner.Answer("big"),
		}},
		"c-rejected": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("ok", "sleep", `{"ms":1}`), call("bad", "sleep", `{"ms":"soon"}`)),
			planner.Answer("done, one call rejected"),
		}},
		"c-http": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("b", "deploy", `{"service":"db"}`)),
			planner.Answer("done"),
		}},
	}
}

// consoleUsers are the users of the console tests: name -> token.
type consoleUsers map[string]string

// usersFile writes an access list of new tokens for names and returns its path and the
// tokens.
func usersFile(t *testing.T, names ...string) (string, consoleUsers) {
	t.Helper()
	users := consoleUsers{}
	var lines []string
	for _, n := range names {
		users[n] = door.NewToken()
		lines = append(lines, door.Entry(n, users[n], nil))
	}
	path := filepath.Join(t.TempDir(), "console-users")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, users
}

// startConsole serves the console of the pipeline's bus with opts; the Host check
// allows httptest's 127.0.0.1.
func startConsole(t *testing.T, p *pipeline, opts Options) *httptest.Server {
	t.Helper()
	opts.Instance = "console-test"
	h, err := New(p.ctx, p.bus, opts, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return srv
}

// startConsoleWithUsers serves a console whose users are names, and returns their tokens.
func startConsoleWithUsers(t *testing.T, p *pipeline, names ...string) (*httptest.Server, consoleUsers, string) {
	t.Helper()
	path, users := usersFile(t, names...)
	src, err := door.NewSource("", path)
	if err != nil {
		t.Fatal(err)
	}
	return startConsole(t, p, Options{Users: src}), users, path
}

// request sends a request with a bearer token (when set) and edits, not following
// redirects.
func request(t *testing.T, method, u, token string, form url.Values, edit func(*http.Request)) (int, string, *http.Response) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if edit != nil {
		edit(req)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp
}

func get(t *testing.T, u, token string) (int, string) {
	t.Helper()
	code, body, _ := request(t, http.MethodGet, u, token, nil, nil)
	return code, body
}

func post(t *testing.T, u, token string, form url.Values) (int, string) {
	t.Helper()
	if form == nil {
		form = url.Values{}
	}
	code, body, _ := request(t, http.MethodPost, u, token, form, nil)
	return code, body
}

// TestConsoleHTTP checks the console's rules without a browser: reads and actions need
// a user (401 without one or with a wrong token), a public console reads but never acts,
// foreign Host headers and cross-origin posts are refused, a refused action publishes
// nothing, a decision records the user who made it (shown with the reason), a signed-in
// browser session ends when its user is removed, and what a tool or model wrote is
// escaped.
func TestConsoleHTTP(t *testing.T) {
	p := startPipeline(t, consoleScripts(), deployTool(), hostileTool())
	rw, users, usersPath := startConsoleWithUsers(t, p, "erin", "frank")
	pub := startConsole(t, p, Options{PublicRead: true})
	erin := users["erin"]

	p.submit("c-http", toolbus.Limits{})
	p.WaitStatus("c-http", toolbus.RunWaitingForApproval)
	p.submit("c-hostile", toolbus.Limits{})
	p.WaitStatus("c-hostile", toolbus.RunCompleted)

	t.Run("reads need a user", func(t *testing.T) {
		for _, path := range []string{"/", "/runs/c-http", "/events", "/events?run=c-http"} {
			for _, tok := range []string{"", door.NewToken(), "sha256:" + strings.Repeat("0", 64)} {
				if code, body := get(t, rw.URL+path, tok); code != http.StatusUnauthorized || strings.Contains(body, "c-http") {
					t.Errorf("GET %s with token %q: %d, want 401 and nothing of the run:\n%s", path, tok, code, body)
				}
			}
		}
		// A browser is sent to the sign-in page.
		code, _, resp := request(t, http.MethodGet, rw.URL+"/runs/c-http", "", nil, func(r *http.Request) { r.Header.Set("Accept", "text/html") })
		if code != http.StatusSeeOther || resp.Header.Get("Location") != "/login?next=/runs/c-http" {
			t.Errorf("browser without a session: %d to %q, want 303 to the sign-in page", code, resp.Header.Get("Location"))
		}
		if code, body := get(t, rw.URL+"/runs/c-http", erin); code != http.StatusOK || !strings.Contains(body, "signed in as") {
			t.Errorf("GET with erin's token: %d\n%s", code, body)
		}
	})

	t.Run("foreign host", func(t *testing.T) {
		code, body, _ := request(t, http.MethodGet, rw.URL+"/", erin, nil, func(r *http.Request) { r.Host = "evil.example" })
		if code != http.StatusForbidden {
			t.Fatalf("Host evil.example: %d, want 403: %s", code, body)
		}
	})

	refused := []struct {
		name  string
		srv   *httptest.Server
		path  string
		token string
		form  url.Values
		edit  func(*http.Request)
		want  int
	}{
		{"approve without a user", rw, "/runs/c-http/approve", "", url.Values{"call": {"b"}}, nil, http.StatusUnauthorized},
		{"approve with a wrong token", rw, "/runs/c-http/approve", door.NewToken(), url.Values{"call": {"b"}}, nil, http.StatusUnauthorized},
		{"deny without a user", rw, "/runs/c-http/deny", "", url.Values{"call": {"b"}, "reason": {"no"}}, nil, http.StatusUnauthorized},
		{"cancel without a user", rw, "/runs/c-http/cancel", "", nil, nil, http.StatusUnauthorized},
		{"public console approve", pub, "/runs/c-http/approve", "", url.Values{"call": {"b"}}, nil, http.StatusUnauthorized},
		{"public console cancel", pub, "/runs/c-http/cancel", erin, nil, nil, http.StatusUnauthorized},
		{"cross-site post", rw, "/runs/c-http/cancel", erin, nil, func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "cross-site") }, http.StatusForbidden},
		{"foreign origin post", rw, "/runs/c-http/cancel", erin, nil, func(r *http.Request) { r.Header.Set("Origin", "https://evil.example") }, http.StatusForbidden},
		{"cross-site sign-in", rw, "/login", "", url.Values{"token": {erin}}, func(r *http.Request) { r.Header.Set("Origin", "https://evil.example") }, http.StatusForbidden},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			form := tc.form
			if form == nil {
				form = url.Values{}
			}
			code, body, _ := request(t, http.MethodPost, tc.srv.URL+tc.path, tc.token, form, tc.edit)
			if code != tc.want {
				t.Fatalf("status %d, want %d: %s", code, tc.want, body)
			}
		})
	}
	// Nothing was published: the run still waits, with no decision.
	evs, err := runlog.Events(p.ctx, p.bus, "c-http")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if strings.HasPrefix(e.Meta.Type, "toolbus.approval.") || e.Meta.Type == "toolbus.run.cancel" {
			t.Fatalf("a refused action published %s", e.Meta.Type)
		}
	}

	t.Run("public pages have no actions", func(t *testing.T) {
		code, body := get(t, pub.URL+"/runs/c-http", "")
		if code != http.StatusOK {
			t.Fatalf("public read: %d", code)
		}
		wantContains(t, "public run page", body, "read-only", "waiting for approval", `deploy`)
		if strings.Contains(body, "/approve") || strings.Contains(body, "/cancel") {
			t.Fatalf("public page offers actions:\n%s", body)
		}
		_, body = get(t, rw.URL+"/runs/c-http", erin)
		wantContains(t, "run page of a user", body, `formaction="/runs/c-http/approve"`, `action="/runs/c-http/cancel"`)
	})

	t.Run("deny needs a reason", func(t *testing.T) {
		code, body := post(t, rw.URL+"/runs/c-http/deny", erin, url.Values{"call": {"b"}})
		if code != http.StatusBadRequest {
			t.Fatalf("status %d, want 400: %s", code, body)
		}
	})
	t.Run("unknown call", func(t *testing.T) {
		code, body := post(t, rw.URL+"/runs/c-http/approve", erin, url.Values{"call": {"nope"}})
		if code != http.StatusConflict || !strings.Contains(body, "does not wait for approval") {
			t.Fatalf("status %d, want 409: %s", code, body)
		}
	})
	t.Run("deny as erin", func(t *testing.T) {
		// A "who" field cannot name someone else: the actor is the signed-in user.
		code, body := post(t, rw.URL+"/runs/c-http/deny", erin, url.Values{"call": {"b"}, "reason": {"change freeze"}, "who": {"mallory"}})
		if code != http.StatusSeeOther {
			t.Fatalf("status %d, want 303: %s", code, body)
		}
		p.WaitStatus("c-http", toolbus.RunCompleted)
		evs, err := runlog.Events(p.ctx, p.bus, "c-http")
		if err != nil {
			t.Fatal(err)
		}
		r := audit.Analyze("c-http", evs)
		if len(r.Calls) == 0 || r.Calls[0].Decision != "denied" || r.Calls[0].DecidedBy != "erin" || !r.OK {
			t.Fatalf("report after the console's deny: %+v", r.Calls)
		}
		_, body = get(t, rw.URL+"/runs/c-http", users["frank"])
		wantContains(t, "run page after the decision", body, `denied by <b class="decided-by">erin</b>: <q class="decided-why">change freeze</q>`)
	})
	t.Run("sign-out ends the session on the server", func(t *testing.T) {
		code, _, resp := request(t, http.MethodPost, rw.URL+"/login", "", url.Values{"token": {erin}}, nil)
		var session *http.Cookie
		for _, c := range resp.Cookies() {
			if c.Name == consoleCookie {
				session = c
			}
		}
		if code != http.StatusSeeOther || session == nil {
			t.Fatalf("sign-in: %d, cookie %v", code, session)
		}
		withCookie := func(r *http.Request) { r.AddCookie(session) }
		if code, _, _ := request(t, http.MethodGet, rw.URL+"/", "", nil, withCookie); code != http.StatusOK {
			t.Fatalf("GET / with erin's session: %d", code)
		}
		if code, _, _ := request(t, http.MethodPost, rw.URL+"/logout", "", url.Values{}, withCookie); code != http.StatusSeeOther {
			t.Fatalf("sign-out: %d, want 303", code)
		}
		// The browser dropped the cookie; whoever kept a copy replays it.
		if code, _, _ := request(t, http.MethodGet, rw.URL+"/", "", nil, withCookie); code != http.StatusUnauthorized {
			t.Fatalf("GET / with the signed-out cookie replayed: %d, want 401", code)
		}
		if code, _, _ := request(t, http.MethodPost, rw.URL+"/runs/c-none/cancel", "", url.Values{}, withCookie); code != http.StatusUnauthorized {
			t.Fatalf("POST with the signed-out cookie replayed: %d, want 401", code)
		}
		if code, _ := get(t, rw.URL+"/", erin); code != http.StatusOK {
			t.Fatalf("erin's token after her browser signed out: %d (sign-out ends the session, not the token)", code)
		}
	})
	t.Run("browser session", func(t *testing.T) {
		code, body, resp := request(t, http.MethodPost, rw.URL+"/login", "", url.Values{"token": {"tbk_wrong"}}, nil)
		if code != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
			t.Fatalf("sign-in with a wrong token: %d, cookies %v: %s", code, resp.Cookies(), body)
		}
		code, _, resp = request(t, http.MethodPost, rw.URL+"/login", "", url.Values{"token": {users["frank"]}, "next": {"//evil.example/"}}, nil)
		if code != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
			t.Fatalf("sign-in: %d to %q, want 303 to / (never another host)", code, resp.Header.Get("Location"))
		}
		var session *http.Cookie
		for _, c := range resp.Cookies() {
			if c.Name == consoleCookie {
				session = c
			}
		}
		if session == nil || !session.HttpOnly || session.SameSite != http.SameSiteStrictMode {
			t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict", session)
		}
		withCookie := func(c *http.Cookie) func(*http.Request) { return func(r *http.Request) { r.AddCookie(c) } }
		if code, body, _ := request(t, http.MethodGet, rw.URL+"/", "", nil, withCookie(session)); code != http.StatusOK || !strings.Contains(body, `<b id="user">frank</b>`) {
			t.Fatalf("GET / with frank's session: %d\n%s", code, body)
		}
		forged := *session
		forged.Value = strings.Replace(session.Value, base64.RawURLEncoding.EncodeToString([]byte("frank")), base64.RawURLEncoding.EncodeToString([]byte("erin")), 1)
		if code, _, _ := request(t, http.MethodGet, rw.URL+"/", "", nil, withCookie(&forged)); code != http.StatusUnauthorized {
			t.Fatalf("a session edited to name erin: %d, want 401", code)
		}
		// Revoke frank: delete his line. His session ends without a restart.
		if err := os.WriteFile(usersPath, []byte(door.Entry("erin", erin, nil)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		eventstest.Eventually(t, 30*time.Second, func() error {
			if code, _, _ := request(t, http.MethodGet, rw.URL+"/", "", nil, withCookie(session)); code != http.StatusUnauthorized {
				return fmt.Errorf("frank's session still reads: %d", code)
			}
			if code, _ := get(t, rw.URL+"/", users["frank"]); code != http.StatusUnauthorized {
				return fmt.Errorf("frank's token still reads: %d", code)
			}
			return nil
		})
		if code, _ := get(t, rw.URL+"/", erin); code != http.StatusOK {
			t.Fatalf("erin after frank's revocation: %d", code)
		}
	})
	t.Run("status filter", func(t *testing.T) {
		code, body := get(t, rw.URL+"/?status=bogus", erin)
		if code != http.StatusBadRequest || !strings.Contains(body, "waiting_for_approval") {
			t.Fatalf("status %d, want 400 listing the statuses: %s", code, body)
		}
		code, body = get(t, rw.URL+"/?status=completed", erin)
		if code != http.StatusOK || !strings.Contains(body, `id="run-c-hostile"`) {
			t.Fatalf("completed runs: %d\n%s", code, body)
		}
		_, body = get(t, rw.URL+"/?status=running", erin)
		if strings.Contains(body, `id="run-c-hostile"`) {
			t.Fatalf("running filter lists a completed run:\n%s", body)
		}
	})
	t.Run("escaped", func(t *testing.T) {
		code, body := get(t, rw.URL+"/runs/c-hostile", erin)
		if code != http.StatusOK {
			t.Fatalf("status %d", code)
		}
		for _, bad := range []string{"<script>alert", "<img src=x", "<b>bold</b>"} {
			if strings.Contains(body, bad) {
				t.Fatalf("run page carries %q unescaped:\n%s", bad, body)
			}
		}
		wantContains(t, "run page", body, "&lt;script&gt;alert", "&lt;img src=x onerror=alert(1)&gt;")
	})
	t.Run("full output from the object store", func(t *testing.T) {
		p.submit("c-big", toolbus.Limits{})
		p.WaitStatus("c-big", toolbus.RunCompleted)
		_, body := get(t, rw.URL+"/runs/c-big", erin)
		wantContains(t, "run page of a truncated output", body, "truncated:", "whole output in kv://",
			`<pre class="text full-output">{&#34;data&#34;:&#34;`+strings.Repeat("x", 299000))
	})
	t.Run("unknown run", func(t *testing.T) {
		if code, _ := get(t, rw.URL+"/runs/no-such-run", erin); code != http.StatusNotFound {
			t.Fatalf("status %d, want 404", code)
		}
	})
}

// chromiumPath finds Debian's chromium (or another Chrome). Without one the browser
// tests skip, except in CI, where they fail.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testutil.NeedOutside(t, "Chromium", "apt-get install chromium", nil)
	return ""
}

// browser starts headless chromium and returns its tab's context and a counter of the
// JavaScript dialogs (alert, confirm) that pages opened.
func browser(t *testing.T) (context.Context, *atomic.Int32) {
	t.Helper()
	path := chromiumPath(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1280, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	var dialogs atomic.Int32
	chromedp.ListenTarget(bctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1)
			go func() { _ = chromedp.Run(bctx, page.HandleJavaScriptDialog(false)) }()
		}
	})
	if err := chromedp.Run(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return bctx, &dialogs
}

// text reads an element's text in one evaluation: the live region may be swapped for a
// fresh copy between two protocol calls, so node-based reads could miss it.
func text(sel string, dst *string) chromedp.Action {
	return chromedp.Evaluate(fmt.Sprintf(`(document.querySelector(%q) || {textContent: "<missing>"}).textContent`, sel), dst)
}

// settled waits until the page has followed the stream once (the refresh after the
// event stream opened): the run page's nodes then stay until the next event.
func settled() chromedp.Action {
	return chromedp.WaitReady(`body[data-updated]`, chromedp.ByQuery)
}

// do runs browser actions with a generous deadline.
func do(t *testing.T, bctx context.Context, what string, actions ...chromedp.Action) {
	t.Helper()
	ctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Run(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestConsoleBrowser drives the console in headless chromium against a live pipeline:
// the runs list shows a run while it runs, cancel from the page ends
// it cancelled, a waiting call approved by a click lets the run complete, and a hostile
// tool output and answer stay inert text.
func TestConsoleBrowser(t *testing.T) {
	release := make(chan struct{})
	p := startPipeline(t, consoleScripts(), deployTool(), hostileTool(), crawlTool(release))
	srv, users, _ := startConsoleWithUsers(t, p, "grace")
	bctx, dialogs := browser(t)
	do(t, bctx, "sign in", chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(`#login-token`, chromedp.ByID),
		chromedp.SendKeys(`#login-token`, users["grace"], chromedp.ByID),
		chromedp.Submit(`#login`, chromedp.ByID),
		chromedp.WaitVisible(`#user`, chromedp.ByID))

	t.Run("live list and cancel", func(t *testing.T) {
		// The list is open and following the stream before the run exists.
		do(t, bctx, "open the runs list", chromedp.Navigate(srv.URL+"/"),
			chromedp.WaitReady(`body[data-live="on"]`, chromedp.ByQuery))
		p.SubmitAs("c-live", "tester", "sleep a long time", toolbus.Limits{})
		do(t, bctx, "the run appears in the list while it runs",
			chromedp.WaitVisible(`tr[data-run="c-live"][data-status="running"]`, chromedp.ByQuery))
		var q string
		do(t, bctx, "read the question", text(`#run-c-live td.q`, &q))
		if q != "sleep a long time" {
			t.Fatalf("question %q", q)
		}
		p.WaitEvent("c-live", events.TypeToolRequested)

		do(t, bctx, "cancel from the run page",
			chromedp.Evaluate(`document.querySelector("#run-c-live a").click()`, nil),
			chromedp.WaitVisible(`#cancel`, chromedp.ByID),
			settled(),
			chromedp.SendKeys(`#cancel-form input.reason`, "wrong question", chromedp.ByQuery),
			chromedp.Click(`#cancel`, chromedp.ByID),
			chromedp.WaitVisible(`#live[data-status="cancelled"]`, chromedp.ByQuery))
		p.WaitStatus("c-live", toolbus.RunCancelled)
	})

	t.Run("approve by clicking", func(t *testing.T) {
		p.submit("c-approve", toolbus.Limits{})
		p.WaitStatus("c-approve", toolbus.RunWaitingForApproval)
		do(t, bctx, "approve from the run page",
			chromedp.Navigate(srv.URL+"/runs/c-approve"),
			chromedp.WaitVisible(`#decide-b button.approve`, chromedp.ByQuery),
			settled(),
			chromedp.SendKeys(`#decide-b input.reason`, "CHG-7", chromedp.ByQuery),
			chromedp.Click(`#decide-b button.approve`, chromedp.ByQuery),
			chromedp.WaitVisible(`#live[data-status="completed"]`, chromedp.ByQuery))
		p.WaitStatus("c-approve", toolbus.RunCompleted)
		evs, err := runlog.Events(p.ctx, p.bus, "c-approve")
		if err != nil {
			t.Fatal(err)
		}
		r := audit.Analyze("c-approve", evs)
		if len(r.Calls) != 2 || r.Calls[1].Decision != "granted" || r.Calls[1].DecidedBy != "grace" || r.Answer != "deployed api" {
			t.Fatalf("report after the click: %+v", r)
		}
		var answer string
		do(t, bctx, "read the answer", chromedp.WaitVisible(`.row.call[data-call="b"][data-status="succeeded"]`, chromedp.ByQuery),
			text(`#run-answer`, &answer))
		if answer != "deployed api" {
			t.Fatalf("answer %q", answer)
		}
	})

	t.Run("live progress", func(t *testing.T) {
		const run = "c-progress"
		do(t, bctx, "open the run page before it starts", chromedp.Navigate(srv.URL+"/runs/c-live"),
			chromedp.WaitReady(`body[data-live="on"]`, chromedp.ByQuery))
		if err := p.bus.StartRun(p.ctx, "/test", callrun.Build(callrun.Spec{RunID: run, Principal: toolbus.Principal{ID: "tester"},
			Tool: toolbus.ToolContract{Name: "crawl", Timeout: 2 * time.Minute}, Arguments: "{}", Via: "test"}, time.Now())); err != nil {
			t.Fatal(err)
		}
		var shown string
		do(t, bctx, "the running call shows its progress, live",
			chromedp.Navigate(srv.URL+"/runs/"+run),
			chromedp.WaitReady(`body[data-live="on"]`, chromedp.ByQuery),
			chromedp.WaitVisible(`.row.call[data-call="call_0"] .progress`, chromedp.ByQuery),
			text(`.row.call[data-call="call_0"] .progress`, &shown))
		if !strings.HasPrefix(shown, "progress ") || !strings.Contains(shown, ": page ") {
			t.Fatalf("progress shown as %q", shown)
		}
		close(release)
		do(t, bctx, "the call finishes", chromedp.WaitVisible(`.row.call[data-call="call_0"][data-status="succeeded"]`, chromedp.ByQuery))
	})

	t.Run("failed calls in the list", func(t *testing.T) {
		// The run completes (the model answered) though one of its calls was rejected:
		// the list says so beside the status.
		p.submit("c-rejected", toolbus.Limits{})
		p.WaitStatus("c-rejected", toolbus.RunCompleted)
		var calls, class string
		do(t, bctx, "read the run's calls in the list", chromedp.Navigate(srv.URL+"/"),
			chromedp.WaitVisible(`tr[data-run="c-rejected"][data-status="completed"]`, chromedp.ByQuery),
			text(`#run-c-rejected td.calls`, &calls),
			chromedp.AttributeValue(`#run-c-rejected td.calls`, "class", &class, nil, chromedp.ByQuery))
		if calls != "2 calls: 1 rejected" || !strings.Contains(class, "calls-bad") {
			t.Fatalf("the list shows the calls of c-rejected as %q (class %q), want 2 calls: 1 rejected, marked", calls, class)
		}
	})

	t.Run("hostile output is text", func(t *testing.T) {
		p.submit("c-hostile", toolbus.Limits{})
		p.WaitStatus("c-hostile", toolbus.RunCompleted)
		var answer, content string
		var tags int
		do(t, bctx, "open the hostile run",
			chromedp.Navigate(srv.URL+"/runs/c-hostile"),
			chromedp.WaitVisible(`#live[data-status="completed"]`, chromedp.ByQuery),
			chromedp.Poll(`document.readyState === "complete"`, nil),
			settled(),
			text(`#run-answer`, &answer),
			text(`#call-0-h pre.content`, &content),
			chromedp.Evaluate(`document.querySelectorAll("#live img, #live script").length +
				[...document.querySelectorAll("#live b")].filter(e => e.textContent === "bold").length`, &tags))
		if answer != "the page says "+hostileText {
			t.Fatalf("answer shown as %q, want the text literally", answer)
		}
		if !strings.Contains(content, `<script>`) || !strings.Contains(content, `onerror=alert(1)`) {
			t.Fatalf("content shown as %q, want the markup as text", content)
		}
		if tags != 0 {
			t.Fatalf("%d element(s) made from a tool's or model's text", tags)
		}
		if n := dialogs.Load(); n != 0 {
			t.Fatalf("%d JavaScript dialog(s) opened", n)
		}
	})
	if n := dialogs.Load(); n != 0 {
		t.Fatal(fmt.Sprintf("%d JavaScript dialog(s) opened", n))
	}
}

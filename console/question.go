package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// Questions to the caller on the run page: a call that asked (executor.Ask) and waits
// shows the question's message and a form made from its schema (one input per property,
// an enum as a select, the required ones marked); the signed-in user answers or declines
// it (POST /runs/{run}/answer). The answer is checked by decide.Answer, as `toolbus
// answer` checks it, before anything is published, and published as the signed-in
// user's: the worker takes only the run's principal's answer, which the page says when
// the user is someone else.

// answerField is the form field name prefix of a question's property.
const answerField = "a."

// questionField is one input of a question's form.
type questionField struct {
	Name, Title, Description string
	// Type is the property's JSON type (string, number, integer, boolean); Kind the
	// input: its type, or select for an enum.
	Type, Kind string
	Options    []questionOption
	Required   bool
	Default    string
}

// questionOption is one choice of a select.
type questionOption struct{ Value, Label string }

// questionView is a question waiting for an answer, with its form.
type questionView struct {
	toolbus.ToolQuestion
	Fields []questionField
	// Raw: the schema is not a form of primitive properties; the page asks for the
	// answer as one JSON object.
	Raw bool
}

// openQuestions are the questions of run's events that wait for an answer, as
// `toolbus answer` finds them (decide.Questions): per call, its last question with no
// answer by the run's principal and no result (none once the run ended), in the order
// they were asked.
func openQuestions(evs []runlog.StoredEvent) []questionView {
	var out []questionView
	for _, q := range decide.QuestionsOf(evs).Open() {
		qv := questionView{ToolQuestion: q}
		qv.Fields, qv.Raw = formOf(q.Schema)
		out = append(out, qv)
	}
	return out
}

// schemaProperty is what the form reads of one property of a question's schema (MCP
// elicitation's primitive schemas).
type schemaProperty struct {
	Type        string   `json:"type"`
	Title       string   `json:"title"`
	Description string   `json:"description"`
	Enum        []any    `json:"enum"`
	EnumNames   []string `json:"enumNames"`
	OneOf       []struct {
		Const any    `json:"const"`
		Title string `json:"title"`
	} `json:"oneOf"`
	Default any `json:"default"`
}

// formOf returns the inputs of a question's schema, in the schema's order, or raw when
// the schema is not an object of primitive properties.
func formOf(schema json.RawMessage) (fields []questionField, raw bool) {
	var s struct {
		Properties json.RawMessage `json:"properties"`
		Required   []string        `json:"required"`
	}
	if err := json.Unmarshal(schema, &s); err != nil || len(s.Properties) == 0 {
		return nil, true
	}
	names, props, err := orderedProperties(s.Properties)
	if err != nil || len(names) == 0 {
		return nil, true
	}
	required := map[string]bool{}
	for _, n := range s.Required {
		required[n] = true
	}
	for _, name := range names {
		var p schemaProperty
		if err := json.Unmarshal(props[name], &p); err != nil {
			return nil, true
		}
		f := questionField{Name: name, Title: p.Title, Description: p.Description, Type: p.Type, Kind: p.Type, Required: required[name]}
		if p.Default != nil {
			f.Default = scalarText(p.Default)
		}
		for i, e := range p.Enum {
			o := questionOption{Value: scalarText(e), Label: scalarText(e)}
			if i < len(p.EnumNames) {
				o.Label = p.EnumNames[i]
			}
			f.Options = append(f.Options, o)
		}
		for _, o := range p.OneOf {
			f.Options = append(f.Options, questionOption{Value: scalarText(o.Const), Label: orText(o.Title, scalarText(o.Const))})
		}
		switch {
		case len(f.Options) > 0 && (p.Type == "string" || p.Type == "number" || p.Type == "integer"):
			f.Kind = "select"
		case p.Type == "string" || p.Type == "number" || p.Type == "integer" || p.Type == "boolean":
		default:
			return nil, true // arrays, objects, untyped: answered as JSON
		}
		fields = append(fields, f)
	}
	return fields, false
}

// orderedProperties reads a properties object keeping its keys' order.
func orderedProperties(raw json.RawMessage) ([]string, map[string]json.RawMessage, error) {
	props := map[string]json.RawMessage{}
	if err := json.Unmarshal(raw, &props); err != nil {
		return nil, nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // {
		return nil, nil, err
	}
	var names []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		names = append(names, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, nil, err
		}
	}
	return names, props, nil
}

func scalarText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func orText(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// errBadAnswer is wrapped by an answer form the console cannot read (400).
var errBadAnswer = errors.New("answer")

// answerContent builds the answer's JSON object from the form: each field by its type
// (an empty optional field is left out, an unchecked box is false); a raw question's
// answer is the "content" field as typed.
func answerContent(q questionView, form url.Values) (string, error) {
	if q.Raw {
		c := strings.TrimSpace(form.Get("content"))
		if c == "" {
			return "", fmt.Errorf("%w: give the answer as one JSON object", errBadAnswer)
		}
		return c, nil
	}
	out := map[string]any{}
	for _, f := range q.Fields {
		v := strings.TrimSpace(form.Get(answerField + f.Name))
		typ := f.Type
		if typ == "boolean" {
			out[f.Name] = v == "true"
			continue
		}
		if v == "" {
			continue
		}
		switch typ {
		case "number", "integer":
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return "", fmt.Errorf("%w: %s: %q is not a number", errBadAnswer, f.Name, v)
			}
			out[f.Name] = n
		default:
			out[f.Name] = v
		}
	}
	b, err := json.Marshal(out)
	return string(b), err
}

// answer serves a person's answer to (or decline of) a call's open question.
func (c *server) answer(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	run, who, ok := actorOnRun(w, r)
	if !ok {
		return
	}
	if !c.mustSee(w, r, run) {
		return
	}
	q, err := decide.OpenQuestion(ctx, c.bus, run, r.PostFormValue("call"))
	if err != nil {
		c.actionError(w, err)
		return
	}
	if !c.mayDecide(w, r, run, q.Tool) {
		return
	}
	decline := r.PostFormValue("decline") != ""
	content := ""
	if !decline {
		qv := questionView{ToolQuestion: q}
		qv.Fields, qv.Raw = formOf(q.Schema)
		if content, err = answerContent(qv, r.PostForm); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	a, err := decide.Answer(q, who, content, decline)
	if err != nil {
		var refused *decide.RefusedError
		if errors.As(err, &refused) {
			http.Error(w, "answer: "+refused.Msg, http.StatusBadRequest)
			return
		}
		c.fail(w, err)
		return
	}
	if _, err := c.bus.PublishEvent(ctx, events.ToolAnswerEvent(c.source, a)); err != nil {
		c.fail(w, err)
		return
	}
	c.log.Info("console answer", "run_id", run, "call_id", q.CallID, "action", a.Action, "who", a.Who)
	http.Redirect(w, r, "/runs/"+run, http.StatusSeeOther)
}

// askers are the calls that asked the questions (who may answer is who may decide them).
func askers(qs []questionView) []toolbus.ToolCall {
	out := make([]toolbus.ToolCall, len(qs))
	for i, q := range qs {
		out[i] = toolbus.ToolCall{CallID: q.CallID, Tool: q.Tool}
	}
	return out
}

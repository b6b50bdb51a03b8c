package planner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/toolbus/toolbus"
)

// A script file is a model written by hand, so a team tests its tools end to end with
// no API key and no recording (TOOLBUS_MODEL=script:<path>). It is a JSON document:
//
//	{
//	  "name": "greeter",                     // optional: the model name runs record
//	  "steps": [
//	    {"say": "Let me greet Ada.",
//	     "calls": [{"id": "g", "tool": "greet", "arguments": {"name": "Ada"}}]},
//	    {"say": "Done: {{result:g}}"}
//	  ]
//	}
//
// Step i of every run is answered by steps[i]: its calls (each a tool and its JSON
// object arguments; the id defaults to call_<step>_<index>) and its text. A step with
// no calls is the answer, which ends the run. In "say", {{result:<id>}} is replaced by
// the content of the result of call <id> (the latest one in the run's history), and
// {{results}} by the results of the previous step, one "tool: content" per line. A run
// that asks for a step past the last fails (model_error) naming the file.

// ScriptFile is the content of a script file.
type ScriptFile struct {
	// Name is the model name recorded in model.responded (default script:<file name>).
	Name  string       `json:"name,omitempty"`
	Steps []ScriptStep `json:"steps"`
}

// ScriptStep is the answer to one step.
type ScriptStep struct {
	// Say is the assistant's text: with calls, what it says before them; without, the
	// answer. It may hold {{result:<id>}} and {{results}}.
	Say   string       `json:"say,omitempty"`
	Calls []ScriptCall `json:"calls,omitempty"`
}

// ScriptCall is one tool call of a step.
type ScriptCall struct {
	// ID is the call id (default call_<step>_<index>).
	ID   string `json:"id,omitempty"`
	Tool string `json:"tool"`
	// Arguments is a JSON object (default {}).
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// ErrScript is wrapped by the errors of a script file that cannot be loaded.
var ErrScript = errors.New("planner: script file")

// LoadScriptFile reads and checks the script file at path.
func LoadScriptFile(path string) (*ScriptModel, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrScript, err)
	}
	sm, err := ParseScriptFile(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	sm.path = path
	if sm.file.Name == "" {
		sm.file.Name = "script:" + strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	}
	return sm, nil
}

// MaxInlineScript bounds the script a run carries in its model name (InlineScript).
const MaxInlineScript = 64 << 10

// InlineScript returns the model name that carries the script file at path itself:
// script:<the file as compact JSON, named>. A run that names it is served by any planner,
// on any host, with no file there: `toolbus run --model script:<file>` ships the client's
// file so. The file is checked here (LoadScriptFile) and may be at most MaxInlineScript
// bytes as JSON.
func InlineScript(path string) (string, error) {
	sm, err := LoadScriptFile(path)
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(sm.file)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrScript, err)
	}
	if len(b) > MaxInlineScript {
		return "", fmt.Errorf("%w: %s is %d bytes as JSON, over the %d a run may carry: put it on the planner's host (TOOLBUS_MODEL=script:<file>)",
			ErrScript, path, len(b), MaxInlineScript)
	}
	return "script:" + string(b), nil
}

// IsInlineScript reports whether a model name carries its script (InlineScript).
func IsInlineScript(name string) bool { return strings.HasPrefix(name, "script:{") }

// ParseInlineScript is the model of a name that carries its script (InlineScript).
func ParseInlineScript(name string) (*ScriptModel, error) {
	text := strings.TrimPrefix(name, "script:")
	if len(text) > MaxInlineScript {
		return nil, fmt.Errorf("%w: the run's script is %d bytes, over %d", ErrScript, len(text), MaxInlineScript)
	}
	sm, err := ParseScriptFile(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("%w (shipped with the run)", err)
	}
	if sm.file.Name == "" {
		sm.file.Name = "script"
	}
	return sm, nil
}

// ParseScriptFile reads a script file from r. Unknown fields are errors (a misspelt
// "calls" would otherwise answer at once).
func ParseScriptFile(r io.Reader) (*ScriptModel, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var f ScriptFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrScript, err)
	}
	if len(f.Steps) == 0 {
		return nil, fmt.Errorf("%w: no steps", ErrScript)
	}
	for i := range f.Steps {
		ids := map[string]bool{}
		for j := range f.Steps[i].Calls {
			c := &f.Steps[i].Calls[j]
			if !toolbus.ValidToolName(c.Tool) {
				return nil, fmt.Errorf("%w: step %d, call %d: invalid tool name %q", ErrScript, i, j, c.Tool)
			}
			if args := bytes.TrimSpace(c.Arguments); len(args) == 0 || string(args) == "null" {
				c.Arguments = json.RawMessage(`{}`)
			} else if args[0] != '{' || !json.Valid(args) {
				return nil, fmt.Errorf("%w: step %d, call %d (%s): arguments must be a JSON object", ErrScript, i, j, c.Tool)
			}
			if c.ID == "" {
				c.ID = fmt.Sprintf("call_%d_%d", i, j)
			}
			if ids[c.ID] {
				return nil, fmt.Errorf("%w: step %d: call id %q twice", ErrScript, i, c.ID)
			}
			ids[c.ID] = true
		}
	}
	return &ScriptModel{file: f}, nil
}

// ScriptModel is the Model of a script file. It is safe for concurrent use (it holds
// no state between requests).
type ScriptModel struct {
	file ScriptFile
	path string
}

var _ Model = (*ScriptModel)(nil)

// Name is the model name the script's answers carry: the file's "name", else
// script:<file name> (LoadScriptFile), else script.
func (s *ScriptModel) Name() string {
	if s.file.Name == "" {
		return "script"
	}
	return s.file.Name
}

var resultRef = regexp.MustCompile(`\{\{\s*result:\s*([^}\s]+)\s*\}\}`)

// Complete answers req with the script's step.
func (s *ScriptModel) Complete(ctx context.Context, req Request) (Response, error) {
	if err := ctx.Err(); err != nil {
		return Response{}, err
	}
	if req.Step >= len(s.file.Steps) {
		where := s.path
		if where == "" {
			where = s.Name()
		}
		return Response{}, Permanent(fmt.Errorf("script %s has %d step(s): no answer for step %d (end the script with a step without calls)", where, len(s.file.Steps), req.Step))
	}
	st := s.file.Steps[req.Step]
	msg := toolbus.Message{Role: toolbus.RoleAssistant, Content: expandScript(st.Say, req.Messages)}
	for _, c := range st.Calls {
		msg.ToolCalls = append(msg.ToolCalls, toolbus.ToolCall{CallID: c.ID, Tool: c.Tool, Arguments: string(c.Arguments)})
	}
	return Response{Message: msg, Model: s.Name()}, nil
}

// expandScript replaces {{result:<id>}} and {{results}} in text with the results in msgs.
func expandScript(text string, msgs []toolbus.Message) string {
	if !strings.Contains(text, "{{") {
		return text
	}
	text = resultRef.ReplaceAllStringFunc(text, func(ref string) string {
		id := resultRef.FindStringSubmatch(ref)[1]
		for i := len(msgs) - 1; i >= 0; i-- {
			if msgs[i].Role == toolbus.RoleTool && msgs[i].ToolCallID == id {
				return msgs[i].Content
			}
		}
		return "(no result for " + id + ")"
	})
	if strings.Contains(text, "{{results}}") {
		var last []string
		for i := len(msgs) - 1; i >= 0 && msgs[i].Role == toolbus.RoleTool; i-- {
			last = append([]string{msgs[i].Name + ": " + msgs[i].Content}, last...)
		}
		text = strings.ReplaceAll(text, "{{results}}", strings.Join(last, "\n"))
	}
	return text
}

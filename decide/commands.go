package decide

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/toolbus/toolbus"
)

// ApproveCommand is the command line that decides call callID of run, which waits for
// approval: what `toolbus call`, `toolbus run` and a waiting run's hint print, so that the
// reader can move the run on.
func ApproveCommand(run, callID string) string {
	return fmt.Sprintf("toolbus approve %s %s (or toolbus deny %s %s --reason ...)", run, callID, run, callID)
}

// AnswerCommand is the command line that answers question q (or declines it): the
// answer is a JSON object of the schema's properties whose values are placeholders
// (<string>, <a|b> for an enum...) the reader replaces with JSON values: not JSON as
// written, `toolbus answer` refuses it, so nobody answers by pasting it.
func AnswerCommand(q toolbus.ToolQuestion) string {
	return fmt.Sprintf("toolbus answer %s %s '%s' (or --decline)", q.RunID, q.CallID, answerTemplate(q.Schema))
}

// answerTemplate is the answer to fill in of a question's schema: its required
// properties (all of them when none is required), sorted, each with a placeholder.
func answerTemplate(schema json.RawMessage) string {
	var s struct {
		Properties map[string]struct {
			Type string `json:"type"`
			Enum []any  `json:"enum"`
		} `json:"properties"`
		Required []string `json:"required"`
	}
	if json.Unmarshal(schema, &s) != nil || len(s.Properties) == 0 {
		return "{...}"
	}
	names := s.Required
	if len(names) == 0 {
		for name := range s.Properties {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	fields := make([]string, 0, len(names))
	for _, name := range names {
		p := s.Properties[name]
		hint := "<" + p.Type + ">"
		if len(p.Enum) > 0 {
			opts := make([]string, len(p.Enum))
			for i, e := range p.Enum {
				b, _ := json.Marshal(e)
				opts[i] = string(b)
			}
			hint = "<" + strings.Join(opts, "|") + ">"
		}
		if hint == "<>" {
			hint = "<value>"
		}
		fields = append(fields, fmt.Sprintf("%q:%s", name, hint))
	}
	return "{" + strings.Join(fields, ",") + "}"
}

package executor

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
)

type sIn struct {
	Query string    `json:"query" jsonschema:"description=What to search"`
	Limit int       `json:"limit,omitempty" jsonschema:"minimum=1,maximum=100"`
	When  time.Time `json:"when,omitzero"`
	Tags  []string  `json:"tags,omitempty"`
	Sub   *struct {
		A string `json:"a"`
	} `json:"sub,omitempty"`
}
type sOut struct {
	Items []string `json:"items"`
}

func TestScratch(t *testing.T) {
	r := NewRegistry()
	err := RegisterFunc(r, Tool{Name: "s"}, func(ctx context.Context, in sIn) (sOut, error) { return sOut{Items: []string{in.Query}}, nil })
	fmt.Println(err)
	tl, _ := r.Lookup("s")
	fmt.Println(string(tl.InputSchema))
	fmt.Println(string(tl.OutputSchema))
	e := New(r)
	for _, a := range []string{`{"query":"x","limit":500,"extra":1,"sub":{}}`, `{"query":"x"}`, `{"query":"x",}`, `[1]`, ``, `{"query":"x"`} {
		res := e.Execute(context.Background(), events.ToolCall{CallID: "c", Tool: "s", Arguments: a}, events.Principal{})
		fmt.Printf("%s %s %q %s\n", res.Status, res.Code(), res.Content, func() string { if res.Error != nil { return string(res.Error.Details) }; return string(res.Output) }())
	}
}

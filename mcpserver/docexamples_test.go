package mcpserver_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/mcpserver"
	"github.com/toolbus/toolbus/mcpserver/mcptest"
)

// The exchanges of docs/mcp.md between `<!-- mcp-exchange: name -->` and
// `<!-- /mcp-exchange -->`: JSON blocks alternating request and response.
var (
	exchangeRE = regexp.MustCompile("(?s)<!-- mcp-exchange: ([a-z-]+) -->(.*?)<!-- /mcp-exchange -->")
	jsonRE     = regexp.MustCompile("(?s)```json\n(.*?)```")
	runIDRE    = regexp.MustCompile(`mcp-[0-9a-f]{12}`)
	timeRE     = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	stateRE    = regexp.MustCompile(`tb1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+`)
)

// docExchanges returns the exchanges of docs/mcp.md by name.
func docExchanges(t *testing.T) map[string][]string {
	t.Helper()
	raw, err := os.ReadFile("../docs/mcp.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, m := range exchangeRE.FindAllStringSubmatch(string(raw), -1) {
		for _, b := range jsonRE.FindAllStringSubmatch(m[2], -1) {
			out[m[1]] = append(out[m[1]], b[1])
		}
	}
	return out
}

// normal is the JSON s with what changes from run to run (run ids, and the
// idempotency keys made of them; times; sealed requestStates) replaced by fixed text.
func normal(t *testing.T, s string) any {
	t.Helper()
	s = runIDRE.ReplaceAllString(s, "mcp-RUN")
	s = timeRE.ReplaceAllString(s, "TIME")
	s = stateRE.ReplaceAllString(s, "STATE")
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%v in %s", err, s)
	}
	return v
}

// rawPost posts one documented 2026-07-28 request (its headers derived from it) with
// carol's token and returns the JSON-RPC response.
func rawPost(t *testing.T, d *testDoor, body string) string {
	t.Helper()
	var req struct {
		Method string `json:"method"`
		Params struct {
			Name   string `json:"name"`
			TaskID string `json:"taskId"`
		} `json:"params"`
	}
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatalf("documented request: %v in %s", err, body)
	}
	resp := mcptest.Post(t, d.url, d.carol, "", body, func(r *http.Request) {
		r.Header.Set("Mcp-Protocol-Version", mcpserver.Protocol2026)
		r.Header.Set("Mcp-Method", req.Method)
		if name := req.Params.Name + req.Params.TaskID; name != "" {
			r.Header.Set("Mcp-Name", name)
		}
	})
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && strings.Contains(data, `"id":`) {
			return data
		}
	}
	return string(raw)
}

// TestMCPDocExchanges: the 2026-07-28 exchanges docs/mcp.md shows (an approval through
// input_required, a long call as a task) are what the server answers: each documented
// request is sent, and the answer must equal the documented one but for run ids and
// times (a tasks/get is sent again until its answer matches: the task moves on).
// TOOLBUS_PRINT_EXCHANGES=1 prints the answers.
func TestMCPDocExchanges(t *testing.T) {
	p := startPipeline(t)
	d := startDoor(t, p, mcpserver.Config{Version: "v1.0.0", TaskAfter: 300 * time.Millisecond})
	exchanges := docExchanges(t)
	for _, name := range []string{"approval", "task"} {
		blocks := exchanges[name]
		if len(blocks) < 2 || len(blocks)%2 != 0 {
			t.Fatalf("docs/mcp.md: exchange %q has %d JSON blocks, want request/response pairs", name, len(blocks))
		}
		run, state := "", ""
		for i := 0; i < len(blocks); i += 2 {
			req, want := blocks[i], normal(t, blocks[i+1])
			if run != "" {
				req = runIDRE.ReplaceAllString(req, run)
			}
			if state != "" {
				req = stateRE.ReplaceAllString(req, state)
			}
			var got string
			check := func() error {
				got = rawPost(t, d, req)
				if !reflect.DeepEqual(normal(t, got), want) {
					return fmt.Errorf("docs/mcp.md %s exchange %d: got %s\nwant %s", name, i/2+1, got, blocks[i+1])
				}
				return nil
			}
			switch {
			case os.Getenv("TOOLBUS_PRINT_EXCHANGES") != "":
				time.Sleep(3 * time.Second) // a task has ended
				got = rawPost(t, d, req)
				fmt.Printf("%s %d:\n%s\n", name, i/2+1, got)
			case strings.Contains(req, `"tasks/get"`):
				eventstest.Eventually(t, 30*time.Second, check) // the task moves on
			default:
				if err := check(); err != nil {
					t.Fatal(err)
				}
			}
			if id := runIDRE.FindString(got); id != "" {
				run = id
			}
			if st := stateRE.FindString(got); st != "" {
				state = st
			}
		}
	}
}

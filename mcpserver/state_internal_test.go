package mcpserver

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestSealerRefuses: a sealed requestState opens for its token and request until it
// expires (the control); tampered with, expired, presented by another token, for another
// request or under another key, it is refused with ErrState and the reason.
func TestSealerRefuses(t *testing.T) {
	now := time.Date(2026, 7, 28, 12, 0, 0, 0, time.UTC)
	s := sealer{key: NewStateKey(), now: func() time.Time { return now }, ttl: time.Minute}
	req := requestHash(&mcp.CallToolParamsRaw{Name: "which", Arguments: json.RawMessage(`{"a": 1}`)})
	if req != requestHash(&mcp.CallToolParamsRaw{Name: "which", Arguments: json.RawMessage(`{"a":1}`)}) {
		t.Fatal("the request hash depends on the arguments' whitespace")
	}
	claims := stateClaims{Run: "mcp-1", Owner: "owner-carol", Req: req, Attempt: 1, Seq: 2, Key: "step1"}
	state := s.seal(claims)
	got, err := s.open(state, "owner-carol", req)
	if err != nil || got.Run != "mcp-1" || got.Seq != 2 || got.Key != "step1" {
		t.Fatalf("control: %+v, %v", got, err)
	}
	tampered := []byte(state)
	tampered[len(stateVersion)+3] ^= 1
	payload, _, _ := strings.Cut(strings.TrimPrefix(state, stateVersion), ".")
	forged := stateVersion + payload + ".AAAA"
	later := s
	later.now = func() time.Time { return now.Add(time.Minute + time.Second) }
	other := s
	other.key = NewStateKey()
	for _, c := range []struct {
		name, why string
		s         sealer
		state     string
		owner     string
		req       string
	}{
		{"tampered", "integrity", s, string(tampered), "owner-carol", req},
		{"forged mac", "integrity", s, forged, "owner-carol", req},
		{"not a state", "not a toolbus", s, "toolbus-run:mcp-1", "owner-carol", req},
		{"expired", "expired", later, state, "owner-carol", req},
		{"another token", "another token", s, state, "owner-carol2", req},
		{"no token (stdio)", "another token", s, state, "", req},
		{"another request", "another request", s, state, "owner-carol", "0000"},
		{"another key", "integrity", other, state, "owner-carol", req},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.s.open(c.state, c.owner, c.req)
			if !errors.Is(err, ErrState) || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("open: %v, want ErrState saying %q", err, c.why)
			}
		})
	}
	// Just before it expires, it still opens.
	almost := s
	almost.now = func() time.Time { return now.Add(time.Minute) }
	if _, err := almost.open(state, "owner-carol", req); err != nil {
		t.Fatalf("just before the expiry: %v", err)
	}
}

package mcpserver

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The requestState of an input_required result (2026-07-28 round trips) is what the door
// needs to resume the call, sealed under the deployment's state key (Config.StateKey, the
// same in every replica, so any replica resumes what another asked): the run, the
// question or the approval it asks, the caller's token (its owner hash), the original
// request (the tool and its arguments) and an expiry. The door refuses a state that is
// tampered with, expired, presented by another token or with another request, and one
// already used: the question it answers is answered once (the answer's event id is
// deterministic, so a replay is a duplicate the stream refuses; a decided approval no
// longer waits), which the bus, not a replica's memory, says.

// StateKeySize is the size of a state key in bytes.
const StateKeySize = 32

// stateVersion opens every sealed state.
const stateVersion = "tb1."

// DefaultStateTTL is how long a requestState may be used when Config.StateTTL is 0.
const DefaultStateTTL = 10 * time.Minute

// ErrState is every refusal of a requestState; the JSON-RPC error the host gets is
// invalid params with the reason.
var ErrState = errors.New("invalid requestState")

// stateClaims is what a sealed requestState carries.
type stateClaims struct {
	Run   string `json:"run"`
	Owner string `json:"own"` // the caller's token (ownerOf), "" over stdio
	Req   string `json:"req"` // requestHash of the original request
	// Attempt and Seq name the question asked; both 0: the approval form.
	Attempt int    `json:"a,omitempty"`
	Seq     int    `json:"s,omitempty"`
	Key     string `json:"k,omitempty"` // the input request's key
	// N: the questions Seq-N+1 to Seq were asked together (0: Seq alone).
	N   int   `json:"n,omitempty"`
	Exp int64 `json:"exp"` // Unix seconds
}

// ReadStateKey reads the state key of the door's deployment from path (its content,
// without surrounding whitespace: at least StateKeySize bytes, such as the base64 of 32
// random bytes); path "" is no key (New makes a random one).
func ReadStateKey(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("mcp: state key: %w", err)
	}
	key := bytes.TrimSpace(b)
	if len(key) < StateKeySize {
		return nil, fmt.Errorf("mcp: state key %s has %d bytes, want at least %d (head -c 32 /dev/urandom | base64)", path, len(key), StateKeySize)
	}
	return key, nil
}

// NewStateKey returns a random state key (a door without a configured one: its states
// resume only at this process).
func NewStateKey() []byte {
	k := make([]byte, StateKeySize)
	if _, err := rand.Read(k); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return k
}

// sealer seals and opens requestStates under one key.
type sealer struct {
	key []byte
	now func() time.Time
	ttl time.Duration
}

// seal returns the requestState of c, valid for the sealer's TTL.
func (s sealer) seal(c stateClaims) string {
	c.Exp = s.now().Add(s.ttl).Unix()
	payload := base64.RawURLEncoding.EncodeToString(mustMarshal(c))
	return stateVersion + payload + "." + base64.RawURLEncoding.EncodeToString(s.mac(payload))
}

func (s sealer) mac(payload string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte("toolbus mcp requestState\x00" + payload))
	return m.Sum(nil)
}

// open checks state and returns its claims: sealed under this key, not expired, of
// owner and of the request req.
func (s sealer) open(state, owner, req string) (stateClaims, error) {
	var c stateClaims
	rest, ok := strings.CutPrefix(state, stateVersion)
	payload, sig, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return c, fmt.Errorf("%w: not a toolbus requestState", ErrState)
	}
	mac, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(mac, s.mac(payload)) {
		return c, fmt.Errorf("%w: its integrity check failed (tampered with, or sealed by another deployment)", ErrState)
	}
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil || json.Unmarshal(raw, &c) != nil {
		return c, fmt.Errorf("%w: unreadable", ErrState)
	}
	switch {
	case s.now().Unix() > c.Exp:
		return c, fmt.Errorf("%w: expired at %s", ErrState, time.Unix(c.Exp, 0).UTC().Format(time.RFC3339))
	case !hmac.Equal([]byte(c.Owner), []byte(owner)):
		return c, fmt.Errorf("%w: it was given to another token", ErrState)
	case c.Req != req:
		return c, fmt.Errorf("%w: it answers another request (the retry must repeat the tool and its arguments)", ErrState)
	}
	return c, nil
}

// requestHash names a tools/call request: its tool and its arguments (compacted).
func requestHash(p *mcp.CallToolParamsRaw) string {
	var args bytes.Buffer
	if err := json.Compact(&args, p.Arguments); err != nil || args.Len() == 0 || args.String() == "null" {
		args.Reset()
		args.WriteString("{}")
	}
	sum := sha256.Sum256([]byte(p.Name + "\x00" + args.String()))
	return hex.EncodeToString(sum[:16])
}

// stateError is the JSON-RPC error of a refused requestState.
func stateError(err error) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
}

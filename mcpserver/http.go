package mcpserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus/internal/door"
)

// The HTTP door of `toolbus mcp --http`, outermost first: the Host header (DNS
// rebinding), the Origin header (a browser page of another site), the bearer token
// (401 without one that the access list knows, with a WWW-Authenticate challenge), then
// by revision: 2026-07-28 requests to go-sdk's stateless streamable handler, older ones
// to the session caps (sessions.go) and go-sdk's stateful handler with an idle timeout;
// answers to cancelled requests are dropped.

// HTTPConfig configures the streamable HTTP door of the MCP server.
type HTTPConfig struct {
	// Listen is the address served (for the Host check).
	Listen string
	// Access maps bearer tokens to principals.
	Access *door.Source
	// AllowedHosts are host names besides loopback and Listen's host that clients use.
	AllowedHosts []string
	// AllowedOrigins are browser origins allowed besides the server's own.
	AllowedOrigins []string
	// SessionTimeout closes a session idle this long.
	SessionTimeout time.Duration
	// MaxSessions caps the live sessions of all tokens, MaxSessionsPerToken those of
	// each token (0: no cap); see sessionCaps for who gives up a session and who gets
	// 503.
	MaxSessions, MaxSessionsPerToken int
	Logger                           *slog.Logger
}

// HTTPHandler returns the streamable HTTP handler of srv behind the door of cfg: every
// request needs a bearer token of cfg.Access, and the runs of a session act for its
// token's principal. GET /readyz answers "ok" without a token.
func HTTPHandler(srv *mcp.Server, cfg HTTPConfig) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		SessionTimeout: cfg.SessionTimeout, Logger: cfg.Logger,
	})
	var next http.Handler = dropCancelledAnswers(h)
	caps := &sessionCaps{srv: srv, max: cfg.MaxSessions, perToken: cfg.MaxSessionsPerToken, live: map[string]capEntry{}}
	next = caps.handler(next)
	next = modernRequests(srv, cfg, next)
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		id, ok := cfg.Access.Current().Lookup(token)
		if !ok {
			return nil, fmt.Errorf("%w: unknown token", auth.ErrInvalidToken)
		}
		// UserID ties a session to the token that opened it (its hash, not its name):
		// the SDK refuses a session id presented with any other token (403).
		sum := sha256.Sum256([]byte(token))
		return &auth.TokenInfo{UserID: "sha256:" + hex.EncodeToString(sum[:]),
			Extra: map[string]any{"principal": id.Name, "teams": id.Teams}}, nil
	}
	next = challenge(auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(next))
	hosts := door.NewHostPolicy(cfg.Listen, cfg.AllowedHosts)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hosts.OK(r) {
			http.Error(w, fmt.Sprintf("forbidden Host %q: add it to TOOLBUS_MCP_ALLOWED_HOSTS if clients use that name", r.Host), http.StatusForbidden)
			return
		}
		if r.URL.Path == "/readyz" && r.Method == http.MethodGet {
			fmt.Fprintln(w, "ok") // a probe: no token needed, nothing told
			return
		}
		if !door.OriginOK(r, cfg.AllowedOrigins) {
			http.Error(w, fmt.Sprintf("forbidden Origin %q: add it to TOOLBUS_MCP_ALLOWED_ORIGINS to allow a browser client of that site", r.Header.Get("Origin")), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// codeRequestCancelled is the error of a request whose client cancelled it (the code
// LSP gives it). Over HTTP the answer is dropped, as the MCP specification asks ("the
// receiver SHOULD NOT send a response for the cancelled request"); go-sdk v1.8.0 always
// writes one, so the door removes it.
const codeRequestCancelled = -32800

// cancelledAnswers is receiving middleware: a request whose context ended (the client
// sent notifications/cancelled, or went away) returns codeRequestCancelled, whatever
// the handler returned.
func cancelledAnswers(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if ctx.Err() != nil && !strings.HasPrefix(method, "notifications/") {
			return nil, &jsonrpc.Error{Code: codeRequestCancelled, Message: "request cancelled"}
		}
		return res, err
	}
}

// dropCancelledAnswers removes the answers with codeRequestCancelled from what the
// streamable handler writes (one Write per server-sent event, or the JSON body).
func dropCancelledAnswers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&answerFilter{ResponseWriter: w}, r)
	})
}

type answerFilter struct {
	http.ResponseWriter
}

func (f *answerFilter) Write(b []byte) (int, error) {
	if isCancelledAnswer(b) {
		return len(b), nil
	}
	return f.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController flush the stream.
func (f *answerFilter) Unwrap() http.ResponseWriter { return f.ResponseWriter }

// Flush flushes the underlying writer.
func (f *answerFilter) Flush() {
	if fl, ok := f.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}

// isCancelledAnswer reports whether b is an SSE event or a JSON body whose message is an
// error response with codeRequestCancelled.
func isCancelledAnswer(b []byte) bool {
	if !bytes.Contains(b, []byte("-32800")) {
		return false
	}
	data := b
	if i := bytes.Index(b, []byte("data: ")); i >= 0 {
		data = bytes.TrimSpace(b[i+len("data: "):])
	}
	var msg struct {
		ID    json.RawMessage `json:"id"`
		Error *struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &msg) != nil {
		return false
	}
	return len(msg.ID) > 0 && msg.Error != nil && msg.Error.Code == codeRequestCancelled
}

// callerOf returns the principal and teams of an MCP request: the bearer token's
// identity over HTTP, else (stdio: the host started this process) the default.
func callerOf(req *mcp.CallToolRequest, def string) (string, []string) {
	if req == nil {
		return def, nil
	}
	c := callerOfExtra(req.Extra, def)
	return c.id, c.teams
}

// caller is who sent an MCP request: the principal and teams of its token, and owner,
// which names the token itself (ownerOf; "" over stdio). A run records its owner
// (OwnerAttr), and only that token's requests decide, read or cancel it: two tokens
// of one name are two callers.
type caller struct {
	id    string
	teams []string
	owner string
}

// OwnerAttr is the principal attribute of an MCP call's run that names the token that
// started it (ownerOf): a one-way hash, not the token's hash the access list holds.
const OwnerAttr = "mcp_token"

// ownerOf names a token by its identity (TokenInfo.UserID) without giving anything
// that lets anyone sign in: a hash of the identity under its own label.
func ownerOf(userID string) string {
	if userID == "" {
		return ""
	}
	sum := sha256.Sum256([]byte("toolbus mcp run owner\x00" + userID))
	return hex.EncodeToString(sum[:16])
}

// callerOfExtra is callerOf from a request's extra, with the token's owner.
func callerOfExtra(extra *mcp.RequestExtra, def string) caller {
	if extra != nil && extra.TokenInfo != nil {
		ti := extra.TokenInfo
		if who, _ := ti.Extra["principal"].(string); who != "" {
			teams, _ := ti.Extra["teams"].([]string)
			return caller{id: who, teams: teams, owner: ownerOf(ti.UserID)}
		}
	}
	return caller{id: def}
}

package mcpserver

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Sessions of the HTTP door. A session belongs to the token that opened it, not to the
// token's name: the token's identity (tokenID, the SHA-256 of the token) is the
// session's user for go-sdk, which answers 403 to a request of the session with any
// other token, even one of the same name (one per person or device of a service, or the
// old and new token during a rotation).
//
// Each token holds at most perToken live sessions, and all tokens together at most max.
// A new session of a token that would pass either cap while the token holds sessions
// gives up the token's oldest (it is closed: its next request gets 404 and the client
// opens a new one); a new session that would pass the total cap of a token that holds
// none is answered 503. So one token can neither take every session nor lock itself
// out.

// sessionCaps tracks which token opened each live session.
type sessionCaps struct {
	srv           *mcp.Server
	max, perToken int

	mu   sync.Mutex
	seq  uint64
	live map[string]capEntry // by session id, or by a reservation key until the id is known
}

type capEntry struct {
	token string // the token's identity (TokenInfo.UserID)
	seq   uint64 // order of opening: the lowest is the oldest
}

// reserve takes a slot for a new session of token, giving up the token's oldest
// session when a cap is reached; false: the total cap is reached by other tokens.
func (c *sessionCaps) reserve(token string) (key string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pruneLocked()
	mine, oldest := 0, ""
	for id, e := range c.live {
		if e.token == token {
			mine++
			if oldest == "" || e.seq < c.live[oldest].seq {
				oldest = id
			}
		}
	}
	full := c.max > 0 && len(c.live) >= c.max
	if (full || (c.perToken > 0 && mine >= c.perToken)) && oldest != "" {
		delete(c.live, oldest)
		c.closeSession(oldest)
	} else if full {
		return "", false
	}
	c.seq++
	key = "reserved:" + strconv.FormatUint(c.seq, 10)
	c.live[key] = capEntry{token: token, seq: c.seq}
	return key, true
}

// opened replaces the reservation key with the session's id; an empty id (the
// initialize failed) frees the slot.
func (c *sessionCaps) opened(key, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.live[key]
	delete(c.live, key)
	if id != "" {
		c.live[id] = e
	}
}

// pruneLocked forgets the sessions that ended (idle timeout, DELETE, closed).
func (c *sessionCaps) pruneLocked() {
	alive := map[string]bool{}
	for ss := range c.srv.Sessions() {
		alive[ss.ID()] = true
	}
	for id := range c.live {
		if !alive[id] && !isReservation(id) {
			delete(c.live, id)
		}
	}
}

func isReservation(key string) bool { return len(key) > 9 && key[:9] == "reserved:" }

// closeSession closes the session id in the background: Close waits for the session's
// requests in flight to drain.
func (c *sessionCaps) closeSession(id string) {
	for ss := range c.srv.Sessions() {
		if ss.ID() == id {
			go ss.Close()
			return
		}
	}
}

// handler caps the new sessions (POSTs without Mcp-Session-Id) of next.
func (c *sessionCaps) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Mcp-Session-Id") != "" {
			next.ServeHTTP(w, r)
			return
		}
		var token string
		if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
			token = ti.UserID
		}
		key, ok := c.reserve(token)
		if !ok {
			w.Header().Set("Retry-After", "10")
			http.Error(w, fmt.Sprintf("too many MCP sessions (%d): close one or wait for idle ones to time out (TOOLBUS_MCP_MAX_SESSIONS)", c.max), http.StatusServiceUnavailable)
			return
		}
		sw := &sessionIDWriter{ResponseWriter: w}
		defer func() { c.opened(key, sw.id) }()
		next.ServeHTTP(sw, r)
	})
}

// sessionIDWriter catches the Mcp-Session-Id a new session's answer carries.
type sessionIDWriter struct {
	http.ResponseWriter
	id      string
	written bool
}

func (s *sessionIDWriter) catch(code int) {
	if !s.written {
		s.written = true
		if code < 300 {
			s.id = s.Header().Get("Mcp-Session-Id")
		}
	}
}

func (s *sessionIDWriter) WriteHeader(code int) {
	s.catch(code)
	s.ResponseWriter.WriteHeader(code)
}

func (s *sessionIDWriter) Write(b []byte) (int, error) {
	s.catch(http.StatusOK)
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController flush the stream.
func (s *sessionIDWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Flush flushes the underlying writer.
func (s *sessionIDWriter) Flush() {
	if fl, ok := s.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}

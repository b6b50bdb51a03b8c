package connect

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// ErrPermissionDenied is wrapped by the errors of operations the server refused to the
// connection's credentials (a PermissionError says which subject).
var ErrPermissionDenied = errors.New("permission denied")

// PermissionError is an operation the server refused to the credentials: the server
// drops a request on a subject the credentials may not publish to and tells the
// connection asynchronously, so without this the request only times out.
type PermissionError struct {
	// Op is "publish" or "subscribe".
	Op string
	// Subject is the subject the credentials may not use: the missing permission.
	Subject string
	// Err is the operation's own error (a timeout), when there was one.
	Err error
	// Who names the credentials the server refused (a user, a JWT's name, an nkey).
	Who string
	// Hint says which grant is missing and how an administrator gives it (the bus's
	// SetHint); empty: add the subject to the role's permissions.
	Hint string
}

func (e *PermissionError) Error() string {
	who := "the credentials"
	if e.Who != "" {
		who = "the credentials of " + e.Who
	}
	hint := e.Hint
	if hint == "" {
		hint = "add it to the role's permissions"
	}
	return fmt.Sprintf("permission denied: %s may not %s to %q: %s", who, e.Op, e.Subject, hint)
}

// Is makes errors.Is(err, ErrPermissionDenied) true.
func (e *PermissionError) Is(target error) bool { return target == ErrPermissionDenied }

// Unwrap returns the operation's own error.
func (e *PermissionError) Unwrap() error { return e.Err }

// DenialHold is how long a bus reports itself unhealthy (Denial) after the server last
// refused one of its operations.
var DenialHold = 5 * time.Minute

var violationRE = regexp.MustCompile(`(?i)permissions violation for (publish|subscribe) to "([^"]+)"`)

// Permissions records the permission violations the server reports to one connection.
// It is safe for concurrent use; a nil *Permissions records nothing.
type Permissions struct {
	mu       sync.Mutex
	last     *PermissionError
	lastAt   time.Time
	count    uint64
	onDenied []func(*PermissionError)
	who      string
	hint     func(op, subject string) string
	guards   map[*guard]struct{}
}

// guard is an operation in flight that ends at the first refusal of a subject it uses.
type guard struct {
	prefixes []string
	cancel   context.CancelCauseFunc
}

func (g *guard) matches(subject string) bool {
	if len(g.prefixes) == 0 {
		return true
	}
	for _, p := range g.prefixes {
		if strings.HasPrefix(subject, p) {
			return true
		}
	}
	return false
}

// WatchPermissions installs a tracker in front of nc's error handler. Each bus opened
// on nc has its own (a connection carries one set of credentials: each sees them all).
func WatchPermissions(nc *nats.Conn) *Permissions {
	p := &Permissions{who: Identity(nc), guards: map[*guard]struct{}{}}
	prev := nc.ErrorHandler()
	nc.SetErrorHandler(func(c *nats.Conn, s *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			p.record(err)
		}
		if prev != nil {
			prev(c, s, err)
		}
	})
	return p
}

func (p *Permissions) record(err error) {
	m := violationRE.FindStringSubmatch(err.Error())
	pe := &PermissionError{Op: "publish", Subject: err.Error()}
	if m != nil {
		pe.Op, pe.Subject = strings.ToLower(m[1]), m[2]
	}
	p.mu.Lock()
	pe.Who = p.who
	if p.hint != nil && m != nil {
		pe.Hint = p.hint(pe.Op, pe.Subject)
	}
	p.last, p.lastAt = pe, time.Now()
	p.count++
	hooks := p.onDenied
	for g := range p.guards {
		if g.matches(pe.Subject) {
			c := *pe
			g.cancel(&c)
		}
	}
	p.mu.Unlock()
	for _, h := range hooks {
		h(pe)
	}
}

// SetHint sets what explains a refusal of subject: the grant that is missing and how
// to give it (the bus knows its subjects; this package does not).
func (p *Permissions) SetHint(hint func(op, subject string) string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.hint = hint
	p.mu.Unlock()
}

// Guard returns a context for one operation that ends as soon as the server refuses
// the connection a subject starting with one of prefixes (any subject with none), with
// the *PermissionError as its cause, and done, which turns the operation's error into
// that *PermissionError (or one Denied finds). The server only drops a refused request,
// so without a guard the operation waits for its timeout and says nothing of why.
func (p *Permissions) Guard(ctx context.Context, prefixes ...string) (context.Context, func(error) error) {
	if p == nil {
		return ctx, func(err error) error { return err }
	}
	start := time.Now()
	gctx, cancel := context.WithCancelCause(ctx)
	g := &guard{prefixes: prefixes, cancel: cancel}
	p.mu.Lock()
	p.guards[g] = struct{}{}
	p.mu.Unlock()
	return gctx, func(err error) error {
		p.mu.Lock()
		delete(p.guards, g)
		p.mu.Unlock()
		defer cancel(nil)
		var pe *PermissionError
		if err != nil && errors.As(context.Cause(gctx), &pe) {
			pe.Err = err
			return pe
		}
		return p.Denied(start, err)
	}
}

// since returns the last violation recorded at or after t, or nil.
func (p *Permissions) since(t time.Time) *PermissionError {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last == nil || p.lastAt.Before(t) {
		return nil
	}
	pe := *p.last
	return &pe
}

// Denied turns err, an operation's error, into a *PermissionError when the server
// refused an operation of the connection since start (the operation's start): a
// refused request is only dropped by the server, so err is a timeout that says
// nothing. It returns err unchanged otherwise (nil for nil).
func (p *Permissions) Denied(start time.Time, err error) error {
	if err == nil || errors.Is(err, ErrPermissionDenied) || p == nil {
		return err
	}
	pe := p.since(start)
	if pe == nil {
		return err
	}
	pe.Err = err
	return pe
}

// Denial returns the last permission violation of the connection and when it
// happened, while it is more recent than DenialHold: a role whose credentials miss a
// permission it uses is not ready.
func (p *Permissions) Denial() (*PermissionError, time.Time, bool) {
	if p == nil {
		return nil, time.Time{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last == nil || time.Since(p.lastAt) > DenialHold {
		return nil, time.Time{}, false
	}
	pe := *p.last
	return &pe, p.lastAt, true
}

// OnDenied calls f (which must not block) for each permission violation the server
// reports to the connection from now on: a metric, a log line.
func (p *Permissions) OnDenied(f func(*PermissionError)) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.onDenied = append(p.onDenied, f)
	p.mu.Unlock()
}

// SubscribeRefused reports the permission violation that refused one of subjects to
// nc, or nil. Call it after a flush that follows the subscriptions: the server reports
// a refused subscription before answering the flush, and the connection keeps its last
// error, so a refusal of one of these subscriptions is then that error.
func SubscribeRefused(nc *nats.Conn, subjects ...string) error {
	err := nc.LastError()
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return nil
	}
	for _, subj := range subjects {
		if strings.Contains(err.Error(), `"`+subj+`"`) {
			return err
		}
	}
	return nil
}

// Identity names the credentials of nc for messages: the user, the name in a user JWT,
// or the public nkey.
func Identity(nc *nats.Conn) string {
	if nc == nil {
		return ""
	}
	o := nc.Opts
	switch {
	case o.User != "":
		return "user " + o.User
	case o.UserJWT != nil:
		if jwt, err := o.UserJWT(); err == nil {
			if name := jwtName(jwt); name != "" {
				return "user " + name
			}
		}
		return "the JWT user"
	case o.Nkey != "":
		return "nkey " + o.Nkey
	case o.Token != "":
		return "the token"
	}
	return ""
}

// jwtName is the name claim of a JWT, read without checking it (for messages only).
func jwtName(jwt string) string {
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	var c struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(b, &c) != nil {
		return ""
	}
	return c.Name
}

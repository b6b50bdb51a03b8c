package events

import (
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
}

func (e *PermissionError) Error() string {
	return fmt.Sprintf("permission denied: the credentials may not %s to %q (add it to the role's permissions)", e.Op, e.Subject)
}

// Is makes errors.Is(err, ErrPermissionDenied) true.
func (e *PermissionError) Is(target error) bool { return target == ErrPermissionDenied }

// Unwrap returns the operation's own error.
func (e *PermissionError) Unwrap() error { return e.Err }

// DenialHold is how long a bus reports itself unhealthy (Denial) after the server last
// refused one of its operations.
var DenialHold = 5 * time.Minute

var violationRE = regexp.MustCompile(`(?i)permissions violation for (publish|subscribe) to "([^"]+)"`)

// permissions records the permission violations the server reports to one connection.
type permissions struct {
	mu       sync.Mutex
	last     *PermissionError
	lastAt   time.Time
	count    uint64
	onDenied []func(*PermissionError)
}

// watchPermissions installs a tracker in front of nc's error handler. Each bus opened
// on nc has its own (a connection carries one set of credentials: each sees them all).
func watchPermissions(nc *nats.Conn) *permissions {
	p := &permissions{}
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

func (p *permissions) record(err error) {
	m := violationRE.FindStringSubmatch(err.Error())
	pe := &PermissionError{Op: "publish", Subject: err.Error()}
	if m != nil {
		pe.Op, pe.Subject = strings.ToLower(m[1]), m[2]
	}
	p.mu.Lock()
	p.last, p.lastAt = pe, time.Now()
	p.count++
	hooks := p.onDenied
	p.mu.Unlock()
	for _, h := range hooks {
		h(pe)
	}
}

// since returns the last violation recorded at or after t, or nil.
func (p *permissions) since(t time.Time) *PermissionError {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last == nil || p.lastAt.Before(t) {
		return nil
	}
	pe := *p.last
	return &pe
}

// Denied turns err, an operation's error, into a *PermissionError when the server
// refused an operation of this bus's connection since start (the operation's start):
// a refused request is only dropped by the server, so err is a timeout that says
// nothing. It returns err unchanged otherwise (nil for nil).
func (b *Bus) Denied(start time.Time, err error) error {
	if err == nil || errors.Is(err, ErrPermissionDenied) || b.perms == nil {
		return err
	}
	pe := b.perms.since(start)
	if pe == nil {
		return err
	}
	pe.Err = err
	return pe
}

// Denial returns the last permission violation of this bus's connection and when it
// happened, while it is more recent than DenialHold: a role whose credentials miss a
// permission it uses is not ready.
func (b *Bus) Denial() (*PermissionError, time.Time, bool) {
	if b.perms == nil {
		return nil, time.Time{}, false
	}
	b.perms.mu.Lock()
	defer b.perms.mu.Unlock()
	if b.perms.last == nil || time.Since(b.perms.lastAt) > DenialHold {
		return nil, time.Time{}, false
	}
	pe := *b.perms.last
	return &pe, b.perms.lastAt, true
}

// OnDenied calls f (which must not block) for each permission violation the server
// reports to this bus's connection from now on: a metric, a log line.
func (b *Bus) OnDenied(f func(*PermissionError)) {
	if b.perms == nil {
		return
	}
	b.perms.mu.Lock()
	b.perms.onDenied = append(b.perms.onDenied, f)
	b.perms.mu.Unlock()
}

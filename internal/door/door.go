// Package door holds what the front doors of toolbus (the MCP HTTP server and the web
// console) share: access lists of token hashes, bearer tokens, and the Host and Origin
// checks against DNS rebinding and cross-site requests.
package door

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// Access lists: who may use a front door of toolbus (`toolbus mcp --http`, the console).
//
// An access list is text, from a file (TOOLBUS_MCP_TOKENS_FILE, TOOLBUS_CONSOLE_USERS_FILE)
// or a variable (TOOLBUS_MCP_TOKENS, TOOLBUS_CONSOLE_USERS), one entry per line (or per
// ';' in a variable):
//
//	# name   hash of the token                                                  teams (optional)
//	alice    sha256:3a7bd3e2360a3d29eea436fcfb7e44c735d117c42d1c1835420b6b9942dd4f1b  teams=payments,ops
//
// The name is the principal: the principal of the runs an MCP caller starts, the actor
// of what a console user decides. Only the SHA-256 of a token is stored: tokens are 32
// random bytes (`toolbus token NAME` makes one), so a fast hash is enough and a leaked
// list gives nobody access. Revoking is deleting (or replacing) the line: the file is read
// again at the first use a second or more after the last read, and any change of its
// content (compared by SHA-256, not by size or modification time, which a same-length
// rotation copied with `cp -p` keeps) takes effect then, so no restart is needed.

// ErrAccess is wrapped by the errors of an unusable access list.
var ErrAccess = errors.New("access list")

// Identity is who presented a token.
type Identity struct {
	// Name is the principal id (MCP) or the user (console).
	Name string
	// Teams the Identity belongs to (the principal's roles).
	Teams []string
}

// List maps the SHA-256 of tokens to identities.
type List struct {
	byHash map[[sha256.Size]byte]Identity
}

// Parse parses entries separated by newlines or ';'; where names the source in
// errors.
func Parse(text, where string) (*List, error) {
	a := &List{byHash: map[[sha256.Size]byte]Identity{}}
	lines := strings.FieldsFunc(text, func(r rune) bool { return r == '\n' || r == ';' })
	for i, line := range lines {
		if j := strings.IndexByte(line, '#'); j >= 0 {
			line = line[:j]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		bad := func(msg string) error {
			return fmt.Errorf("%w %s, entry %d: %s (want: NAME sha256:HEX [teams=a,b])", ErrAccess, where, i+1, msg)
		}
		if len(f) < 2 || len(f) > 3 {
			return nil, bad("want 2 or 3 fields")
		}
		hexHash, ok := strings.CutPrefix(f[1], "sha256:")
		if !ok {
			return nil, bad("the token's hash must start with sha256: (never the token itself)")
		}
		raw, err := hex.DecodeString(hexHash)
		if err != nil || len(raw) != sha256.Size {
			return nil, bad("the hash is not 64 hex digits")
		}
		id := Identity{Name: f[0]}
		if len(f) == 3 {
			teams, ok := strings.CutPrefix(f[2], "teams=")
			if !ok {
				return nil, bad("the third field must be teams=a,b")
			}
			for _, t := range strings.Split(teams, ",") {
				if t = strings.TrimSpace(t); t != "" {
					id.Teams = append(id.Teams, t)
				}
			}
		}
		var h [sha256.Size]byte
		copy(h[:], raw)
		if prev, dup := a.byHash[h]; dup {
			return nil, bad(fmt.Sprintf("the same token hash is already %s's", prev.Name))
		}
		a.byHash[h] = id
	}
	return a, nil
}

// Lookup returns the Identity of a token. Only the token's hash is compared (as a map
// key): timing can reveal nothing about a stored token but its hash.
func (a *List) Lookup(token string) (Identity, bool) {
	if a == nil || token == "" {
		return Identity{}, false
	}
	id, ok := a.byHash[sha256.Sum256([]byte(token))]
	return id, ok
}

// LookupHash returns the Identity of the token whose SHA-256 is hash (a session that
// remembers the hash of the token it signed in with, not the token).
func (a *List) LookupHash(hash [sha256.Size]byte) (Identity, bool) {
	if a == nil {
		return Identity{}, false
	}
	id, ok := a.byHash[hash]
	return id, ok
}

// Len is the number of entries.
func (a *List) Len() int {
	if a == nil {
		return 0
	}
	return len(a.byHash)
}

// Source is an access list from a variable and a file, the file read again when it
// changes.
type Source struct {
	inline, file string

	mu      sync.Mutex
	list    *List
	checked time.Time
	sum     [sha256.Size]byte // of the file's content the list was read from
}

// NewSource reads the list once; a missing or malformed file is an error at start.
func NewSource(inline, file string) (*Source, error) {
	s := &Source{inline: inline, file: file}
	if err := s.reload(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Source) reload() error {
	var b []byte
	if s.file != "" {
		var err error
		if b, err = os.ReadFile(s.file); err != nil {
			return fmt.Errorf("%w: %w", ErrAccess, err)
		}
	}
	return s.parse(b)
}

// parse makes the list of the variable and the file's content b.
func (s *Source) parse(b []byte) error {
	l, err := Parse(s.inline+"\n"+string(b), s.where())
	if err != nil {
		return err
	}
	s.list, s.sum, s.checked = l, sha256.Sum256(b), time.Now()
	return nil
}

func (s *Source) where() string {
	if s.file != "" {
		return s.file
	}
	return "(variable)"
}

// recheck is how often the file is read again: a change of its content is noticed at
// the first use a recheck or more after the last read.
const recheck = time.Second

// Current returns the list, read again when the file's content changed (whatever its
// size and modification time say). A file that became unreadable or malformed keeps
// nobody in: the list is then empty until it is fixed (a revocation must never be
// undone by a typo).
func (s *Source) Current() *List {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == "" || time.Since(s.checked) < recheck {
		return s.list
	}
	s.checked = time.Now()
	b, err := os.ReadFile(s.file)
	if err == nil && sha256.Sum256(b) == s.sum {
		return s.list
	}
	if err != nil || s.parse(b) != nil {
		s.list, s.sum = &List{}, [sha256.Size]byte{}
	}
	return s.list
}

// NewToken returns a fresh token: 32 random bytes, base64url, with a prefix that says
// what it is (and lets scanners find a leaked one).
func NewToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return "tbk_" + base64.RawURLEncoding.EncodeToString(b)
}

// Entry is the access-list line of a token.
func Entry(name, token string, teams []string) string {
	sum := sha256.Sum256([]byte(token))
	line := name + " sha256:" + hex.EncodeToString(sum[:])
	if len(teams) > 0 {
		line += " teams=" + strings.Join(teams, ",")
	}
	return line
}

// BearerToken returns the token of an "Authorization: Bearer" header.
func BearerToken(r *http.Request) string {
	f := strings.Fields(r.Header.Get("Authorization"))
	if len(f) == 2 && strings.EqualFold(f[0], "bearer") {
		return f[1]
	}
	return ""
}

// HostPolicy decides which Host headers a front door answers (DNS rebinding: a page of
// evil.example whose name resolves to 127.0.0.1 sends Host: evil.example).
type HostPolicy struct {
	allowed []string // lower-case host names, without port
}

// NewHostPolicy allows the loopback names, the host of the listen address when it names
// one, and the extra names given (TOOLBUS_*_ALLOWED_HOSTS: the names clients use to
// reach a door that listens beyond loopback).
func NewHostPolicy(listen string, extra []string) HostPolicy {
	p := HostPolicy{allowed: []string{"localhost", "127.0.0.1", "::1"}}
	if h, _, err := net.SplitHostPort(listen); err == nil && h != "" && !IsWildcard(h) {
		p.allowed = append(p.allowed, strings.ToLower(h))
	}
	for _, h := range extra {
		if h = strings.ToLower(strings.TrimSpace(h)); h != "" {
			p.allowed = append(p.allowed, h)
		}
	}
	return p
}

// IsWildcard reports whether h is a wildcard address (every interface).
func IsWildcard(h string) bool { return h == "0.0.0.0" || h == "::" || h == "[::]" }

// OK reports whether the request's Host is allowed.
func (p HostPolicy) OK(r *http.Request) bool {
	h := r.Host
	if hh, _, err := net.SplitHostPort(h); err == nil {
		h = hh
	}
	h = strings.ToLower(strings.Trim(h, "[]"))
	return slices.Contains(p.allowed, h)
}

// OriginOK reports whether a request's Origin (when it has one) is the door's own
// (same host as the Host header) or one of allowed ("https://app.example": scheme, host
// and port as the browser sends them). A request without Origin is not from a browser
// page (or is same-origin navigation) and passes: the token or session still decides.
func OriginOK(r *http.Request, allowed []string) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	if slices.Contains(allowed, o) {
		return true
	}
	u, err := url.Parse(o)
	if err != nil || o == "null" {
		return false
	}
	return strings.EqualFold(u.Host, r.Host)
}

// LoopbackAddr completes an address without host (":8090") to the loopback one, so a
// door listens beyond this machine only when told so; it reports whether addr listens
// beyond loopback.
func LoopbackAddr(addr string) (string, bool, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", false, fmt.Errorf("address %q: %w (want host:port, e.g. 127.0.0.1:8090)", addr, err)
	}
	if host == "" {
		return net.JoinHostPort("127.0.0.1", port), false, nil
	}
	if host == "localhost" {
		return addr, false, nil
	}
	if ip := net.ParseIP(strings.Trim(host, "[]")); ip != nil && ip.IsLoopback() {
		return addr, false, nil
	}
	return addr, true, nil
}

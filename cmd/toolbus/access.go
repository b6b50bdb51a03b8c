package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
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
// list gives nobody access. Revoking is deleting the line: a file is read again when it
// changes (checked at most once a second), so no restart is needed.

// errAccess is wrapped by the errors of an unusable access list.
var errAccess = errors.New("access list")

// identity is who presented a token.
type identity struct {
	// Name is the principal id (MCP) or the user (console).
	Name string
	// Teams the identity belongs to (the principal's roles).
	Teams []string
}

// accessList maps the SHA-256 of tokens to identities.
type accessList struct {
	byHash map[[sha256.Size]byte]identity
}

// parseAccess parses entries separated by newlines or ';'; where names the source in
// errors.
func parseAccess(text, where string) (*accessList, error) {
	a := &accessList{byHash: map[[sha256.Size]byte]identity{}}
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
			return fmt.Errorf("%w %s, entry %d: %s (want: NAME sha256:HEX [teams=a,b])", errAccess, where, i+1, msg)
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
		id := identity{Name: f[0]}
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

// lookup returns the identity of a token. Only the token's hash is compared (as a map
// key): timing can reveal nothing about a stored token but its hash.
func (a *accessList) lookup(token string) (identity, bool) {
	if a == nil || token == "" {
		return identity{}, false
	}
	id, ok := a.byHash[sha256.Sum256([]byte(token))]
	return id, ok
}

// len is the number of entries.
func (a *accessList) len() int {
	if a == nil {
		return 0
	}
	return len(a.byHash)
}

// accessSource is an access list from a variable and a file, the file read again when it
// changes.
type accessSource struct {
	inline, file string

	mu      sync.Mutex
	list    *accessList
	checked time.Time
	modTime time.Time
	size    int64
}

// newAccessSource reads the list once; a missing or malformed file is an error at start.
func newAccessSource(inline, file string) (*accessSource, error) {
	s := &accessSource{inline: inline, file: file}
	if err := s.reload(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *accessSource) reload() error {
	text := s.inline
	var mod time.Time
	var size int64
	if s.file != "" {
		fi, err := os.Stat(s.file)
		if err != nil {
			return fmt.Errorf("%w: %w", errAccess, err)
		}
		b, err := os.ReadFile(s.file)
		if err != nil {
			return fmt.Errorf("%w: %w", errAccess, err)
		}
		text += "\n" + string(b)
		mod, size = fi.ModTime(), fi.Size()
	}
	l, err := parseAccess(text, s.where())
	if err != nil {
		return err
	}
	s.list, s.modTime, s.size, s.checked = l, mod, size, time.Now()
	return nil
}

func (s *accessSource) where() string {
	if s.file != "" {
		return s.file
	}
	return "(variable)"
}

// accessRecheck is how often a changed file is noticed.
const accessRecheck = time.Second

// current returns the list, read again when the file changed. A file that became
// unreadable or malformed keeps nobody in: the list is then empty until it is fixed
// (a revocation must never be undone by a typo).
func (s *accessSource) current() *accessList {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == "" || time.Since(s.checked) < accessRecheck {
		return s.list
	}
	s.checked = time.Now()
	fi, err := os.Stat(s.file)
	if err == nil && fi.ModTime().Equal(s.modTime) && fi.Size() == s.size {
		return s.list
	}
	if err := s.reload(); err != nil {
		s.list = &accessList{}
	}
	return s.list
}

// newToken returns a fresh token: 32 random bytes, base64url, with a prefix that says
// what it is (and lets scanners find a leaked one).
func newToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return "tbk_" + base64.RawURLEncoding.EncodeToString(b)
}

// accessEntry is the access-list line of a token.
func accessEntry(name, token string, teams []string) string {
	sum := sha256.Sum256([]byte(token))
	line := name + " sha256:" + hex.EncodeToString(sum[:])
	if len(teams) > 0 {
		line += " teams=" + strings.Join(teams, ",")
	}
	return line
}

// cmdToken prints a new token for NAME and the access-list line that lets it in.
func cmdToken(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("token", "token NAME [--teams a,b]   (a new token for the MCP HTTP server or the console, and its access-list line)", stderr)
	teams := fs.String("teams", "", "teams of the principal (comma-separated)")
	// NAME may come before the flags (toolbus token alice --teams ops).
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if name == "" && fs.NArg() > 0 {
		name = fs.Arg(0)
	} else if fs.NArg() > 0 {
		name = ""
	}
	if name == "" || strings.ContainsAny(name, " \t#;") || fs.NArg() > 1 {
		return &exitError{code: 2, msg: "token: want one NAME (no spaces, '#' or ';'): the principal or user the token stands for"}
	}
	var ts []string
	for _, t := range strings.Split(*teams, ",") {
		if t = strings.TrimSpace(t); t != "" {
			ts = append(ts, t)
		}
	}
	tok := newToken()
	fmt.Fprintf(stdout, "token: %s\nentry: %s\n", tok, accessEntry(name, tok, ts))
	fmt.Fprintln(stderr, "Give the token to its holder (it is not stored anywhere); add the entry line to TOOLBUS_MCP_TOKENS_FILE or TOOLBUS_CONSOLE_USERS_FILE. Delete the line to revoke it.")
	return nil
}

// bearerToken returns the token of an "Authorization: Bearer" header.
func bearerToken(r *http.Request) string {
	f := strings.Fields(r.Header.Get("Authorization"))
	if len(f) == 2 && strings.EqualFold(f[0], "bearer") {
		return f[1]
	}
	return ""
}

// hostPolicy decides which Host headers a front door answers (DNS rebinding: a page of
// evil.example whose name resolves to 127.0.0.1 sends Host: evil.example).
type hostPolicy struct {
	allowed []string // lower-case host names, without port
}

// newHostPolicy allows the loopback names, the host of the listen address when it names
// one, and the extra names given (TOOLBUS_*_ALLOWED_HOSTS: the names clients use to
// reach a door that listens beyond loopback).
func newHostPolicy(listen string, extra []string) hostPolicy {
	p := hostPolicy{allowed: []string{"localhost", "127.0.0.1", "::1"}}
	if h, _, err := net.SplitHostPort(listen); err == nil && h != "" && !isWildcard(h) {
		p.allowed = append(p.allowed, strings.ToLower(h))
	}
	for _, h := range extra {
		if h = strings.ToLower(strings.TrimSpace(h)); h != "" {
			p.allowed = append(p.allowed, h)
		}
	}
	return p
}

func isWildcard(h string) bool { return h == "0.0.0.0" || h == "::" || h == "[::]" }

// ok reports whether the request's Host is allowed.
func (p hostPolicy) ok(r *http.Request) bool {
	h := r.Host
	if hh, _, err := net.SplitHostPort(h); err == nil {
		h = hh
	}
	h = strings.ToLower(strings.Trim(h, "[]"))
	return slices.Contains(p.allowed, h)
}

// originOK reports whether a request's Origin (when it has one) is the door's own
// (same host as the Host header) or one of allowed ("https://app.example": scheme, host
// and port as the browser sends them). A request without Origin is not from a browser
// page (or is same-origin navigation) and passes: the token or session still decides.
func originOK(r *http.Request, allowed []string) bool {
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

// loopbackAddr completes an address without host (":8090") to the loopback one, so a
// door listens beyond this machine only when told so; it reports whether addr listens
// beyond loopback.
func loopbackAddr(addr string) (string, bool, error) {
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

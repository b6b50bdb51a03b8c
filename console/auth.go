package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolbus/toolbus/internal/door"
)

// Console door.Identity. Users are an access list (internal/door) of names and token hashes:
// TOOLBUS_CONSOLE_USERS_FILE or TOOLBUS_CONSOLE_USERS. A script sends its token as
// "Authorization: Bearer"; a browser signs in once on /login with its token and gets a
// session cookie (HttpOnly, SameSite=Strict, signed with a key of this process) that
// names the user, the hash of the token it signed in with (so deleting the user's line
// ends their sessions too) and a random session id that this process keeps until the
// session signs out (POST /logout) or expires: a cookie replayed after sign-out is
// refused, whatever its signature and expiry say. Every page and the live stream need a user, unless
// TOOLBUS_CONSOLE_PUBLIC_READ opens reading to anyone who reaches the console; approve,
// deny and cancel always need one, and record the user as the actor.
//
// CSRF: the session cookie is SameSite=Strict, and every POST passes
// http.CrossOriginProtection (Sec-Fetch-Site, else Origin against Host): a page of
// another site can neither send the cookie nor post cross-origin. DNS rebinding: the Host
// header must be one of the console's names (door.HostPolicy).

// consoleCookie is the session cookie's name.
const consoleCookie = "toolbus_console"

// consoleSessionTTL is how long a browser session lasts.
const consoleSessionTTL = 12 * time.Hour

// auth authenticates the console's requests.
type auth struct {
	users      *door.Source // nil: nobody can sign in
	publicRead bool
	key        []byte // HMAC key of the session cookies, per process
	hosts      door.HostPolicy
	live       liveSessions
}

// liveSessions are the ids of the browser sessions signed in and not signed out, with
// their expiry.
type liveSessions struct {
	mu  sync.Mutex
	exp map[string]time.Time
}

// add records a new session id valid until exp, dropping the expired ones.
func (l *liveSessions) add(exp time.Time) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	id := base64.RawURLEncoding.EncodeToString(b)
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.exp == nil {
		l.exp = map[string]time.Time{}
	}
	for k, e := range l.exp {
		if now.After(e) {
			delete(l.exp, k)
		}
	}
	l.exp[id] = exp
	return id
}

// ok reports whether the session id is signed in and not expired.
func (l *liveSessions) ok(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.exp[id]
	return ok && time.Now().Before(e)
}

// end signs the session id out.
func (l *liveSessions) end(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.exp, id)
}

type ctxUserKey struct{}

// userOf returns the request's signed-in user, if any (set by auth.wrap).
func userOf(r *http.Request) (door.Identity, bool) {
	id, ok := r.Context().Value(ctxUserKey{}).(door.Identity)
	return id, ok
}

func newAuth(users *door.Source, publicRead bool, hosts door.HostPolicy) *auth {
	key := make([]byte, 32)
	_, _ = rand.Read(key) // crypto/rand.Read never fails
	return &auth{users: users, publicRead: publicRead, key: key, hosts: hosts}
}

// identify returns the user of a bearer token or of a valid session cookie.
func (a *auth) identify(r *http.Request) (door.Identity, bool) {
	if a.users == nil {
		return door.Identity{}, false
	}
	list := a.users.Current()
	if tok := door.BearerToken(r); tok != "" {
		return list.Lookup(tok)
	}
	c, err := r.Cookie(consoleCookie)
	if err != nil {
		return door.Identity{}, false
	}
	name, hash, sid, ok := a.verifySession(c.Value)
	if !ok || !a.live.ok(sid) {
		return door.Identity{}, false // forged, expired or signed out
	}
	id, ok := list.LookupHash(hash)
	if !ok || id.Name != name {
		return door.Identity{}, false // revoked since
	}
	return id, true
}

// session starts a session of user, signed in with token hash hash, and returns its
// cookie value.
func (a *auth) session(name string, hash [sha256.Size]byte, exp time.Time) string {
	sid := a.live.add(exp)
	payload := strings.Join([]string{base64.RawURLEncoding.EncodeToString([]byte(name)), hex.EncodeToString(hash[:]), strconv.FormatInt(exp.Unix(), 10), sid}, ".")
	return payload + "." + a.mac(payload)
}

func (a *auth) mac(payload string) string {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// verifySession checks a cookie value's signature and expiry and returns its user,
// token hash and session id (which the caller checks is still signed in).
func (a *auth) verifySession(v string) (name string, hash [sha256.Size]byte, sid string, ok bool) {
	i := strings.LastIndexByte(v, '.')
	if i < 0 || !hmac.Equal([]byte(a.mac(v[:i])), []byte(v[i+1:])) {
		return "", hash, "", false
	}
	f := strings.Split(v[:i], ".")
	if len(f) != 4 {
		return "", hash, "", false
	}
	n, err1 := base64.RawURLEncoding.DecodeString(f[0])
	h, err2 := hex.DecodeString(f[1])
	exp, err3 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || len(h) != sha256.Size || time.Now().Unix() > exp {
		return "", hash, "", false
	}
	copy(hash[:], h)
	return string(n), hash, f[3], true
}

// wrap applies the Host check, cross-origin protection and authentication to next:
// /login, /logout and the static assets are open; reads need a user unless publicRead;
// POSTs always need one.
func (a *auth) wrap(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "console: cross-origin request refused", http.StatusForbidden)
	}))
	return cop.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.hosts.OK(r) {
			http.Error(w, fmt.Sprintf("console: forbidden Host %q: add it to TOOLBUS_CONSOLE_ALLOWED_HOSTS if users reach the console by that name", r.Host), http.StatusForbidden)
			return
		}
		if r.URL.Path == "/login" || r.URL.Path == "/logout" || r.URL.Path == "/readyz" || strings.HasPrefix(r.URL.Path, "/static/") {
			next.ServeHTTP(w, r)
			return
		}
		id, ok := a.identify(r)
		if ok {
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxUserKey{}, id)))
			return
		}
		safe := r.Method == http.MethodGet || r.Method == http.MethodHead
		if safe && a.publicRead {
			next.ServeHTTP(w, r)
			return
		}
		if door.BearerToken(r) == "" && safe && strings.Contains(r.Header.Get("Accept"), "text/html") {
			http.Redirect(w, r, "/login?next="+urlPathOnly(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="toolbus console"`)
		http.Error(w, "console: sign in first (a token of TOOLBUS_CONSOLE_USERS_FILE, as Authorization: Bearer or on /login)", http.StatusUnauthorized)
	}))
}

// urlPathOnly keeps a local path for the post-login redirect (never another host).
func urlPathOnly(p string) string {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.ContainsAny(p, "\\\r\n") {
		return "/"
	}
	return p
}

// loginPage shows the sign-in form.
func (c *server) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, "login.html", map[string]any{"Next": urlPathOnly(r.URL.Query().Get("next")), "Error": ""})
}

// login checks a token and sets the session cookie.
func (c *server) login(w http.ResponseWriter, r *http.Request) {
	next := urlPathOnly(r.PostFormValue("next"))
	tok := strings.TrimSpace(r.PostFormValue("token"))
	var id door.Identity
	ok := false
	if c.auth.users != nil {
		id, ok = c.auth.users.Current().Lookup(tok)
	}
	if !ok {
		w.WriteHeader(http.StatusUnauthorized)
		c.render(w, "login.html", map[string]any{"Next": next, "Error": "unknown token"})
		return
	}
	exp := time.Now().Add(consoleSessionTTL)
	http.SetCookie(w, &http.Cookie{
		Name: consoleCookie, Value: c.auth.session(id.Name, sha256.Sum256([]byte(tok)), exp), Path: "/",
		Expires: exp, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	c.log.Info("console sign-in", "user", id.Name)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout ends the session on the server (its cookie is refused from now on, even
// replayed) and clears the cookie.
func (c *server) logout(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(consoleCookie); err == nil {
		if _, _, sid, ok := c.auth.verifySession(ck.Value); ok {
			c.auth.live.end(sid)
		}
	}
	http.SetCookie(w, &http.Cookie{Name: consoleCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// Package console is the web console of toolbus: the runs list, a page per run, the
// tools and their queues, and the human decisions, server-rendered with html/template
// from the same audit as `toolbus replay`. cmd/toolbus wires it (toolbus console, and
// toolbus up with TOOLBUS_CONSOLE_ADDR).
package console

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/internal/door"
)

// The web console: `toolbus console` (and `toolbus up` when TOOLBUS_CONSOLE_ADDR is set)
// serves the runs list (runs.go), a page per run (run.go) and its raw events
// (rawevents.go), and the tools page (tools.go), rendered by html/template (ui/) from
// the same audit as `toolbus replay` (audit.Analyze over the run's events, read with
// direct gets: the console creates no consumer). A new page adds a route (routes), a
// handler and a template. Live updates are server-sent events: one per event stored on the stream,
// after which the page fetches itself again. Approve, deny and cancel publish the same
// events as the CLI, with the signed-in user as the actor; so does the answer to a
// question a call asks (question.go) (auth.go: who may read
// and act). Everything a model or tool wrote reaches the browser through html/template
// escaping, and the page's script never writes HTML from data.

//go:embed ui
var uiFS embed.FS

// Page sizes of the runs list: the default and the largest a request may ask for (n=).
const (
	consolePageSize    = 50
	consoleMaxPageSize = 200
)

// consoleMaxOutput bounds the full output shown for one call.
const consoleMaxOutput = 1 << 20

// Options configures the console.
type Options struct {
	// Users may sign in (nil: nobody; then PublicRead must be set).
	Users *door.Source
	// PublicRead lets anyone who reaches the console read it (never act).
	PublicRead bool
	// Listen is the console's address, and AllowedHosts the other names users reach it
	// by (the Host check).
	Listen       string
	AllowedHosts []string
	// Instance names this console in the source of the events it publishes.
	Instance string
	// Deciders is the injector's decision policy (injector.Config.Deciders: nil lets
	// anyone): a decision or cancel the injector would refuse is refused here with 403
	// and the reason, instead of being published and dropped.
	Deciders []string
}

// server serves the web console over one bus.
type server struct {
	bus    *events.Bus
	auth   *auth
	hub    *hub
	source string
	log    *slog.Logger
	tmpl   *template.Template
	policy []string // Options.Deciders
}

// New returns the console's handler; its live streams follow the bus until ctx ends.
func New(ctx context.Context, bus *events.Bus, opts Options, log *slog.Logger) (http.Handler, error) {
	tmpl, err := template.New("console").Funcs(funcs()).ParseFS(uiFS, "ui/*.html")
	if err != nil {
		return nil, fmt.Errorf("console: templates: %w", err)
	}
	c := &server{bus: bus, auth: newAuth(opts.Users, opts.PublicRead, door.NewHostPolicy(opts.Listen, opts.AllowedHosts)),
		hub: newHub(bus, log), source: events.Source("console", opts.Instance), log: log, tmpl: tmpl, policy: opts.Deciders}
	go c.hub.run(ctx)
	static, err := fs.Sub(uiFS, "ui/static")
	if err != nil {
		return nil, fmt.Errorf("console: assets: %w", err)
	}
	var h http.Handler = c.mux(static)
	if bus.ClientAccount() {
		h = c.asViewer(static)
	}
	return securityHeaders(c.auth.wrap(h)), nil
}

// mux routes the console's pages and actions to c.
func (c *server) mux(static fs.FS) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	for _, r := range c.routes() {
		mux.HandleFunc(r.pattern, r.handler)
	}
	return mux
}

// asViewer serves a console on a client account's credentials (the accounts layout):
// each signed-in user's request is served reading and acting as the user's identity
// (events.Bus.As), so the core's read service shows them only the runs that identity
// may see, whatever the console's own checks; a user whose identity the account is not
// bound to gets 403. Requests without a user (sign-in, assets) are served as they are.
func (c *server) asViewer(static fs.FS) http.Handler {
	plain := c.mux(static)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := viewerOf(r)
		if v.name == "" {
			plain.ServeHTTP(w, r)
			return
		}
		bus, err := c.bus.As(r.Context(), v.name)
		if err != nil {
			http.Error(w, "console: "+v.name+": "+err.Error(), http.StatusForbidden)
			return
		}
		cc := *c
		cc.bus = bus
		cc.mux(static).ServeHTTP(w, r)
	})
}

// route is one page or action of the console.
type route struct {
	pattern string
	handler http.HandlerFunc
}

// routes are the console's pages and actions (a new page or decision adds its line).
// Reads need a user unless the console is public; every POST needs one (auth.wrap).
func (c *server) routes() []route {
	return []route{
		{"GET /{$}", c.runsPage},
		{"GET /runs/{run}", c.runPage},
		{"GET /runs/{run}/events", c.eventsPage},
		{"GET /runs/{run}/events.json", c.eventsJSON},
		{"GET /tools", c.toolsPage},
		{"POST /runs/{run}/approve", c.decide("approve")},
		{"POST /runs/{run}/deny", c.decide("deny")},
		{"POST /runs/{run}/respond", c.decide("respond")},
		{"POST /runs/{run}/answer", c.answer},
		{"POST /runs/{run}/cancel", c.cancel},
		{"GET /events", c.sse},
		{"GET /login", c.loginPage},
		{"POST /login", c.login},
		{"POST /logout", c.logout},
		{"GET /readyz", c.ready},
	}
}

// securityHeaders forbids inline scripts and framing: even markup that escaped the
// templates could not run.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; frame-ancestors 'none'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		h.ServeHTTP(w, r)
	})
}

// Serve serves h at addr until ctx ends.
func Serve(ctx context.Context, addr string, h http.Handler, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("console: listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	log.Info("console serving", "url", "http://"+ln.Addr().String())
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	err = srv.Serve(ln)
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("console: %w", err)
}

// pageData adds who is signed in (and whether they may act) to a page's data.
func (c *server) pageData(r *http.Request, data map[string]any) map[string]any {
	u, ok := userOf(r)
	data["CanAct"] = ok
	data["User"] = u.Name
	return data
}

// actor returns the signed-in user who acts (consoleAuth.wrap lets no POST through
// without one; a public console's anonymous reader cannot act).
func actor(w http.ResponseWriter, r *http.Request) (string, bool) {
	u, ok := userOf(r)
	if !ok {
		http.Error(w, "console: sign in to approve, deny or cancel", http.StatusUnauthorized)
	}
	return u.Name, ok
}

// decide serves a person's decision on a waiting call: approve (with "args": an edit,
// checked against the tool's schema before anything is published), deny (the model
// reads "reason") or respond ("answer" becomes the call's result), as the CLI does.
func (c *server) decide(kind string) http.HandlerFunc {
	granted := kind == "approve"
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		run, who, ok := actorOnRun(w, r)
		if !ok {
			return
		}
		callID, reason := r.PostFormValue("call"), strings.TrimSpace(r.PostFormValue("reason"))
		a := toolbus.Approval{RunID: run, CallID: callID, Who: who, Why: reason}
		switch kind {
		case "deny":
			if reason == "" {
				http.Error(w, "deny: a reason is required: the model reads it", http.StatusBadRequest)
				return
			}
		case "respond":
			a.Response = strings.TrimSpace(r.PostFormValue("answer"))
			if a.Response == "" {
				http.Error(w, "respond: an answer is required: the model reads it as the call's result", http.StatusBadRequest)
				return
			}
		}
		if !c.mustSee(w, r, run) {
			return
		}
		step, call, err := decide.Waiting(ctx, c.bus, run, callID)
		if err != nil {
			c.actionError(w, err)
			return
		}
		if !c.mayDecide(w, r, run, call.Tool) {
			return
		}
		// The form shows the model's arguments for editing: unchanged, it is an approval.
		if args := strings.TrimSpace(r.PostFormValue("args")); granted && args != "" && args != call.Arguments {
			if err := decide.CheckEdit(ctx, c.bus, call, args); err != nil {
				c.actionError(w, err)
				return
			}
			a.Arguments = args
		}
		if _, err := c.bus.PublishApproval(ctx, c.source, step, a, granted); err != nil {
			c.fail(w, err)
			return
		}
		c.log.Info("console decision", "run", run, "call", callID, "decision", a.Kind(granted), "who", a.Who)
		http.Redirect(w, r, "/runs/"+run, http.StatusSeeOther)
	}
}

// actorOnRun returns the run a decision's path names and who decides: false, with the
// response written, when the request names no signed-in actor or no valid run id.
func actorOnRun(w http.ResponseWriter, r *http.Request) (run, who string, ok bool) {
	run = r.PathValue("run")
	if who, ok = actor(w, r); !ok {
		return "", "", false
	}
	if !toolbus.ValidRunID(run) {
		http.Error(w, "invalid run id", http.StatusBadRequest)
		return "", "", false
	}
	return run, who, true
}

func (c *server) cancel(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	run, who, ok := actorOnRun(w, r)
	if !ok {
		return
	}
	if !c.mustSee(w, r, run) || !c.mayCancel(w, r, run) {
		return
	}
	st, _, err := c.bus.Store().RunState(ctx, run)
	if err != nil {
		if errors.Is(err, events.ErrRunNotFound) {
			http.Error(w, fmt.Sprintf("run %s not found", run), http.StatusNotFound)
			return
		}
		c.fail(w, err)
		return
	}
	if st.Status.Terminal() {
		http.Error(w, fmt.Sprintf("run %s already ended: %s", run, st.Status), http.StatusConflict)
		return
	}
	cn := toolbus.Cancel{RunID: run, Reason: strings.TrimSpace(r.PostFormValue("reason")), Who: who}
	if _, err := c.bus.PublishCancel(ctx, c.source, cn); err != nil {
		c.fail(w, err)
		return
	}
	c.log.Info("console cancel", "run", run, "who", cn.Who)
	http.Redirect(w, r, "/runs/"+run, http.StatusSeeOther)
}

// actionError answers an action the run's state refuses (409, as the CLI exits 1).
func (c *server) actionError(w http.ResponseWriter, err error) {
	var refused *decide.RefusedError
	if errors.As(err, &refused) {
		http.Error(w, refused.Msg, http.StatusConflict)
		return
	}
	c.fail(w, err)
}

// sse streams one event per message stored on the run's subjects (or every run's),
// from now on: the page then fetches itself again. Every stream shares the hub's one
// watcher of the bus.
func (c *server) sse(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	run := r.URL.Query().Get("run")
	if run != "" && !toolbus.ValidRunID(run) {
		http.Error(w, "invalid run id", http.StatusBadRequest)
		return
	}
	var filter *streamFilter
	if run != "" && !c.mustSee(w, r, run) {
		return
	}
	if v := viewerOf(r); run == "" && v.restricted {
		vis, err := c.visibilityOf(ctx, v)
		if err != nil {
			c.fail(w, err)
			return
		}
		filter = &streamFilter{vis: vis, seen: map[string]bool{}}
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	ch, ok := c.hub.subscribe(run)
	if !ok {
		w.Header().Set("Retry-After", "30")
		http.Error(w, "console: too many live streams open", http.StatusServiceUnavailable)
		return
	}
	defer c.hub.unsubscribe(ch)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	// Subscribed: events from here on reach this page. "ready" tells the page to fetch
	// itself once, for what was stored before.
	fmt.Fprint(w, "event: ready\ndata: {}\n\n")
	flusher.Flush()
	keepalive := time.NewTicker(30 * time.Second)
	defer keepalive.Stop()
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case <-keepalive.C:
			_, err = fmt.Fprint(w, ": keepalive\n\n")
		case n := <-ch:
			if n.Type == "ready" {
				_, err = fmt.Fprint(w, "event: ready\ndata: {}\n\n")
				break
			}
			if !filter.pass(ctx, n.Subject) {
				continue
			}
			b, _ := json.Marshal(map[string]string{"subject": n.Subject, "type": n.Type})
			_, err = fmt.Fprintf(w, "event: bus\ndata: %s\n\n", b)
		}
		if err != nil {
			return
		}
		flusher.Flush()
	}
}

// ready answers 200 once the live updates follow the bus (a probe: no user needed,
// nothing of any run told).
func (c *server) ready(w http.ResponseWriter, _ *http.Request) {
	if !c.hub.live.Load() {
		http.Error(w, "not ready: not following the bus", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}

func (c *server) render(w http.ResponseWriter, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := c.tmpl.ExecuteTemplate(w, name, data); err != nil {
		c.log.Warn("console: render", "page", name, "err", err)
	}
}

func (c *server) fail(w http.ResponseWriter, err error) {
	if errors.Is(err, errConsoleBusy) {
		w.Header().Set("Retry-After", "5")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	c.log.Warn("console", "err", err)
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

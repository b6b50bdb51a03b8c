package main

import (
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// The web console: `toolbus console` (and `toolbus up` when TOOLBUS_CONSOLE_ADDR is set)
// serves the runs list and a page per run, rendered by html/template from the same
// audit as `toolbus replay` (analyzeRun over the run's events, read from the bus's
// reader). Live updates are server-sent events: one per event stored on the stream,
// after which the page fetches itself again. Approve, deny and cancel publish the same
// events as the CLI and need TOOLBUS_CONSOLE_TOKEN; with no token the console is
// read-only. Everything a model or tool wrote reaches the browser through html/template
// escaping, and the page's script never writes HTML from data.

//go:embed consoleui
var consoleFS embed.FS

// consoleMaxRuns bounds the runs list (newest first).
const consoleMaxRuns = 200

// consoleMaxOutput bounds the full output shown for one call.
const consoleMaxOutput = 1 << 20

// errConsoleForbidden is the answer to an action without the console token.
var errConsoleForbidden = errors.New("console: this action needs TOOLBUS_CONSOLE_TOKEN")

// console serves the web console over one bus.
type console struct {
	bus    *events.Bus
	token  string
	source string
	log    *slog.Logger
	tmpl   *template.Template
}

// newConsole returns the console's handler. An empty token makes it read-only.
func newConsole(bus *events.Bus, token, instance string, log *slog.Logger) (http.Handler, error) {
	tmpl, err := template.New("console").Funcs(template.FuncMap{
		// x is a position on the 0-1000 axis of a timeline row, from a percentage.
		"x":  func(pct float64) string { return fmt.Sprintf("%.1f", pct*10) },
		"ms": ms,
		"rawjson": func(b json.RawMessage) string {
			if len(b) == 0 {
				return ""
			}
			var v any
			if json.Unmarshal(b, &v) != nil {
				return string(b)
			}
			out, _ := json.MarshalIndent(v, "", "  ")
			return string(out)
		},
	}).ParseFS(consoleFS, "consoleui/*.html")
	if err != nil {
		return nil, fmt.Errorf("console: templates: %w", err)
	}
	c := &console{bus: bus, token: token, source: events.Source("console", instance), log: log, tmpl: tmpl}
	static, err := fs.Sub(consoleFS, "consoleui/static")
	if err != nil {
		return nil, fmt.Errorf("console: assets: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", c.runsPage)
	mux.HandleFunc("GET /runs/{run}", c.runPage)
	mux.HandleFunc("POST /runs/{run}/approve", c.decide(true))
	mux.HandleFunc("POST /runs/{run}/deny", c.decide(false))
	mux.HandleFunc("POST /runs/{run}/cancel", c.cancel)
	mux.HandleFunc("GET /events", c.sse)
	return securityHeaders(mux), nil
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

// serveConsole serves h at addr until ctx ends.
func serveConsole(ctx context.Context, addr string, h http.Handler, log *slog.Logger) error {
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

// cmdConsole serves the console at TOOLBUS_CONSOLE_ADDR.
func cmdConsole(ctx context.Context, cfg Config, log *slog.Logger) error {
	if cfg.ConsoleAddr == "" {
		return &exitError{code: 2, msg: "console: set TOOLBUS_CONSOLE_ADDR (host:port), for example 127.0.0.1:8080"}
	}
	c, err := openReader(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer c.Close()
	return runConsole(ctx, cfg, c.bus, log)
}

// runConsole serves the console of bus at TOOLBUS_CONSOLE_ADDR until ctx ends.
func runConsole(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger) error {
	h, err := newConsole(bus, cfg.ConsoleToken, cfg.Instance, log)
	if err != nil {
		return err
	}
	if cfg.ConsoleToken == "" {
		log.Info("console is read-only: set TOOLBUS_CONSOLE_TOKEN to approve, deny and cancel from it")
	}
	return serveConsole(ctx, cfg.ConsoleAddr, h, log)
}

// runRow is one line of the runs list.
type runRow struct {
	events.RunState
	Question string
	Tokens   int64
	Age      string
}

// consoleStatuses are the statuses the runs list filters on.
var consoleStatuses = []toolbus.RunStatus{toolbus.RunRunning, toolbus.RunWaitingForApproval, toolbus.RunCompleted,
	toolbus.RunFailed, toolbus.RunLimitReached, toolbus.RunCancelled}

func (c *console) runsPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	filter := r.URL.Query().Get("status")
	if filter != "" && !validStatus(filter) {
		http.Error(w, fmt.Sprintf("unknown status %q: want one of %s", filter, statusList()), http.StatusBadRequest)
		return
	}
	runs, err := c.bus.Runs(ctx)
	if err != nil {
		c.fail(w, err)
		return
	}
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].StartedAt.After(runs[j].StartedAt) })
	now := time.Now()
	var rows []runRow
	for _, st := range runs {
		if filter != "" && string(st.Status) != filter {
			continue
		}
		if len(rows) == consoleMaxRuns {
			break
		}
		row := runRow{RunState: st, Age: age(now.Sub(st.StartedAt))}
		if !st.Status.Terminal() {
			if step, err := c.bus.CurrentStep(ctx, st.RunID); err == nil {
				row.Step = step
			}
		}
		if rs, err := c.bus.RunStarted(ctx, st.RunID); err == nil {
			row.Question = question(rs.Messages)
		}
		if st.Ended != nil && st.Status != toolbus.RunWaitingForApproval {
			row.Tokens = st.Ended.Usage.Total()
		} else if u, err := c.bus.UsageSoFar(ctx, st.RunID, row.Step); err == nil {
			row.Tokens = u.Total()
		}
		rows = append(rows, row)
	}
	c.render(w, "runs.html", map[string]any{"Runs": rows, "Filter": filter, "Statuses": consoleStatuses, "CanAct": c.token != ""})
}

func validStatus(s string) bool {
	for _, st := range consoleStatuses {
		if string(st) == s {
			return true
		}
	}
	return false
}

func statusList() string {
	var s []string
	for _, st := range consoleStatuses {
		s = append(s, string(st))
	}
	return strings.Join(s, ", ")
}

// question is the run's last user message.
func question(msgs []toolbus.Message) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == toolbus.RoleUser {
			return oneLine(msgs[i].Content, 160)
		}
	}
	return ""
}

// bar places a span on the run's time axis, in percent.
type bar struct {
	Left, Width float64
}

// consoleCall is one call of a step, on the timeline and in detail.
type consoleCall struct {
	replayCall
	Bar        bar
	Start, End int64
	Running    bool
	Status     string
	Code       string
	FullOutput string
	OutputErr  string
}

// consoleStep is one step: the model call, then its calls.
type consoleStep struct {
	N          int
	Model      bar
	ModelMS    int64
	Responded  bool
	Calls      []*consoleCall
	Assistant  string
	Reasoning  string
	StepTokens int64
}

func (c *console) runPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	run := r.PathValue("run")
	if !toolbus.ValidRunID(run) {
		http.Error(w, "invalid run id", http.StatusBadRequest)
		return
	}
	evs, err := readRunEvents(ctx, c.bus, run)
	if err != nil {
		c.fail(w, err)
		return
	}
	if len(evs) == 0 {
		http.Error(w, fmt.Sprintf("run %s not found", run), http.StatusNotFound)
		return
	}
	rep := analyzeRun(run, evs)
	st, _, stErr := c.bus.RunState(ctx, run)
	var waiting []toolbus.ToolCall
	if stErr == nil && st.Status == toolbus.RunWaitingForApproval && st.Ended != nil {
		waiting = st.Ended.Pending
	} else if rep.Status == toolbus.RunWaitingForApproval {
		waiting = rep.Pending
	}
	steps := c.steps(ctx, rep)
	c.render(w, "run.html", map[string]any{
		"R": rep, "Steps": steps, "Waiting": waiting, "CanAct": c.token != "",
		"Active": !rep.Status.Terminal(), "Duration": ms(rep.DurationMS),
	})
}

// ms renders a duration in milliseconds.
func ms(v int64) string {
	if v <= 0 {
		return "<1ms"
	}
	return (time.Duration(v) * time.Millisecond).String()
}

// steps lays the report's calls out on the time axis.
func (c *console) steps(ctx context.Context, rep *replayReport) []*consoleStep {
	var span int64 = 1
	for _, e := range rep.Timeline {
		span = max(span, e.AtMS)
	}
	pos := func(from, to int64) bar {
		to = max(to, from)
		return bar{Left: float64(from) * 100 / float64(span), Width: max(0.5, float64(to-from)*100/float64(span))}
	}
	byStep := map[int]*consoleStep{}
	var order []int
	stepOf := func(n int) *consoleStep {
		s := byStep[n]
		if s == nil {
			s = &consoleStep{N: n}
			byStep[n] = s
			order = append(order, n)
		}
		return s
	}
	type key struct {
		step int
		id   string
	}
	start, end := map[key]int64{}, map[key]int64{}
	modelStart, modelEnd := map[int]int64{}, map[int]int64{}
	for _, e := range rep.Timeline {
		switch e.Type {
		case "model.requested":
			stepOf(e.Step)
			if _, ok := modelStart[e.Step]; !ok {
				modelStart[e.Step] = e.AtMS
			}
		case "model.responded":
			modelEnd[e.Step] = e.AtMS
		case "tool.requested", "tool.waiting":
			k := key{e.Step, e.CallID}
			if _, ok := start[k]; !ok {
				start[k] = e.AtMS
			}
		case "tool.finished":
			k := key{e.Step, e.CallID}
			if _, ok := end[k]; !ok {
				end[k] = e.AtMS
			}
		}
	}
	for n, from := range modelStart {
		s := stepOf(n)
		to, ok := modelEnd[n]
		s.Responded = ok
		if !ok {
			to = span
		}
		s.Model, s.ModelMS = pos(from, to), to-from
	}
	for _, rc := range rep.Calls {
		s := stepOf(rc.Step)
		k := key{rc.Step, rc.CallID}
		cc := &consoleCall{replayCall: rc, Start: start[k], Status: "pending"}
		if e, ok := end[k]; ok {
			cc.End = e
		} else {
			cc.End, cc.Running = span, true
		}
		if rc.Waited && rc.Decision == "" {
			cc.Status = "waiting"
		}
		if rc.Result != nil {
			cc.Status, cc.Code = string(rc.Result.Status), rc.Result.Code()
			if tr := rc.Result.Truncated; tr != nil && tr.Ref != "" {
				if data, err := c.bus.Output(ctx, tr.Ref); err != nil {
					cc.OutputErr = err.Error()
				} else {
					if len(data) > consoleMaxOutput {
						data = data[:consoleMaxOutput]
					}
					cc.FullOutput = string(data)
				}
			}
		}
		cc.Bar = pos(cc.Start, cc.End)
		s.Calls = append(s.Calls, cc)
	}
	sort.Ints(order)
	out := make([]*consoleStep, 0, len(order))
	for _, n := range order {
		s := byStep[n]
		sort.SliceStable(s.Calls, func(i, j int) bool { return s.Calls[i].Index < s.Calls[j].Index })
		out = append(out, s)
	}
	return out
}

// authorized checks the console token of an action (constant time).
func (c *console) authorized(r *http.Request) error {
	if c.token == "" {
		return fmt.Errorf("%w: the console is read-only", errConsoleForbidden)
	}
	got := r.PostFormValue("token")
	if got == "" {
		got = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	if subtle.ConstantTimeCompare([]byte(got), []byte(c.token)) != 1 {
		return fmt.Errorf("%w: wrong or missing token", errConsoleForbidden)
	}
	return nil
}

func (c *console) decide(granted bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		run := r.PathValue("run")
		if err := c.authorized(r); err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		if !toolbus.ValidRunID(run) {
			http.Error(w, "invalid run id", http.StatusBadRequest)
			return
		}
		callID, reason := r.PostFormValue("call"), strings.TrimSpace(r.PostFormValue("reason"))
		if !granted && reason == "" {
			http.Error(w, "deny: a reason is required: the model reads it", http.StatusBadRequest)
			return
		}
		step, _, err := waitingCall(ctx, c.bus, run, callID)
		if err != nil {
			c.actionError(w, err)
			return
		}
		a := toolbus.Approval{RunID: run, CallID: callID, Who: consoleWho(r), Why: reason}
		if _, err := c.bus.PublishApproval(ctx, c.source, step, a, granted); err != nil {
			c.fail(w, err)
			return
		}
		c.log.Info("console decision", "run", run, "call", callID, "granted", granted, "who", a.Who)
		http.Redirect(w, r, "/runs/"+run, http.StatusSeeOther)
	}
}

func (c *console) cancel(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	run := r.PathValue("run")
	if err := c.authorized(r); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	if !toolbus.ValidRunID(run) {
		http.Error(w, "invalid run id", http.StatusBadRequest)
		return
	}
	st, _, err := c.bus.RunState(ctx, run)
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
	cn := toolbus.Cancel{RunID: run, Reason: strings.TrimSpace(r.PostFormValue("reason")), Who: consoleWho(r)}
	if _, err := c.bus.PublishCancel(ctx, c.source, cn); err != nil {
		c.fail(w, err)
		return
	}
	c.log.Info("console cancel", "run", run, "who", cn.Who)
	http.Redirect(w, r, "/runs/"+run, http.StatusSeeOther)
}

// consoleWho names who acted from the console: the form's name, else "console".
func consoleWho(r *http.Request) string {
	if w := strings.TrimSpace(r.PostFormValue("who")); w != "" {
		return oneLine(w, 80)
	}
	return "console"
}

// actionError answers an action the run's state refuses (the CLI's exit 1 cases).
func (c *console) actionError(w http.ResponseWriter, err error) {
	var ee *exitError
	if errors.As(err, &ee) {
		http.Error(w, ee.msg, http.StatusConflict)
		return
	}
	c.fail(w, err)
}

// sse streams one event per message stored on the run's subjects (or every run's),
// from now on: the page then fetches itself again.
func (c *console) sse(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	filter := events.FilterAll
	if run := r.URL.Query().Get("run"); run != "" {
		if !toolbus.ValidRunID(run) {
			http.Error(w, "invalid run id", http.StatusBadRequest)
			return
		}
		filter = events.SubjectRun(run)
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	cons, err := c.bus.Reader().OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverNewPolicy,
	})
	if err != nil {
		c.fail(w, err)
		return
	}
	msgs, err := cons.Messages()
	if err != nil {
		c.fail(w, err)
		return
	}
	defer msgs.Stop()
	go func() {
		<-ctx.Done()
		msgs.Stop()
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	// The consumer exists: events from here on reach this page. "ready" tells the page
	// to fetch itself once, for what was stored before.
	fmt.Fprint(w, "event: ready\ndata: {}\n\n")
	flusher.Flush()
	for {
		msg, err := msgs.Next()
		if err != nil {
			return
		}
		typ := msg.Headers().Get("ce-type")
		if typ == "" {
			typ = "event"
		}
		b, _ := json.Marshal(map[string]string{"subject": msg.Subject(), "type": typ})
		if _, err := fmt.Fprintf(w, "event: bus\ndata: %s\n\n", b); err != nil {
			return
		}
		flusher.Flush()
	}
}

func (c *console) render(w http.ResponseWriter, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := c.tmpl.ExecuteTemplate(w, name, data); err != nil {
		c.log.Warn("console: render", "page", name, "err", err)
	}
}

func (c *console) fail(w http.ResponseWriter, err error) {
	c.log.Warn("console", "err", err)
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolbus/toolbus"
)

// Defaults used when a Tool leaves Timeout or MaxOutputBytes at 0.
const (
	DefaultTimeout        = 30 * time.Second
	DefaultMaxOutputBytes = 16384
)

// Authorizer decides whether principal p may call tool with args (already validated).
// A non-nil error rejects the call with not_authorized; the error's text (or an *Error's
// Message) is shown to the model after redaction, so it must not carry secrets.
type Authorizer interface {
	Authorize(ctx context.Context, p toolbus.Principal, tool string, args json.RawMessage) error
}

// AuthorizerFunc adapts a function to Authorizer.
type AuthorizerFunc func(ctx context.Context, p toolbus.Principal, tool string, args json.RawMessage) error

// Authorize calls f.
func (f AuthorizerFunc) Authorize(ctx context.Context, p toolbus.Principal, tool string, args json.RawMessage) error {
	return f(ctx, p, tool, args)
}

// Executor runs tool calls from a Registry through the gates described in the package
// documentation. It is safe for concurrent use.
type Executor struct {
	reg        *Registry
	auth       Authorizer
	log        *slog.Logger
	instance   string
	defTimeout time.Duration
	defMaxOut  int
	secrets    *secretBox
	sems       sync.Map // tool name -> chan struct{} (tools with MaxConcurrency > 0)
}

// Option configures an Executor. An option out of its range makes New return an error
// wrapping ErrInvalidOption.
type Option func(*Executor) error

// ErrInvalidOption is wrapped by the error of New for an option out of its range: New
// refuses it instead of replacing it with a value the caller did not ask for.
var ErrInvalidOption = errors.New("executor: invalid option")

// New returns an Executor over reg (nil means an empty registry). Tools may still be
// registered in reg after New. An option out of its range is an error wrapping
// ErrInvalidOption.
func New(reg *Registry, opts ...Option) (*Executor, error) {
	if reg == nil {
		reg = NewRegistry()
	}
	e := &Executor{reg: reg, log: slog.Default(), defTimeout: DefaultTimeout, defMaxOut: DefaultMaxOutputBytes, secrets: &secretBox{}}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(e); err != nil {
			return nil, err
		}
	}
	e.log = slog.New(&redactHandler{h: e.log.Handler(), box: e.secrets})
	return e, nil
}

// WithAuthorizer sets the authorization hook (gate 4); nil allows every call.
func WithAuthorizer(a Authorizer) Option {
	return func(e *Executor) error { e.auth = a; return nil }
}

// WithLogger sets the logger for panics (with their stacks, at error level) and for
// tools that outlive their timeout; nil keeps slog.Default(). What the executor logs is
// redacted as results are (WithSecrets, RedactText).
func WithLogger(l *slog.Logger) Option {
	return func(e *Executor) error {
		if l != nil {
			e.log = l
		}
		return nil
	}
}

// WithInstance names this executor instance; the name goes into ToolResult.Executor.
func WithInstance(name string) Option {
	return func(e *Executor) error { e.instance = name; return nil }
}

// WithDefaultTimeout sets the timeout of tools whose Timeout is 0; 0 keeps
// DefaultTimeout, a negative d is an error.
func WithDefaultTimeout(d time.Duration) Option {
	return func(e *Executor) error {
		if d < 0 {
			return fmt.Errorf("%w: default timeout %v: want 0 (the default) or more", ErrInvalidOption, d)
		}
		if d > 0 {
			e.defTimeout = d
		}
		return nil
	}
}

// WithDefaultMaxOutputBytes sets the content bound of tools whose MaxOutputBytes is 0;
// 0 keeps DefaultMaxOutputBytes, a negative n or one below MinOutputBytes is an error.
func WithDefaultMaxOutputBytes(n int) Option {
	return func(e *Executor) error {
		if n < 0 || (n > 0 && n < MinOutputBytes) {
			return fmt.Errorf("%w: default max output bytes %d: want 0 (the default) or at least %d", ErrInvalidOption, n, MinOutputBytes)
		}
		if n > 0 {
			e.defMaxOut = n
		}
		return nil
	}
}

// WithSecrets makes the executor replace each of values (those of at least MinSecretLen
// bytes) with "[REDACTED]" wherever it occurs in a result, error message or details,
// before any pattern of RedactText: the credentials of the process itself (its NATS
// password or token, nkey seed, model API keys) that a tool could read and print.
func WithSecrets(values ...string) Option {
	return func(e *Executor) error {
		e.secrets.add(values...)
		return nil
	}
}

// AddSecrets adds values to those of WithSecrets while the executor runs: credentials
// the process obtains after New (an MCP server's OAuth access and refresh tokens) are
// redacted from then on, in results, progress and log lines alike. Safe for concurrent
// use.
func (e *Executor) AddSecrets(values ...string) { e.secrets.add(values...) }

// secretValues returns the values of WithSecrets and AddSecrets (none on a nil Executor).
func (e *Executor) secretValues() secretValues {
	if e == nil {
		return nil
	}
	return e.secrets.load()
}

// Logger returns the executor's logger: the one of WithLogger, redacting every line as
// results are (WithSecrets, RedactText). Give it to what logs beside the executor (the
// bus worker, MCP servers' tools), so their log lines are redacted too.
func (e *Executor) Logger() *slog.Logger { return e.log }

// Registry returns the registry the executor serves.
func (e *Executor) Registry() *Registry { return e.reg }

// CallInfo is the bus metadata of a call. The bus worker puts it in the context given to
// Execute (WithCallInfo) and tools read it (CallInfoFrom), e.g. to pass IdempotencyKey to
// a side-effecting API so that a redelivered call does not act twice.
type CallInfo struct {
	RunID     string
	Step      int
	CallID    string
	CallIndex int
	// Tool is the name of the tool called.
	Tool string
	// Principal is who the run acts for, from the run's own run.started.
	Principal toolbus.Principal
	// Attempt counts deliveries of this call, from 1; it goes into ToolResult.Attempt.
	Attempt int
	// IdempotencyKey is stable across attempts of the same call (<run>/<step>/<call_id>):
	// a call runs again only when the executor that claimed it died mid-call or lost its
	// lease, and then with the same key, so a downstream system can drop the repeat.
	IdempotencyKey string
	// Lease is the executor's hold on the call (nil outside an executor worker); see
	// LeaseValid.
	Lease Lease
}

// Lease is an executor's hold on the calls it runs. While it holds, no other executor
// can have taken the call over; once it runs out the call's context is cancelled and
// the call may run again elsewhere, so a tool checks it before an irreversible step.
type Lease interface {
	// Deadline is when the lease runs out unless the executor renews it meanwhile (it
	// moves forward with each renewal; zero: no lease).
	Deadline() time.Time
}

// LeaseDeadline returns when the executor's lease on the call runs out unless renewed,
// and false when the call runs outside an executor worker (no lease).
func (ci CallInfo) LeaseDeadline() (time.Time, bool) {
	if ci.Lease == nil {
		return time.Time{}, false
	}
	return ci.Lease.Deadline(), true
}

// LeaseValid reports whether the executor still holds the call: no other executor can
// have taken it over. A tool with an irreversible step checks it just before the step
// (after any long wait) and returns an error instead when it is false. Without a lease
// (outside a worker) it is true.
func (ci CallInfo) LeaseValid() bool {
	if ci.Lease == nil {
		return true
	}
	return time.Now().Before(ci.Lease.Deadline())
}

type callInfoKey struct{}

// WithCallInfo returns a copy of ctx carrying ci.
func WithCallInfo(ctx context.Context, ci CallInfo) context.Context {
	return context.WithValue(ctx, callInfoKey{}, ci)
}

// CallInfoFrom returns the CallInfo in ctx, if any.
func CallInfoFrom(ctx context.Context) (CallInfo, bool) {
	if ctx == nil {
		return CallInfo{}, false
	}
	ci, ok := ctx.Value(callInfoKey{}).(CallInfo)
	return ci, ok
}

// call is the state of one Execute.
type call struct {
	e      *Executor
	ent    *entry // nil for unknown tools
	res    *toolbus.ToolResult
	maxOut int
}

// Execute runs call for principal p and returns its result; see the package
// documentation for the gates, statuses and content. It never returns an error and
// never panics.
//
// A Func that ignores ctx is abandoned when its timeout (or ctx) expires: Execute
// returns timed_out (or cancelled) at once, but the goroutine running the Func leaks
// until the Func returns, keeps its concurrency slot until then, and its result is
// discarded (and logged at warn level).
func (e *Executor) Execute(ctx context.Context, tc toolbus.ToolCall, p toolbus.Principal) (res toolbus.ToolResult) {
	start := time.Now()
	res = toolbus.ToolResult{CallID: tc.CallID, Tool: tc.Tool, Attempt: 1}
	c := call{e: e, res: &res, maxOut: DefaultMaxOutputBytes}
	defer func() {
		if r := recover(); r != nil {
			if e != nil && e.log != nil {
				e.log.Error("executor: internal panic", "call_id", tc.CallID, "tool", tc.Tool,
					"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			}
			res.Output, res.Truncated, res.Redactions = nil, nil, 0
			c.fail(toolbus.StatusFailed, toolbus.CodeToolInternalError, internalErrorMessage, false, nil)
		}
		res.DurationMS = time.Since(start).Milliseconds()
	}()
	if ctx == nil {
		ctx = context.Background()
	}
	if ci, ok := CallInfoFrom(ctx); ok && ci.Attempt > 0 {
		res.Attempt = ci.Attempt
	}
	res.Executor = e.instance
	c.maxOut = e.defMaxOut
	if args, ok := c.admit(ctx, tc, p); ok {
		c.run(ctx, start, tc.CallID, args)
	}
	return res
}

// admit passes a call through gates 1 to 4: the tool exists, the arguments are one JSON
// object that matches its input schema, the principal may call it. It returns the
// arguments, or false when it has set the call's result (a rejection, or the context
// done before the call started).
func (c *call) admit(ctx context.Context, tc toolbus.ToolCall, p toolbus.Principal) (json.RawMessage, bool) {
	e := c.e
	// Gate 1: the tool exists.
	ent, ok := e.reg.lookup(tc.Tool)
	if !ok {
		c.fail(toolbus.StatusRejected, toolbus.CodeUnknownTool,
			fmt.Sprintf("unknown tool %s: no tool with this name is registered; call only the tools you were given, with their exact names", quoteName(tc.Tool)),
			false, nil)
		return nil, false
	}
	c.ent = ent
	if ent.tool.MaxOutputBytes > 0 {
		c.maxOut = ent.tool.MaxOutputBytes
	}

	// Gate 2: the arguments are one JSON object.
	args, v, msg, viol := parseArguments(tc.Arguments)
	if viol != nil {
		c.fail(toolbus.StatusRejected, toolbus.CodeInvalidArguments, msg, false, []Violation{*viol})
		return nil, false
	}

	// Gate 3: the arguments match the input schema.
	if err := ent.in.Validate(v); err != nil {
		vs := violations(err, true)
		c.fail(toolbus.StatusRejected, toolbus.CodeInvalidArguments,
			fmt.Sprintf("arguments do not match the input schema of %s (%s; fix all of them and call again):\n%s",
				ent.tool.Name, plural(len(vs), "violation", "violations"), violationText(vs)),
			false, vs)
		return nil, false
	}

	// Gate 4: the principal may call the tool.
	if ctx.Err() != nil {
		c.ctxDone(ctx, false, 0, "before it started")
		return nil, false
	}
	if e.auth != nil {
		if err := e.authorize(ctx, p, ent.tool.Name, args); err != nil {
			if ctx.Err() != nil {
				c.ctxDone(ctx, false, 0, "before it started")
				return nil, false
			}
			c.fail(toolbus.StatusRejected, toolbus.CodeNotAuthorized, notAuthorizedMessage(ent.tool.Name, err), false, nil)
			return nil, false
		}
	}
	return args, true
}

// run passes an admitted call through gates 5 and 6 (a concurrency slot, then the Func
// under min(timeout, ctx)) and sets its result.
func (c *call) run(ctx context.Context, start time.Time, callID string, args json.RawMessage) {
	ent := c.ent
	timeout := ent.tool.Timeout
	if timeout <= 0 {
		timeout = c.e.defTimeout
	}
	deadline, ownDeadline := start.Add(timeout), true
	if d, ok := ctx.Deadline(); ok && !deadline.Before(d) {
		deadline, ownDeadline = d, false
	}
	// The run state (pooled, with its timer) serves the whole call; it goes back to the
	// pool unless the call is abandoned to a Func still running.
	st := getRunState(time.Until(deadline))
	timer, pooled := st.timer, true
	defer func() {
		timer.Stop()
		if pooled {
			putRunState(st)
		}
	}()
	sem, ok := c.acquire(ctx, timer, ownDeadline, timeout)
	if !ok {
		return
	}
	if ctx.Err() != nil || !time.Now().Before(deadline) {
		if sem != nil {
			<-sem
		}
		c.ctxDone(ctx, ownDeadline && ctx.Err() == nil, timeout, "before it started")
		return
	}

	cctx := &callCtx{parent: ctx, deadline: deadline, lastBeat: time.Now()}
	sink, _ := ctx.Value(progressSinkKey{}).(ProgressSink)
	cctx.sink = c.e.secretValues().sink(sink)
	cctx.logSink = c.logSinkFor(ctx)
	cctx.asker = c.askerFor(ctx)
	st.ctx, st.ent, st.callID, st.args, st.sem, st.log = cctx, ent, callID, args, sem, c.e.log
	go st.run()
	if !c.await(ctx, st, cctx, timer, ownDeadline, timeout) {
		pooled = false // abandoned to a Func still running: its goroutine keeps the run state
		return
	}
	out, err, panicked := st.out, st.err, st.panicked
	defer cctx.end(context.Canceled, "the tool had returned") // the call is over: release a timer the tool started

	switch {
	case panicked:
		c.fail(toolbus.StatusFailed, toolbus.CodeToolInternalError, internalErrorMessage, false, nil)
	case err != nil:
		c.toolError(ctx, cctx, ownDeadline, timeout, err)
	default:
		c.output(out)
	}
}

// await waits for the tool's Func to return (true), or gives the call up (false, with
// the call's result set) when the call is cancelled, its timeout passes, or a
// long-running tool reports no progress for its heartbeat timeout. A given-up call is
// abandoned to its Func: a late report is refused with why.
func (c *call) await(ctx context.Context, st *runState, cctx *callCtx, timer *time.Timer, ownDeadline bool, timeout time.Duration) bool {
	// A long-running tool's heartbeat timer: checked when it would run out, moved on by
	// each report (Progress). Other tools have none (a nil channel never fires).
	var (
		beat    <-chan time.Time
		beatTmr *time.Timer
		hb      = c.ent.tool.HeartbeatTimeout
	)
	if hb > 0 {
		beatTmr = time.NewTimer(hb)
		defer beatTmr.Stop()
		beat = beatTmr.C
	}
	abandon := func(err error, why string) {
		st.abandoned.Store(true)
		cctx.end(err, why)
	}
	for {
		select {
		case <-st.done:
			return true
		case <-ctx.Done():
			select {
			case <-st.done:
				return true
			default:
				abandon(ctx.Err(), "the call was cancelled or its deadline passed")
				c.ctxDone(ctx, false, timeout, phaseRunning)
				return false
			}
		case <-timer.C:
			select {
			case <-st.done:
				return true
			default:
				abandon(context.DeadlineExceeded, "its timeout passed")
				c.ctxDone(ctx, ownDeadline && ctx.Err() == nil, timeout, phaseRunning)
				return false
			}
		case <-beat:
			if left := hb - cctx.sinceBeat(); left > 0 {
				beatTmr.Reset(left)
				continue
			}
			select {
			case <-st.done:
				return true
			default:
				why := fmt.Sprintf("the tool reported no progress for %s (its heartbeat timeout)", hb)
				abandon(context.DeadlineExceeded, why)
				c.fail(toolbus.StatusTimedOut, toolbus.CodeTimeout, why+"; it may succeed if retried", true, nil)
				return false
			}
		}
	}
}

// acquire takes a slot of a tool with MaxConcurrency (gate 5), waiting until ctx ends or
// timer fires. It returns the semaphore to release (nil for a tool without a bound),
// or false when it has set the call's result.
func (c *call) acquire(ctx context.Context, timer *time.Timer, ownDeadline bool, timeout time.Duration) (chan struct{}, bool) {
	n := c.ent.tool.MaxConcurrency
	if n <= 0 {
		return nil, true
	}
	sem := c.e.sem(c.ent.tool.Name, n)
	select {
	case sem <- struct{}{}:
		return sem, true
	default:
	}
	select {
	case sem <- struct{}{}:
		return sem, true
	case <-ctx.Done():
		c.ctxDone(ctx, false, timeout, waitingFor(n))
	case <-timer.C:
		c.ctxDone(ctx, ownDeadline, timeout, waitingFor(n))
	}
	return nil, false
}

func waitingFor(n int) string {
	return fmt.Sprintf("while waiting for a free slot (at most %d calls of this tool run at once)", n)
}

const internalErrorMessage = "the tool failed with an internal error (a bug in the tool, not in your call); do not retry the same call"

func (e *Executor) authorize(ctx context.Context, p toolbus.Principal, tool string, args json.RawMessage) (err error) {
	defer func() {
		if r := recover(); r != nil {
			e.log.Error("executor: authorizer panic", "tool", tool, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = errors.New("the authorization check failed")
		}
	}()
	return e.auth.Authorize(ctx, p, tool, args)
}

func notAuthorizedMessage(tool string, err error) string {
	var te *Error
	reason := err.Error()
	if errors.As(err, &te) && te != nil && te.Message != "" {
		reason = te.Message
	}
	return fmt.Sprintf("not authorized to call %s: %s", tool, reason)
}

// quoteName quotes a tool name from the model for a message, bounded.
func quoteName(name string) string {
	if len(name) > 64 {
		name = name[:cutBefore(name, 64)] + "…"
	}
	return fmt.Sprintf("%q", name)
}

func (e *Executor) sem(name string, n int) chan struct{} {
	if s, ok := e.sems.Load(name); ok {
		return s.(chan struct{})
	}
	s, _ := e.sems.LoadOrStore(name, make(chan struct{}, n))
	return s.(chan struct{})
}

// runState is shared between Execute and the goroutine running a Func. The goroutine
// writes out, err and panicked, then sends on done (buffered); Execute reads them only
// after receiving. A runState goes back to the pool only when Execute received from
// done, never when the call was abandoned.
type runState struct {
	done      chan struct{}
	timer     *time.Timer // the call's deadline, owned by Execute
	ctx       context.Context
	ent       *entry
	callID    string
	args      json.RawMessage
	sem       chan struct{}
	log       *slog.Logger
	out       any
	err       error
	panicked  bool
	abandoned atomic.Bool
}

var runStatePool sync.Pool

// getRunState returns a run state whose timer fires after d.
func getRunState(d time.Duration) *runState {
	if st, ok := runStatePool.Get().(*runState); ok {
		st.timer.Reset(d) // stopped when it was put back
		return st
	}
	return &runState{done: make(chan struct{}, 1), timer: time.NewTimer(d)}
}

// putRunState puts back a run state whose timer is stopped and whose Func returned.
func putRunState(st *runState) {
	done, timer := st.done, st.timer
	*st = runState{done: done, timer: timer}
	runStatePool.Put(st)
}

func (st *runState) run() {
	finished := false
	defer func() {
		if !finished {
			r := recover() // nil when the Func called runtime.Goexit
			st.panicked = true
			st.log.Error("executor: tool panicked", "call_id", st.callID, "tool", st.ent.tool.Name,
				"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		}
		if st.sem != nil {
			<-st.sem
		}
		if st.abandoned.Load() {
			st.log.Warn("executor: tool returned after its call was abandoned (timeout or cancellation); result discarded",
				"call_id", st.callID, "tool", st.ent.tool.Name)
		}
		st.done <- struct{}{}
	}()
	st.out, st.err = st.ent.tool.Func(st.ctx, st.args)
	finished = true
}

// phaseRunning is the phase of a call whose tool is running.
const phaseRunning = "before the tool finished"

// ctxDone fills a timed_out or cancelled result; when names the phase.
func (c *call) ctxDone(parent context.Context, ownDeadline bool, timeout time.Duration, when string) {
	if errors.Is(parent.Err(), context.Canceled) {
		c.fail(toolbus.StatusCancelled, toolbus.CodeCancelled, "the call was cancelled "+when, false, nil)
		return
	}
	if ownDeadline && parent.Err() == nil {
		msg := fmt.Sprintf("the tool did not finish within its timeout of %s", timeout)
		if when != phaseRunning {
			msg = fmt.Sprintf("the tool's timeout of %s passed %s", timeout, when)
		}
		c.fail(toolbus.StatusTimedOut, toolbus.CodeTimeout, msg+"; it may succeed if retried, possibly with a smaller request", true, nil)
		return
	}
	c.fail(toolbus.StatusTimedOut, toolbus.CodeTimeout, "the call deadline expired "+when, true, nil)
}

// toolError fills the result of a Func that returned err.
func (c *call) toolError(parent, runCtx context.Context, ownDeadline bool, timeout time.Duration, err error) {
	var de *decodeError
	if errors.As(err, &de) {
		c.fail(toolbus.StatusRejected, toolbus.CodeInvalidArguments,
			"arguments do not fit the tool's parameters: "+de.err.Error(), false,
			[]Violation{{Path: "", Message: de.err.Error()}})
		return
	}
	if runCtx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		c.ctxDone(parent, ownDeadline, timeout, phaseRunning)
		return
	}
	var te *Error
	if errors.As(err, &te) && te != nil {
		code := te.Code
		if code == "" {
			code = toolbus.CodeToolError
		}
		msg := te.Message
		if msg == "" {
			msg = code
		}
		c.fail(toolbus.StatusFailed, code, msg, te.Retryable, te.Details)
		return
	}
	c.fail(toolbus.StatusFailed, toolbus.CodeToolError, err.Error(), false, nil)
}

// Package conformance checks that an executor process, in any language, honours the
// toolbus event contract (CONTRACT.md). Check starts the executor from its command line
// against a NATS JetStream server, drives it only over the bus (run.started,
// tool.requested, run.cancel, a poison message) and reports every rule it breaks:
// catalog entry and live instance, valid / malformed / schema-violating / unknown
// arguments, not allowed tools, the run's deadline, cancellation, calls longer than the
// ack wait (heartbeats), poison input, exactly one result per call, deterministic ids,
// a result whose id another message took first (it is still stored), a call or a
// cancellation whose subject and data name different runs (neither is acted on), a call
// of a run that already ended (not run: cancelled/run_ended), claims (a call claimed by
// an executor that is gone is taken over with the next attempt; one claimed by a live
// executor is not run until that executor is gone), CloudEvents attributes and data
// that validates against schemas/.
//
// An executor in a team account of the accounts layout (deploy/nats/gen -accounts,
// Config.Accounts) keeps the same rules where a team account gives them a meaning, with
// what differs by design: it hears no run.cancel and reads no run state, so the end of a
// run reaches it only as the core's notice toolbus_notice.<run>.ended.<tool>
// (events.SubjectRunEndedFor), which the suite, standing in for the injector, publishes
// as the core: "cancel" publishes the notice besides run.cancel, "forged_cancel" forges
// the notice (its body names another run) instead of run.cancel, and "run_ended"
// publishes the notice before the call, whose result is then cancelled (code cancelled:
// the executor knows the run ended from the notice, not from the run's state, so it
// cannot say run_ended). "squatted" does not apply: in a team account only the core and
// the team may publish on the tool's subjects and the executor cannot read the stream,
// so a duplicate PubAck is taken as the result itself. The calls the suite claims for
// other executors name the executor's team (Config.Team): a team account reads only its
// own team's instance records.
//
// The tool under test takes {"ms": <integer>} (how long to work, in milliseconds) and
// must reject unknown properties, like the diag pack's sleep tool and the Node example's
// delay tool.
package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sjs "github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/internal/testutil"
)

// Config says how to start the executor under test.
type Config struct {
	// Command is the executor's command line; Dir its working directory.
	Command []string
	Dir     string
	// Env is added to the environment, after TOOLBUS_NATS_URL, TOOLBUS_INSTANCE and
	// TOOLBUS_ACK_WAIT, which Check sets.
	Env []string
	// Tool is the name of the tool under test.
	Tool string
	// AckWait is the ack wait the executor is started with (TOOLBUS_ACK_WAIT, default
	// 2s): the long call works for more than two of them, so it is redelivered unless the
	// executor sends heartbeats.
	AckWait time.Duration
	// Timeout bounds the whole check (default 3 minutes).
	Timeout time.Duration
	// Team is the team the executor serves for (its TOOLBUS_TEAM, which Env sets): the
	// calls the suite claims for other executors name it. Empty: no team.
	Team string
	// Accounts says the executor runs in its team's own account (the accounts layout of
	// deploy/nats/gen -accounts, TOOLBUS_NATS_API_PREFIX in Env): the rules that differ
	// there by design are checked in their team-account form (see the package doc).
	Accounts bool
}

// Report is the outcome of a check.
type Report struct {
	// Failures lists every broken rule; empty when the executor conforms.
	Failures []string
	// Progress counts the tool.progress events the executor published (reporting
	// progress is optional; the ones published must keep the rules).
	Progress int
	// Log is the executor's output, for diagnosing failures.
	Log string
}

// OK reports whether the executor conforms.
func (r Report) OK() bool { return len(r.Failures) == 0 }

// call is one case: a tool.requested and what its result must be.
type call struct {
	name       string
	args       string
	allowed    []string  // run allowlist
	deadline   time.Time // run deadline
	wantStatus toolbus.Status
	wantCode   string
	// cancel publishes run.cancel once the call is claimed.
	cancel bool
	// long marks the call that outlives two ack waits.
	long bool
	// squat publishes, before the call, a message carrying the id of its result on
	// another run's subject: the result must still be stored.
	squat bool
	// forgedCancel publishes, once the call is claimed, a run.cancel on the call's run
	// subject whose data names another run: the call must not be cancelled.
	forgedCancel bool
	// ended records the run as completed (its run state) before the call.
	ended bool
	// claimedBy claims the call before it is published for another executor: "gone"
	// (no instance record) or "holder" (a live instance record, removed by the suite
	// once the call was left alone for two ack waits).
	claimedBy string
	// wantAttempt, when set, is the attempt the result must carry.
	wantAttempt int
}

// The executors the suite claims calls for.
const (
	claimedGone   = "gone"
	claimedHolder = "holder"
	holderBoot    = "b1"
)

// Check runs the executor of cfg against the server of nc (url is the server's client
// URL for the executor process) and returns what it got wrong. The error is for a check
// that could not run at all (the server, the executor's start).
func Check(ctx context.Context, nc *nats.Conn, url string, cfg Config) (rep Report, err error) {
	if cfg.AckWait <= 0 {
		cfg.AckWait = 2 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	// The suite stands in for the admin: it sets the stream and buckets up (idempotent).
	bus, _, err := provision.Setup(ctx, nc, events.Config{})
	if err != nil {
		return rep, fmt.Errorf("conformance: %w", err)
	}
	schema, err := resultSchema()
	if err != nil {
		return rep, err
	}
	s := &suite{ctx: ctx, cfg: cfg, bus: bus, rep: &rep, schema: schema, published: map[string][]*nats.Msg{},
		stamp: strconv.FormatInt(time.Now().UnixNano()%1e9, 36)}
	sub, err := nc.Subscribe(events.FilterToolFinished, s.recordPublished)
	if err != nil {
		return rep, fmt.Errorf("conformance: %w", err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // connection may be closing

	instance := "conformance-" + strconv.Itoa(os.Getpid())
	proc, out, err := start(cfg, url, instance)
	if err != nil {
		return rep, err
	}
	defer func() { rep.Log = stop(proc, out) }()

	if !s.checkCatalog() {
		return rep, nil
	}
	if err := s.requestAll(); err != nil {
		return rep, err
	}
	if err := s.cancelClaimed(); err != nil {
		return rep, err
	}
	if err := s.releaseHeld(); err != nil {
		return rep, err
	}
	// A last call, after the poison: the queue still flows.
	after := call{name: "after_poison", args: `{"ms":1}`, wantStatus: toolbus.StatusSucceeded}
	if err := request(ctx, bus, s.runOf(after), cfg.Tool, after, nil); err != nil {
		return rep, err
	}
	s.calls = append(s.calls, after)
	s.checkResults()
	return rep, s.checkCounts()
}

// suite is one run of Check: the cases it published and what it saw.
type suite struct {
	ctx    context.Context
	cfg    Config
	bus    *events.Bus
	rep    *Report
	schema *sjs.Schema
	stamp  string // makes the run ids of this check unique
	calls  []call

	// Every publish of a result, seen on a core subscription: the stream drops a
	// republished id, but a second publish is still a second result.
	mu        sync.Mutex
	published map[string][]*nats.Msg // run/step/call -> results as published

	redelivered int // the most redeliveries the tool's queue counted

	heldSince time.Time // when the call claimed by a live executor was published
	// holderStop ends the renewals of that executor's instance record; holderDone is
	// closed once they ended.
	holderStop, holderDone chan struct{}
}

func (s *suite) fail(format string, args ...any) {
	s.rep.Failures = append(s.rep.Failures, fmt.Sprintf(format, args...))
}

// runOf is the run id of a case.
func (s *suite) runOf(c call) string {
	return "conf-" + s.stamp + "-" + strings.ReplaceAll(c.name, "_", "-")
}

// The runs of the poison message and of the call whose subject and data disagree.
func (s *suite) poisonRun() string { return "conf-" + s.stamp + "-poison" }
func (s *suite) mismatchRuns() []string {
	return []string{"conf-" + s.stamp + "-mismatch", "conf-" + s.stamp + "-mismatch-other"}
}

func (s *suite) recordPublished(m *nats.Msg) {
	var tf toolbus.ToolFinished
	_, _ = events.Decode(m, &tf)
	s.mu.Lock()
	k := tf.RunID + "/" + strconv.Itoa(tf.Step) + "/" + tf.CallID
	s.published[k] = append(s.published[k], m)
	s.mu.Unlock()
}

// checkCatalog checks the tool's contract and that a live instance serves it; false
// when there is none (nothing else can be checked).
func (s *suite) checkCatalog() bool {
	ctx, bus, tool := s.ctx, s.bus, s.cfg.Tool
	if err := poll(ctx, func() error {
		cs, err := bus.Store().Contracts(ctx)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(cs, func(c toolbus.ToolContract) bool { return c.Name == tool }) {
			return fmt.Errorf("no %s in the catalog (KV %s)", tool, store.BucketTools)
		}
		ins, err := bus.Store().Instances(ctx)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(ins, func(in store.Instance) bool { return slices.Contains(in.Tools, tool) }) {
			return fmt.Errorf("no live instance serving %s (KV %s)", tool, store.BucketInstances)
		}
		return nil
	}); err != nil {
		s.fail("catalog: %v", err)
		return false
	}
	checkContract(ctx, bus, tool, s.fail)
	return true
}

// requestAll publishes every case, the poison message and the call whose subject and
// data name different runs.
func (s *suite) requestAll() error {
	ctx, bus, tool := s.ctx, s.bus, s.cfg.Tool
	long := 2*s.cfg.AckWait + s.cfg.AckWait/2
	s.calls = []call{
		{name: "valid", args: `{"ms":1}`, wantStatus: toolbus.StatusSucceeded},
		{name: "malformed", args: `{"ms":`, wantStatus: toolbus.StatusRejected, wantCode: toolbus.CodeInvalidArguments},
		{name: "not_an_object", args: `[1]`, wantStatus: toolbus.StatusRejected, wantCode: toolbus.CodeInvalidArguments},
		{name: "schema_violation", args: `{"ms":"soon"}`, wantStatus: toolbus.StatusRejected, wantCode: toolbus.CodeInvalidArguments},
		{name: "unknown_argument", args: `{"ms":1,"bogus":true}`, wantStatus: toolbus.StatusRejected, wantCode: toolbus.CodeInvalidArguments},
		{name: "not_allowed", args: `{"ms":1}`, allowed: []string{"some_other_tool"}, wantStatus: toolbus.StatusRejected, wantCode: toolbus.CodeNotAuthorized},
		{name: "deadline", args: `{"ms":600000}`, deadline: time.Now().Add(time.Second), wantStatus: toolbus.StatusTimedOut, wantCode: toolbus.CodeTimeout},
		{name: "cancel", args: `{"ms":600000}`, cancel: true, wantStatus: toolbus.StatusCancelled, wantCode: toolbus.CodeCancelled},
		{name: "long", args: fmt.Sprintf(`{"ms":%d}`, long.Milliseconds()), long: true, wantStatus: toolbus.StatusSucceeded},
		{name: "squatted", args: `{"ms":1}`, squat: true, wantStatus: toolbus.StatusSucceeded},
		{name: "forged_cancel", args: `{"ms":3000}`, forgedCancel: true, wantStatus: toolbus.StatusSucceeded},
		{name: "run_ended", args: `{"ms":1}`, ended: true, wantStatus: toolbus.StatusCancelled, wantCode: toolbus.CodeRunEnded},
		{name: "taken_over", args: `{"ms":1}`, claimedBy: claimedGone, wantStatus: toolbus.StatusSucceeded, wantAttempt: 2},
		{name: "held", args: `{"ms":1}`, claimedBy: claimedHolder, wantStatus: toolbus.StatusSucceeded, wantAttempt: 2},
	}
	if s.cfg.Accounts {
		s.calls = slices.DeleteFunc(s.calls, func(c call) bool { return c.squat })
		for i := range s.calls {
			if s.calls[i].ended {
				// The run's end reaches a team account as the core's notice, which cancels.
				s.calls[i].wantCode = toolbus.CodeCancelled
			}
		}
	}
	s.heldSince = time.Now()
	for _, c := range s.calls {
		if err := request(ctx, bus, s.runOf(c), tool, c, func() error { return s.prepare(c) }); err != nil {
			return err
		}
	}
	// Poison: not a CloudEvent, on the tool's queue. The executor terminates it and goes on.
	if _, err := bus.JetStream().Publish(ctx, events.SubjectToolRequested(s.poisonRun(), tool), []byte("not json at all")); err != nil {
		return fmt.Errorf("conformance: %w", err)
	}
	// Subject and body disagree: a call on this run's subject whose data names another
	// (started) run. The executor must run nothing and publish no result for either.
	mismatch := s.mismatchRuns()
	for _, run := range mismatch {
		if err := bus.StartRun(ctx, events.Source("conformance", "suite"), toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: "conformance"}}); err != nil {
			return fmt.Errorf("conformance: %w", err)
		}
	}
	forgedCall := events.ToolRequestedEvent(events.Source("planner", "conformance"), toolbus.ToolRequested{RunID: mismatch[1], Step: 0,
		CallIndex: 0, CallCount: 1, Call: toolbus.ToolCall{CallID: "mismatch", Tool: tool, Arguments: `{"ms":1}`}}, true)
	if _, err := bus.Publish(ctx, events.SubjectToolRequested(mismatch[0], tool), forgedCall.Meta, forgedCall.Data); err != nil {
		return fmt.Errorf("conformance: %w", err)
	}
	return nil
}

// prepare records what a case needs before its call, once its run started: the run
// ended (its outcome published, as the planner does, and its run state), or the call
// claimed by another executor (gone, or alive until releaseHeld).
func (s *suite) prepare(c call) error {
	ctx, run := s.ctx, s.runOf(c)
	if c.ended {
		kv, err := s.bus.JetStream().KeyValue(ctx, store.BucketRuns)
		if err != nil {
			return fmt.Errorf("conformance: %w", err)
		}
		now := time.Now().UTC()
		outcome := toolbus.RunEnded{RunID: run, Status: toolbus.RunCompleted, Answer: "done"}
		if s.cfg.Accounts {
			// The core sends its notice for a run that ended otherwise than completed
			// (its calls may still run): the run failed, as when the model API refuses.
			outcome = toolbus.RunEnded{RunID: run, Status: toolbus.RunFailed, Reason: "conformance: the model refused", Code: toolbus.CodeModelError}
		}
		state, _ := json.Marshal(store.RunState{RunID: run, Status: outcome.Status, StartedAt: now, UpdatedAt: now})
		if _, err := kv.Put(ctx, run, state); err != nil {
			return fmt.Errorf("conformance: %w", err)
		}
		ended := events.RunEndedEvent(events.Source("planner", "conformance"), 0, outcome)
		if _, err := s.bus.PublishEvent(ctx, ended); err != nil {
			return fmt.Errorf("conformance: %w", err)
		}
		if s.cfg.Accounts {
			if err := s.notifyEnded(run, run, outcome.Status); err != nil {
				return err
			}
		}
	}
	if c.claimedBy == "" {
		return nil
	}
	holder := store.Claim{Team: s.cfg.Team, Instance: "conformance-gone-" + s.stamp, Boot: "b0", Attempt: 1, At: time.Now().UTC()}
	if c.claimedBy == claimedHolder {
		holder.Instance, holder.Boot = holderName(s), holderBoot
		now := time.Now().UTC()
		if _, err := s.bus.Store().PutInstance(ctx, store.Instance{Team: s.cfg.Team, Name: holder.Instance, Boot: holderBoot, Tools: []string{"conformance-holder"},
			Concurrency: 1, StartedAt: now, HeartbeatAt: now}); err != nil {
			return fmt.Errorf("conformance: %w", err)
		}
		// Renewed until releaseHeld stops the renewals and removes it (the bucket would
		// forget it one TTL after the last write).
		s.holderStop, s.holderDone = make(chan struct{}), make(chan struct{})
		go func() {
			defer close(s.holderDone)
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-s.holderStop:
					return
				case <-ctx.Done():
					return
				case <-t.C:
				}
				now := time.Now().UTC()
				_, _ = s.bus.Store().PutInstance(ctx, store.Instance{Team: s.cfg.Team, Name: holder.Instance, Boot: holderBoot, Tools: []string{"conformance-holder"},
					Concurrency: 1, StartedAt: now, HeartbeatAt: now})
			}
		}()
	}
	if _, _, err := s.bus.Store().ClaimCall(ctx, events.ToolToken(s.cfg.Tool), run, 0, c.name, holder); err != nil {
		return fmt.Errorf("conformance: claim %s: %w", c.name, err)
	}
	return nil
}

// cancelClaimed cancels the cancel case once it is claimed, and publishes the forged
// cancellation of the forged_cancel case once it is.
func (s *suite) cancelClaimed() error {
	ctx, bus := s.ctx, s.bus
	for _, c := range s.calls {
		if !c.cancel && !c.forgedCancel {
			continue
		}
		run := s.runOf(c)
		if err := poll(ctx, func() error { return claimed(ctx, bus, s.cfg.Tool, run, c.name) }); err != nil {
			s.fail("%s: the call was never claimed, so it never ran: %v", c.name, err)
			continue
		}
		if c.forgedCancel {
			elsewhere := "conf-" + s.stamp + "-elsewhere"
			if s.cfg.Accounts {
				// The notice on the call's run whose body names another run.
				if err := s.notifyEnded(run, elsewhere, toolbus.RunCancelled); err != nil {
					return err
				}
				continue
			}
			forged := events.CancelEvent(events.Source("conformance", "suite"), toolbus.Cancel{RunID: elsewhere, Reason: "forged"})
			if _, err := bus.Publish(ctx, events.SubjectRunCancel(run, ""), forged.Meta, forged.Data); err != nil {
				return err
			}
			continue
		}
		if _, err := bus.PublishCancel(ctx, events.Source("conformance", "suite"), toolbus.Cancel{RunID: run, Reason: "conformance"}); err != nil {
			return err
		}
		if s.cfg.Accounts {
			// What the injector does on the cancel: the core's notice to the tool's executors.
			if err := s.notifyEnded(run, run, toolbus.RunCancelled); err != nil {
				return err
			}
		}
	}
	return nil
}

// releaseHeld checks that the call claimed by a live executor is left alone for two ack
// waits (no result), then removes that executor's instance record: the call must then be
// taken over.
func (s *suite) releaseHeld() error {
	for _, c := range s.calls {
		if c.claimedBy != claimedHolder {
			continue
		}
		run := s.runOf(c)
		select {
		case <-s.ctx.Done():
			return s.ctx.Err()
		case <-time.After(time.Until(s.heldSince.Add(2 * s.cfg.AckWait))):
		}
		if n, err := countStored(s.ctx, s.bus, run); err != nil {
			return err
		} else if n > 0 {
			s.fail("%s: the call ran while the executor that claimed it was alive (its claim's instance record was live)", c.name)
		}
		close(s.holderStop)
		<-s.holderDone // no renewal after the removal
		if err := s.bus.Store().DeleteInstance(s.ctx, s.cfg.Team, holderName(s), holderBoot); err != nil {
			return fmt.Errorf("conformance: %w", err)
		}
	}
	return nil
}

// notifyEnded publishes, as the core (the injector), the notice that run ended for the
// tool under test (events.SubjectRunEndedFor), whose body names body; it returns once the
// server has it, so a call published after it reaches the executor after it.
func (s *suite) notifyEnded(run, body string, status toolbus.RunStatus) error {
	b, err := json.Marshal(events.RunEndedNotice{RunID: body, Status: status})
	if err != nil {
		return fmt.Errorf("conformance: %w", err)
	}
	nc := s.bus.Conn()
	if err := nc.Publish(events.SubjectRunEndedFor(run, s.cfg.Tool), b); err != nil {
		return fmt.Errorf("conformance: run-ended notice: %w", err)
	}
	if err := nc.FlushWithContext(s.ctx); err != nil {
		return fmt.Errorf("conformance: run-ended notice: %w", err)
	}
	return nil
}

func holderName(s *suite) string { return "conformance-holder-" + s.stamp }

// sample reads the tool's queue, keeping the most redeliveries seen.
func (s *suite) sample() (events.ToolQueue, error) {
	q, err := s.bus.ToolQueueInfo(s.ctx, s.cfg.Tool)
	if err == nil {
		s.redelivered = max(s.redelivered, q.Redelivers)
	}
	return q, err
}

// checkResults checks the stored result of every case, then waits for the queue to be
// idle. A live executor acks every call or sends heartbeats while it runs: the queue
// never redelivers a call here (sampled while the results come in and until the queue
// is idle).
func (s *suite) checkResults() {
	ctx, tool := s.ctx, s.cfg.Tool
	for _, c := range s.calls {
		run := s.runOf(c)
		var msg *nats.Msg
		err := poll(ctx, func() error {
			_, _ = s.sample()
			var err error
			msg, err = storedResult(ctx, s.bus, run, tool)
			return err
		})
		if err != nil {
			s.fail("%s: no tool.finished in the stream: %v", c.name, err)
			continue
		}
		checkResult(msg, run, tool, c, s.schema, s.cfg.Accounts, func(format string, args ...any) {
			s.fail(c.name+": "+format, args...)
		})
	}
	// Wait for the queue to be idle (nothing pending, nothing unacknowledged), so a late
	// second result of a redelivered call is counted by checkCounts.
	if err := poll(ctx, func() error {
		q, err := s.sample()
		if err != nil {
			return err
		}
		if q.Pending > 0 || q.InFlight > 0 {
			return fmt.Errorf("queue of %s: %d pending, %d unacknowledged", tool, q.Pending, q.InFlight)
		}
		return nil
	}); err != nil {
		s.fail("the queue never became idle (every call must be acknowledged once its result is stored): %v", err)
	}
	if s.redelivered > 0 {
		s.fail("the queue redelivered %d call(s) while the executor lived: the executor sent no heartbeats (working/InProgress) during a call longer than the ack wait, or did not ack", s.redelivered)
	}
}

// checkProgress checks progress, where the executor reports it: only while the call
// runs (before its result), on the call's subject with data that agrees, in sequence.
func (s *suite) checkProgress() error {
	for _, c := range s.calls {
		n, err := checkProgress(s.ctx, s.bus, s.runOf(c), c.name, func(format string, args ...any) { s.fail(c.name+": "+format, args...) })
		if err != nil {
			return err
		}
		s.rep.Progress += n
	}
	return nil
}

// checkCounts checks exactly one result per call, both published and stored, and none
// for the poison message or the call whose subject and data disagree.
func (s *suite) checkCounts() error {
	ctx, bus := s.ctx, s.bus
	if err := s.checkProgress(); err != nil {
		return err
	}
	for _, c := range s.calls {
		run := s.runOf(c)
		s.mu.Lock()
		n := len(s.published[run+"/0/"+c.name])
		s.mu.Unlock()
		// A squatted result is published twice: once under its id, which the stream
		// drops (the squat holds the id), once under the per-subject guard.
		if n != 1 && !(c.squat && n == 2) {
			s.fail("%s: %d tool.finished published for one call, want exactly 1", c.name, n)
		}
		if stored, err := countStored(ctx, bus, run); err != nil {
			return err
		} else if stored != 1 {
			s.fail("%s: %d tool.finished stored for one call, want exactly 1", c.name, stored)
		}
	}
	if n, err := countStored(ctx, bus, s.poisonRun()); err != nil {
		return err
	} else if n != 0 {
		s.fail("poison: %d tool.finished for a message that is not a CloudEvent", n)
	}
	mismatch := s.mismatchRuns()
	for _, run := range mismatch {
		if n, err := countStored(ctx, bus, run); err != nil {
			return err
		} else if n != 0 {
			s.fail("subject and body disagree: %d tool.finished for a call whose subject names run %s and data run %s (it must be terminated, not run)",
				n, mismatch[0], mismatch[1])
		}
	}
	return nil
}

// start runs the executor with its output captured.
func start(cfg Config, url, instance string) (*exec.Cmd, *testutil.Buffer, error) {
	if len(cfg.Command) == 0 {
		return nil, nil, errors.New("conformance: no executor command")
	}
	cmd := exec.Command(cfg.Command[0], cfg.Command[1:]...)
	cmd.Dir = cfg.Dir
	cmd.Env = append(os.Environ(), "TOOLBUS_NATS_URL="+url, "TOOLBUS_INSTANCE="+instance,
		"TOOLBUS_ACK_WAIT="+cfg.AckWait.String())
	cmd.Env = append(cmd.Env, cfg.Env...)
	out := &testutil.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("conformance: start %v: %w", cfg.Command, err)
	}
	return cmd, out, nil
}

// stop asks the executor to stop (SIGTERM), kills it if it does not, and returns its output.
func stop(cmd *exec.Cmd, out *testutil.Buffer) string {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
	return out.String()
}

// request starts a run and publishes its one call, as client and planner do; before,
// when set, runs between the two.
func request(ctx context.Context, bus *events.Bus, run, tool string, c call, before func() error) error {
	rs := toolbus.RunStarted{RunID: run, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "conformance " + c.name}},
		AllowedTools: c.allowed, Limits: toolbus.Limits{Deadline: c.deadline}, Principal: toolbus.Principal{ID: "conformance"}}
	if err := bus.StartRun(ctx, events.Source("conformance", "suite"), rs); err != nil {
		return fmt.Errorf("conformance: start run %s: %w", run, err)
	}
	if c.squat {
		// What any party allowed to publish on another run's run.started may do.
		id := events.IDToolFinished(run, 0, c.name)
		m := nats.NewMsg(events.SubjectRunStarted(run+"-decoy", "conformance"))
		m.Data = []byte("squat " + id)
		if _, err := bus.JetStream().PublishMsg(ctx, m, jetstream.WithMsgID(id)); err != nil {
			return fmt.Errorf("conformance: squat %s: %w", id, err)
		}
	}
	if before != nil {
		if err := before(); err != nil {
			return err
		}
	}
	tc := toolbus.ToolCall{CallID: c.name, Tool: tool, Arguments: c.args}
	_, err := bus.PublishEvent(ctx, events.ToolRequestedEvent(events.Source("planner", "conformance"),
		toolbus.ToolRequested{RunID: run, Step: 0, CallIndex: 0, CallCount: 1, Call: tc, Deadline: c.deadline,
			Principal: rs.Principal, AllowedTools: c.allowed}, true).
		Traced("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
	if err != nil {
		return fmt.Errorf("conformance: request %s: %w", c.name, err)
	}
	return nil
}

// claimed reports (as nil) whether the executor claimed the call in the claims bucket.
func claimed(ctx context.Context, bus *events.Bus, tool, run, callID string) error {
	kv, err := bus.JetStream().KeyValue(ctx, store.BucketClaims)
	if err != nil {
		return err
	}
	_, err = kv.Get(ctx, store.ClaimKey(events.ToolToken(tool), run, 0, callID))
	return err
}

// storedResult returns the first tool.finished of a run in the stream.
func storedResult(ctx context.Context, bus *events.Bus, run, tool string) (*nats.Msg, error) {
	raw, err := bus.EventStream().GetLastMsgForSubject(ctx, events.SubjectToolFinished(run, tool))
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(raw.Subject)
	m.Header, m.Data = raw.Header, raw.Data
	return m, nil
}

// countStored counts the tool.finished events of a run in the stream.
func countStored(ctx context.Context, bus *events.Bus, run string) (int, error) {
	evs, err := events.ReadEvents(ctx, bus.EventStream(), events.SubjectPrefix+"."+run+".tool.finished.>")
	if err != nil {
		return 0, fmt.Errorf("conformance: %w", err)
	}
	return len(evs), nil
}

// checkProgress checks the tool.progress events of one call's run and returns how
// many there are.
func checkProgress(ctx context.Context, bus *events.Bus, run, callID string, fail func(string, ...any)) (int, error) {
	evs, err := events.ReadEvents(ctx, bus.EventStream(), events.SubjectRun(run))
	if err != nil {
		return 0, err
	}
	n, finished, lastSeq := 0, false, 0
	for _, ev := range evs {
		switch ev.Meta.Type {
		case events.TypeToolFinished:
			finished = true
		case events.TypeToolProgress:
			n++
			if ev.Err != nil {
				fail("tool.progress on %s: %v", ev.Subject, ev.Err)
				continue
			}
			var tp toolbus.ToolProgress
			if err := json.Unmarshal(ev.Data, &tp); err != nil {
				fail("tool.progress data does not decode: %v", err)
				continue
			}
			switch {
			case finished:
				fail("tool.progress %d published after the call's tool.finished: progress is only for a running call", tp.Seq)
			case tp.CallID != callID || tp.Step != 0:
				fail("tool.progress names call %q of step %d, want %q of step 0", tp.CallID, tp.Step, callID)
			case tp.Seq <= lastSeq:
				fail("tool.progress seq %d after %d: want increasing", tp.Seq, lastSeq)
			case ev.Meta.ID != events.IDToolProgress(run, 0, callID, tp.Attempt, tp.Seq):
				fail("tool.progress id %q, want %q", ev.Meta.ID, events.IDToolProgress(run, 0, callID, tp.Attempt, tp.Seq))
			}
			lastSeq = tp.Seq
		}
	}
	return n, nil
}

// checkContract checks the tool's catalog entry.
func checkContract(ctx context.Context, bus *events.Bus, tool string, fail func(string, ...any)) {
	cs, err := bus.Store().Contracts(ctx)
	if err != nil {
		fail("catalog: %v", err)
		return
	}
	for _, c := range cs {
		if c.Name != tool {
			continue
		}
		if c.Description == "" {
			fail("catalog: %s has no description (the model reads it)", tool)
		}
		doc, err := sjs.UnmarshalJSON(bytes.NewReader(c.InputSchema))
		if err != nil {
			fail("catalog: %s input_schema is not JSON: %v", tool, err)
			return
		}
		comp := sjs.NewCompiler()
		if err := comp.AddResource("mem://input.json", doc); err != nil {
			fail("catalog: %s input_schema: %v", tool, err)
			return
		}
		if _, err := comp.Compile("mem://input.json"); err != nil {
			fail("catalog: %s input_schema is not a JSON Schema: %v", tool, err)
		}
	}
}

// checkResult checks one stored tool.finished: attributes, ids, data and outcome.
func checkResult(msg *nats.Msg, run, tool string, c call, schema *sjs.Schema, accounts bool, fail func(string, ...any)) {
	wantID := events.IDToolFinished(run, 0, c.name)
	h := func(k string) string { return msg.Header.Get(k) }
	if accounts {
		// In a team account the message id is keyed by the team's credentials
		// (CONTRACT.md, "Team accounts"): the id, the guard and 22 characters of HMAC, so
		// that no other team can take it first.
		got := h(events.HeaderMsgID)
		if suffix, ok := strings.CutPrefix(got, wantID+events.GuardedIDSeparator); !ok || len(suffix) != 22 {
			fail("header %s = %q, want %q followed by 22 characters keyed by the team's credentials", events.HeaderMsgID, got, wantID+events.GuardedIDSeparator)
		}
		msg.Header.Set(events.HeaderMsgID, wantID)
	}
	if c.squat {
		// Stored under the per-subject guard: the id another message took, plus a random
		// suffix (CONTRACT.md, "A duplicate is the same event").
		if got := h(events.HeaderMsgID); !strings.HasPrefix(got, wantID+events.GuardedIDSeparator) {
			fail("header %s = %q, want %q followed by a random suffix (its id was squatted)", events.HeaderMsgID, got, wantID+events.GuardedIDSeparator)
		}
		msg.Header.Set(events.HeaderMsgID, wantID)
	}
	for k, want := range map[string]string{
		"ce-specversion": "1.0", "ce-type": events.TypeToolFinished, "ce-id": wantID, events.HeaderMsgID: wantID,
		"ce-dataschema": events.DataSchema(events.TypeToolFinished), "ce-subject": c.name, "ce-runid": run,
		"ce-step": "0", "ce-callid": c.name, "ce-callindex": "0", "ce-callcount": "1",
		"Content-Type": events.ContentTypeJSON,
	} {
		if got := h(k); got != want {
			fail("header %s = %q, want %q", k, got, want)
		}
	}
	if !strings.HasPrefix(h("ce-source"), "/toolbus/") {
		fail("ce-source %q is not /toolbus/<component>/<instance>", h("ce-source"))
	}
	if _, err := time.Parse(time.RFC3339Nano, h("ce-time")); err != nil {
		fail("ce-time %q: %v", h("ce-time"), err)
	}
	if want := events.SubjectToolFinished(run, tool); msg.Subject != want {
		fail("subject %s, want %s", msg.Subject, want)
	}
	doc, err := sjs.UnmarshalJSON(bytes.NewReader(msg.Data))
	if err != nil {
		fail("data is not JSON: %v", err)
		return
	}
	if err := schema.Validate(doc); err != nil {
		fail("data does not validate against %s: %v\n%s", events.SchemaFile(events.TypeToolFinished), err, msg.Data)
	}
	var tf toolbus.ToolFinished
	if _, err := events.Decode(msg, &tf); err != nil {
		fail("decode: %v", err)
		return
	}
	if tf.RunID != run || tf.Step != 0 || tf.CallIndex != 0 || tf.CallCount != 1 || tf.CallID != c.name || tf.Tool != tool {
		fail("position or call %+v, want run %s step 0 call 0 of 1, call %s tool %s", tf, run, c.name, tool)
	}
	if tf.Status != c.wantStatus || tf.Code() != c.wantCode {
		fail("status %s code %q (%s), want %s %q", tf.Status, tf.Code(), errMessage(tf.ToolResult), c.wantStatus, c.wantCode)
	}
	if tf.Status == toolbus.StatusSucceeded && tf.Content == "" {
		fail("a succeeded result with no content for the model")
	}
	if tf.Status != toolbus.StatusSucceeded && (tf.Error == nil || tf.Error.Message == "") {
		fail("a %s result without an error message", tf.Status)
	}
	if c.wantAttempt > 0 && tf.Attempt != c.wantAttempt {
		fail("attempt %d, want %d: a call claimed by an executor that is gone is taken over with the next attempt", tf.Attempt, c.wantAttempt)
	}
	if c.long && tf.Attempt != 1 {
		fail("a call longer than two ack waits ran at attempt %d: the executor sent no heartbeats (working/InProgress) and it was redelivered", tf.Attempt)
	}
	if tf.Attempt < 1 || tf.Executor == "" {
		fail("attempt %d executor %q: both are required", tf.Attempt, tf.Executor)
	}
}

func errMessage(r toolbus.ToolResult) string {
	if r.Error == nil {
		return ""
	}
	return r.Error.Message
}

// resultSchema compiles the schema of tool.finished data from the repository's schemas/.
func resultSchema() (*sjs.Schema, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return nil, errors.New("conformance: cannot locate schemas/")
	}
	path := filepath.Join(filepath.Dir(file), "..", "schemas", events.SchemaFile(events.TypeToolFinished))
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("conformance: %w", err)
	}
	defer f.Close()
	doc, err := sjs.UnmarshalJSON(f)
	if err != nil {
		return nil, fmt.Errorf("conformance: %s: %w", path, err)
	}
	c := sjs.NewCompiler()
	id := events.DataSchema(events.TypeToolFinished)
	if err := c.AddResource(id, doc); err != nil {
		return nil, fmt.Errorf("conformance: %w", err)
	}
	return c.Compile(id)
}

// poll retries f until it returns nil or ctx ends (a busy machine may take long).
func poll(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

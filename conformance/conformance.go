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
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	sjs "github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/provision"
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

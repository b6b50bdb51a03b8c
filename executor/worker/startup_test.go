package worker_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/internal/testutil"
)

// countingHandler counts the log records whose message starts with prefix.
type countingHandler struct {
	slog.Handler
	prefix string
	n      *atomic.Int32
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(as)
	return h
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	h.Handler = h.Handler.WithGroup(name)
	return h
}

// TestTeamExecutorWaitsForTheWriteService: in the accounts layout a team's writes go
// through the core's write service, which the injectors run. An executor started before
// any injector (a fleet started in any order) finds nothing answering its instance
// record: it waits and retries, and serves once an injector is up, instead of exiting.
func TestTeamExecutorWaitsForTheWriteService(t *testing.T) {
	srv := eventstest.StartTenantsBare(t, map[string][]string{"alpha": {"calc"}}, nil)
	ctx := eventstest.Context(t, 2*time.Minute)
	core, _, err := provision.Setup(ctx, eventstest.Connect(t, srv, "core"), events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provision.Consumer(ctx, core, provision.ToolConsumerConfig("calc", 0, 0)); err != nil {
		t.Fatal(err)
	}
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "calc", Description: "answers", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(context.Context, json.RawMessage) (any, error) { return "ok", nil }}); err != nil {
		t.Fatal(err)
	}
	var retries atomic.Int32
	log := slog.New(countingHandler{Handler: testutil.Logger().Handler(), prefix: "bus write failed", n: &retries})
	teamBus, err := events.Open(ctx, eventstest.Connect(t, srv, "alpha"), events.Config{APIPrefix: eventstest.TeamAPIPrefix})
	if err != nil {
		t.Fatal(err)
	}
	exec := testutil.Must(executor.New(reg, executor.WithLogger(log), executor.WithInstance("alpha-1")))
	w := testutil.Must(worker.New(teamBus, exec, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "alpha-1", Logger: log, Grace: time.Second}, Team: "alpha"}))
	runCtx, stop := context.WithCancel(ctx)
	ended := make(chan error, 1)
	go func() { ended <- w.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-ended })

	eventstest.Eventually(t, time.Minute, func() error {
		select {
		case err := <-ended:
			ended <- err
			t.Fatalf("the executor gave up before the write service was up: %v", err)
		default:
		}
		if retries.Load() == 0 {
			return errNotYet("the executor has not retried its first write")
		}
		return nil
	})
	intaketest.StartIntake(t, srv)
	eventstest.Eventually(t, time.Minute, func() error {
		_, err := core.Store().Contract(ctx, "calc")
		return err
	})
	select {
	case err := <-ended:
		ended <- err
		t.Fatalf("the executor stopped: %v", err)
	default:
	}
}

type errNotYet string

func (e errNotYet) Error() string { return string(e) }

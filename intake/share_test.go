package intake_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/reads"
)

// TestTenantStreamShare: the event stream is bounded and new runs are refused once it
// holds events.StreamAdmitPercent of its bound. Team alpha floods it with logs (no rate
// bound, so only its share stops it): it is refused at its share with 507 store_full
// naming the share, the stream stays below the admission line, and team beta's log
// and client bob's start are still stored (the controls: alpha's writes up to its share
// were stored too). Without the share alpha filled the stream to its bound.
func TestTenantStreamShare(t *testing.T) {
	const maxBytes, size = 2 << 20, 10_000
	lim := intake.Limits{MaxStartBytes: 64 << 10, StreamShare: intake.StreamShareOf(maxBytes, intake.DefaultStreamSharePercent, time.Hour)}
	srv := intaketest.StartTenantsLimited(t, map[string][]string{"alpha": {"calc"}, "beta": {"search"}},
		map[string][]string{"bob": {"bob"}}, lim)
	ctx := eventstest.Context(t, time.Minute)
	core := eventstest.Connect(t, srv, "core")
	coreBus, _, err := provision.Setup(ctx, core, events.Config{StreamMaxBytes: maxBytes}, provision.WithTools([]string{"calc", "search"}, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = reads.New(coreBus, nil).Serve(rctx) }()
	alpha, beta := eventstest.Connect(t, srv, "alpha"), eventstest.Connect(t, srv, "beta")
	var refused *answer
	stored := 0
	for i := range 2 * maxBytes / size {
		a := write(t, ctx, alpha, events.SubjectToolLog(fmt.Sprintf("r%d", i), "calc"), strings.Repeat("y", size), "")
		if a.Error != nil {
			refused = &a
			break
		}
		stored++
	}
	if refused == nil || refused.Error.Code != 507 || refused.Error.ErrCode != events.WriteStoreFullErrCode || !strings.Contains(refused.Error.Desc, "share") {
		t.Fatalf("alpha's flood of %d logs is not refused store_full at its share: %+v", stored, refused)
	}
	if most := lim.StreamShare.Bytes / size; stored == 0 || int64(stored) > most {
		t.Errorf("alpha stored %d logs of %d bytes, want some and at most its share's %d", stored, size, most)
	}
	t.Logf("alpha stored %d logs, then: %s", stored, refused.Error.Desc)
	if a := write(t, ctx, beta, events.SubjectToolLog("r1", "search"), strings.Repeat("b", size), ""); a.Error != nil || a.Seq == 0 {
		t.Errorf("beta's log beside alpha at its share: %+v", a.Error)
	}
	var bob *events.Bus
	eventstest.Eventually(t, 30*time.Second, func() error {
		var err error
		bob, err = events.Open(ctx, eventstest.Connect(t, srv, "bob"), events.Config{ReadPrefix: events.ReadAPIPrefix("bob")})
		return err
	})
	if err := bob.StartRun(ctx, "test", toolbus.RunStarted{RunID: "bob-1", Principal: toolbus.Principal{ID: "bob"},
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "hi"}}}); err != nil {
		t.Errorf("bob's start beside alpha at its share: %v", err)
	}
	js, err := jetstream.New(core)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, events.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Bytes*100 >= uint64(info.Config.MaxBytes)*events.StreamAdmitPercent {
		t.Errorf("the event stream holds %d of its %d bytes: at the admission line", info.State.Bytes, info.Config.MaxBytes)
	}
	if _, err := s.GetLastMsgForSubject(ctx, events.SubjectRunStarted("bob-1", "bob")); err != nil {
		t.Errorf("bob's start is not stored: %v", err)
	}
}

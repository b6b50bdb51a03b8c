package provision_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
)

// Fair share turned on over an existing deployment stages the calls from then on and
// creates the scheduler's durable; turning it off is refused while a staged call is
// above the last release's low-water mark (its scheduler would never release it), and
// allowed once it was released (the control).
func TestFairShareOnAndOff(t *testing.T) {
	srv := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, time.Minute)
	if _, _, err := provision.Setup(ctx, srv.Conn, events.Config{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := provision.Setup(ctx, srv.Conn, events.Config{FairShare: true}); err != nil {
		t.Fatal(err)
	}
	qs, err := srv.JS.Stream(ctx, events.QueueStreamName(events.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	if d := qs.CachedInfo().Config.Sources[0].SubjectTransforms[0].Destination; d != events.StageDestination {
		t.Fatalf("transform to %q, want %q", d, events.StageDestination)
	}
	if _, err := qs.Consumer(ctx, events.FairConsumer); err != nil {
		t.Fatalf("the scheduler's durable: %v", err)
	}
	if _, err := srv.JS.Publish(ctx, "toolbus.r1.tool.requested.calc", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	var staged uint64
	eventstest.Eventually(t, 30*time.Second, func() error {
		m, err := qs.GetLastMsgForSubject(ctx, events.SubjectStage("calc"))
		if err == nil {
			staged = m.Sequence
		}
		return err
	})
	_, _, err = provision.Setup(ctx, srv.Conn, events.Config{})
	if !errors.Is(err, provision.ErrStagedCallsHeld) {
		t.Fatalf("turning fair share off with a call held: %v, want ErrStagedCallsHeld", err)
	}
	// Released (as the scheduler does, its mark past the staged call): off is allowed.
	rel := nats.NewMsg(events.SubjectQueue("calc"))
	rel.Header.Set(events.FairLowHeader, "99")
	rel.Header.Set(events.FairStagedHeader, "1")
	if _, err := srv.JS.PublishMsg(ctx, rel); err != nil {
		t.Fatal(err)
	}
	if _, _, err := provision.Setup(ctx, srv.Conn, events.Config{}); err != nil {
		t.Fatalf("turning fair share off once staged call %d was released: %v", staged, err)
	}
}

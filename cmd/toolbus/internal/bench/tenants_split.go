package bench

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/fair"
)

// newFair is the scheduler of the -fair rows, with the settings (TOOLBUS_FAIR_*) the
// injector reads.
func newFair(ctx context.Context, bus *events.Bus, log *slog.Logger) (*fair.Scheduler, error) {
	var shares fair.Shares
	if err := envconfig.Process("TOOLBUS", &shares); err != nil {
		return nil, err
	}
	return fair.New(ctx, bus, shares, log)
}

// FairSplit is where a quiet call's schedule-to-start goes with fair share on, p50s in
// ms, from the server's store times: its tool.requested to its staged copy (the queue
// stream's source), staged to released (the scheduler: its pull, and the wait for room
// in the release window), released to the executor's claim (behind the calls released
// before it, then the executor's pull and claim).
type FairSplit struct {
	StagedP50MS   float64 `json:"requested_to_staged_p50_ms"`
	ReleasedP50MS float64 `json:"staged_to_released_p50_ms"`
	ClaimedP50MS  float64 `json:"released_to_claimed_p50_ms"`
}

// fairSplit splits the schedule-to-start of runs (one call each); nil without fair share.
func (tb *tenantBus) fairSplit(ctx context.Context, runs []string) (*FairSplit, error) {
	if on, err := fair.Staging(ctx, tb.bus); err != nil || !on {
		return nil, err
	}
	qs, err := tb.bus.JetStream().Stream(ctx, events.QueueStreamName(tb.bus.Config().Stream))
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, r := range runs {
		want[r] = true
	}
	cons, err := qs.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.QueuePrefix + "." + TenantTool}})
	if err != nil {
		return nil, err
	}
	released, staged := map[string]time.Time{}, map[string]uint64{}
	for done := false; !done; {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			done = md.NumPending == 0
			seq, err := strconv.ParseUint(m.Headers().Get(events.FairStagedHeader), 10, 64)
			if err != nil {
				return nil, nil // not released by a scheduler: no fair share
			}
			if run := m.Headers().Get("ce-" + events.ExtRunID); want[run] {
				released[run], staged[run] = md.Timestamp, seq
			}
		}
		if n == 0 {
			break
		}
	}
	var toStaged, toReleased, toClaimed []time.Duration
	for _, run := range runs {
		if released[run].IsZero() {
			return nil, fmt.Errorf("bench tenants: run %s: no release of its call", run)
		}
		sm, err := qs.GetMsg(ctx, staged[run])
		if err != nil {
			return nil, err
		}
		var requested, claimed time.Time
		for _, src := range []struct{ stream, filter string }{
			{tb.bus.Config().Stream, events.SubjectPrefix + "." + run + ".tool.requested.>"},
			{"KV_" + store.BucketClaims, "$KV." + store.BucketClaims + "." + TenantTool + "." + run + ".>"},
		} {
			got, err := readStored(ctx, tb.bus.JetStream(), src.stream, src.filter)
			if err != nil || len(got) == 0 {
				return nil, fmt.Errorf("bench tenants: run %s: %s: %d stored (%v)", run, src.filter, len(got), err)
			}
			if strings.HasPrefix(src.filter, "$KV.") {
				claimed = got[0].at
			} else {
				requested = got[0].at
			}
		}
		toStaged = append(toStaged, sm.Time.Sub(requested))
		toReleased = append(toReleased, released[run].Sub(sm.Time))
		toClaimed = append(toClaimed, claimed.Sub(released[run]))
	}
	return &FairSplit{StagedP50MS: pct(toStaged, 50), ReleasedP50MS: pct(toReleased, 50), ClaimedP50MS: pct(toClaimed, 50)}, nil
}

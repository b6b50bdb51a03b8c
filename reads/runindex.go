package reads

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// runIndex is the read service's own record of who may see which run, followed from
// the run.started events the stream holds (an ordered consumer on
// events.FilterRunStarted), so that listing an identity's runs costs reads of its own
// runs only: checking every run through the bus's run cache cost a read per run of
// anyone and emptied the injector's cache (issue 54). Visibility is decided as the bus
// decides it (firstRunStarted, NamesDecider): the first run.started of a run id that
// reads as one stands, later ones change nothing.
type runIndex struct {
	nc     *nats.Conn
	stream string
	cons   jetstream.Consumer // the ordered consumer on events.FilterRunStarted

	mu       sync.Mutex
	runs     map[string]indexedRun      // run -> its first run.started
	byID     map[string]map[string]bool // identity -> runs it may see
	seen     uint64                     // the stream sequence the index has read up to
	handled  uint64                     // the messages it has read
	advanced chan struct{}              // closed (and renewed) when seen moves
	pruned   time.Time
}

type indexedRun struct {
	seq      uint64
	deciders []string
}

// pruneEvery is how often the index drops the runs whose first run.started the stream
// no longer holds (its retention): the bus finds no such run either.
const pruneEvery = time.Minute

// startRunIndex follows the run.started events of bus's stream until ctx ends.
func startRunIndex(ctx context.Context, bus *events.Bus) (*runIndex, error) {
	name := bus.EventStream().CachedInfo().Config.Name
	x := &runIndex{nc: bus.Conn(), stream: name, runs: map[string]indexedRun{}, byID: map[string]map[string]bool{},
		advanced: make(chan struct{}), pruned: time.Now()}
	cons, err := bus.JetStream().OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.FilterRunStarted}})
	if err != nil {
		return nil, fmt.Errorf("reads: follow run.started: %w", err)
	}
	x.cons = cons
	cc, err := cons.Consume(func(m jetstream.Msg) { x.add(ctx, m) })
	if err != nil {
		return nil, fmt.Errorf("reads: follow run.started: %w", err)
	}
	context.AfterFunc(ctx, cc.Stop)
	return x, nil
}

// add records a run.started the consumer delivered.
func (x *runIndex) add(ctx context.Context, m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		return
	}
	rs := new(toolbus.RunStarted)
	meta, err := events.Decode(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}, rs)
	ok := err == nil && meta.Type == events.TypeRunStarted && events.CheckSubject(m.Subject(), meta, rs) == nil
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, known := x.runs[rs.RunID]; ok && !known {
		r := indexedRun{seq: md.Sequence.Stream, deciders: append([]string{rs.Principal.ID}, rs.Approvers...)}
		x.runs[rs.RunID] = r
		for _, who := range r.deciders {
			if who == "" {
				continue
			}
			if x.byID[who] == nil {
				x.byID[who] = map[string]bool{}
			}
			x.byID[who][rs.RunID] = true
		}
	}
	x.seen = max(x.seen, md.Sequence.Stream)
	x.handled++
	close(x.advanced)
	x.advanced = make(chan struct{})
	if time.Since(x.pruned) > pruneEvery {
		x.pruned = time.Now()
		go x.prune(ctx)
	}
}

// prune drops the runs whose run.started the stream no longer holds.
func (x *runIndex) prune(ctx context.Context) {
	first, err := x.firstSeq(ctx)
	if err != nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for run, r := range x.runs {
		if r.seq >= first {
			continue
		}
		delete(x.runs, run)
		for _, who := range r.deciders {
			if delete(x.byID[who], run); len(x.byID[who]) == 0 {
				delete(x.byID, who)
			}
		}
	}
}

// visibleRuns returns the runs visible to id, in the order they started, once the
// index has read every run.started the stream held when asked: one request (its
// consumer's info) whatever the number of runs.
func (x *runIndex) visibleRuns(ctx context.Context, id string) ([]string, error) {
	if err := x.caughtUp(ctx); err != nil {
		return nil, err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]string, 0, len(x.byID[id]))
	for run := range x.byID[id] {
		out = append(out, run)
	}
	slices.SortFunc(out, func(a, b string) int { return cmp.Compare(x.runs[a].seq, x.runs[b].seq) })
	return out, nil
}

// caughtUp returns once the index has read every run.started the stream held when it
// was called: those its consumer had delivered then, and the ones pending then.
func (x *runIndex) caughtUp(ctx context.Context) error {
	for {
		info, err := x.cons.Info(ctx)
		if err != nil {
			return fmt.Errorf("reads: run index: %w", err)
		}
		if err := x.wait(ctx, func() bool { return x.seen >= info.Delivered.Stream }); err != nil {
			return err
		}
		if info.NumPending == 0 {
			return nil
		}
		x.mu.Lock()
		from := x.handled
		x.mu.Unlock()
		// The pending ones arrive next; asked again when they do not in a second (some
		// were removed meanwhile, or some of them were already counted in from).
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		err = x.wait(wctx, func() bool { return x.handled >= from+info.NumPending })
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
	}
}

// wait returns once done (called with mu held) holds, or ctx ends.
func (x *runIndex) wait(ctx context.Context, done func() bool) error {
	for {
		x.mu.Lock()
		ok, advanced := done(), x.advanced
		seen := x.seen
		x.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-advanced:
		case <-ctx.Done():
			return fmt.Errorf("reads: run index at %d: %w", seen, ctx.Err())
		}
	}
}

// firstSeq asks the stream for the sequence of its first message.
func (x *runIndex) firstSeq(ctx context.Context) (uint64, error) {
	m, err := x.nc.RequestWithContext(ctx, "$JS.API.STREAM.INFO."+x.stream, nil)
	if err != nil {
		return 0, fmt.Errorf("reads: stream info: %w", err)
	}
	var resp struct {
		State struct {
			FirstSeq uint64 `json:"first_seq"`
		} `json:"state"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return 0, fmt.Errorf("reads: stream info: %w", err)
	}
	if resp.Error != nil {
		return 0, fmt.Errorf("reads: stream info: %w", resp.Error)
	}
	return resp.State.FirstSeq, nil
}

package reads

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
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

	mu       sync.Mutex
	runs     map[string]indexedRun      // run -> its first run.started
	byID     map[string]map[string]bool // identity -> runs it may see
	seen     uint64                     // the stream sequence the index has read up to
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
	close(x.advanced)
	x.advanced = make(chan struct{})
	if time.Since(x.pruned) > pruneEvery {
		x.pruned = time.Now()
		go x.prune(ctx)
	}
}

// prune drops the runs whose run.started the stream no longer holds.
func (x *runIndex) prune(ctx context.Context) {
	first, err := x.streamSeq(ctx, "first_seq")
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
// index has read every run.started the stream held when asked: one request to the
// stream whatever the number of runs.
func (x *runIndex) visibleRuns(ctx context.Context, id string) ([]string, error) {
	last, err := x.streamSeq(ctx, "last_run_started")
	if err != nil {
		return nil, err
	}
	for {
		x.mu.Lock()
		seen, advanced := x.seen, x.advanced
		if seen >= last {
			out := make([]string, 0, len(x.byID[id]))
			for run := range x.byID[id] {
				out = append(out, run)
			}
			slices.SortFunc(out, func(a, b string) int { return cmp.Compare(x.runs[a].seq, x.runs[b].seq) })
			x.mu.Unlock()
			return out, nil
		}
		x.mu.Unlock()
		select {
		case <-advanced:
		case <-ctx.Done():
			return nil, fmt.Errorf("reads: run index at %d of %d: %w", seen, last, ctx.Err())
		}
	}
}

// streamSeq asks the stream (its JetStream API, which answers on any replica count)
// for the sequence of its last run.started ("last_run_started") or its first message
// ("first_seq"); 0 when there is none.
func (x *runIndex) streamSeq(ctx context.Context, what string) (uint64, error) {
	subject, body := "$JS.API.STREAM.MSG.GET."+x.stream, []byte(`{"last_by_subj":"`+events.FilterRunStarted+`"}`)
	if what == "first_seq" {
		subject, body = "$JS.API.STREAM.INFO."+x.stream, nil
	}
	m, err := x.nc.RequestWithContext(ctx, subject, body)
	if err != nil {
		return 0, fmt.Errorf("reads: %s: %w", what, err)
	}
	var resp struct {
		Message struct {
			Seq uint64 `json:"seq"`
		} `json:"message"`
		State struct {
			FirstSeq uint64 `json:"first_seq"`
		} `json:"state"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return 0, fmt.Errorf("reads: %s: %w", what, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return 0, nil
	case resp.Error != nil:
		return 0, fmt.Errorf("reads: %s: %w", what, errors.New(resp.Error.Description))
	case what == "first_seq":
		return resp.State.FirstSeq, nil
	}
	return resp.Message.Seq, nil
}

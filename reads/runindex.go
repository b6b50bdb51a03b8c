package reads

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// runIndex is the read service's own record of who may see which run, read from the
// run.started events the stream holds (events.FilterRunStarted), so that listing an
// identity's runs costs reads of its own runs only: checking every run through the
// bus's run cache cost a read per run of anyone and emptied the injector's cache (issue
// 54). Visibility is decided as the bus decides it (firstRunStarted, NamesDecider): the
// first run.started of a run id that reads as one stands, later ones change nothing.
//
// It reads with the direct gets the injector's credentials already hold (batched where
// the stream or its read mirror serves them, one by one from the stream otherwise), never
// with a consumer: the core's roles may create none on the event stream
// (deploy/nats/permissions.conf), so no credentials need a new grant. Each listing first
// reads what was stored since the last one: one request when nothing was.
type runIndex struct {
	bus *events.Bus
	log *slog.Logger
	// direct is the subject of the batched direct gets of the stream that serves them
	// ("" when none does); exact reports that it is the event stream itself (one replica),
	// whose answer holds everything stored, so nothing is asked of the stream after it.
	direct string
	exact  bool

	mu     sync.Mutex                 // held while the index reads: one reader at a time
	runs   map[string]indexedRun      // run -> its first run.started
	byID   map[string]map[string]bool // identity -> runs it may see
	next   uint64                     // the stream sequence the index reads from next
	pruned time.Time
}

type indexedRun struct {
	seq      uint64
	deciders []string
}

// pruneEvery is how often the index drops the runs whose first run.started the stream
// no longer holds (its retention): the bus finds no such run either.
const pruneEvery = time.Minute

// indexBatch is the most run.started one batched direct get answers.
const indexBatch = 256

// newRunIndex returns the empty index of bus's event stream; it reads at each listing.
func newRunIndex(bus *events.Bus, log *slog.Logger) *runIndex {
	x := &runIndex{bus: bus, log: log, runs: map[string]indexedRun{}, byID: map[string]map[string]bool{}, next: 1, pruned: time.Now()}
	if c := bus.EventStream().CachedInfo().Config; c.AllowDirect {
		x.direct, x.exact = "$JS.API.DIRECT.GET."+c.Name, true
	} else if r := bus.Reader(); r != nil && r.CachedInfo() != nil && r.CachedInfo().Config.AllowDirect {
		x.direct = "$JS.API.DIRECT.GET." + r.CachedInfo().Config.Name // the read mirror
	}
	return x
}

// visibleRuns returns the runs visible to id, in the order they started, once the
// index has read every run.started the stream held when asked.
func (x *runIndex) visibleRuns(ctx context.Context, id string) ([]string, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.catchUp(ctx); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(x.byID[id]))
	for run := range x.byID[id] {
		out = append(out, run)
	}
	slices.SortFunc(out, func(a, b string) int { return cmp.Compare(x.runs[a].seq, x.runs[b].seq) })
	return out, nil
}

// catchUp reads the run.started stored from x.next on (mu held): in batches where
// direct gets are served, then one by one from the event stream itself for what a read
// mirror did not hold yet (or everything, where no direct gets are served).
func (x *runIndex) catchUp(ctx context.Context) error {
	if time.Since(x.pruned) > pruneEvery {
		x.pruned = time.Now()
		x.prune(ctx)
	}
	for x.direct != "" {
		last, more, err := store.DirectBatch(ctx, x.bus.Conn(), x.direct, x.next, events.FilterRunStarted, indexBatch, func(seq uint64, m *nats.Msg) {
			x.add(seq, m.Header.Get(jetstream.SubjectHeader), m.Header, m.Data)
		})
		if last > 0 {
			x.next = last + 1
		}
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("reads: run index from %d: %w", x.next, err)
		}
		if err != nil {
			// The stream stopped serving direct gets (`toolbus init` gave it a read
			// mirror, or replicas): read one by one from now on.
			x.log.Warn("reads: run index: batched direct gets failed, reading run.started one by one from now on", "stream", x.direct, "err", err)
			x.direct = ""
			break
		}
		if !more {
			if x.exact {
				return nil
			}
			break
		}
	}
	for {
		raw, err := events.GetMsg(ctx, x.bus.EventStream(), x.next, events.FilterRunStarted)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reads: run index from %d: %w", x.next, err)
		}
		x.add(raw.Sequence, raw.Subject, raw.Header, raw.Data)
	}
}

// add records the run.started stored at seq (mu held).
func (x *runIndex) add(seq uint64, subject string, h nats.Header, data []byte) {
	x.next = max(x.next, seq+1)
	rs := new(toolbus.RunStarted)
	meta, err := events.Decode(&nats.Msg{Subject: subject, Header: h, Data: data}, rs)
	if err != nil || meta.Type != events.TypeRunStarted || events.CheckSubject(subject, meta, rs) != nil {
		return
	}
	if _, known := x.runs[rs.RunID]; known {
		return
	}
	r := indexedRun{seq: seq, deciders: append([]string{rs.Principal.ID}, rs.Approvers...)}
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

// prune drops the runs whose run.started the stream no longer holds (mu held).
func (x *runIndex) prune(ctx context.Context) {
	first, err := x.firstSeq(ctx)
	if err != nil {
		return
	}
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

// firstSeq asks the stream for the sequence of its first message.
func (x *runIndex) firstSeq(ctx context.Context) (uint64, error) {
	name := x.bus.EventStream().CachedInfo().Config.Name
	m, err := x.bus.Conn().RequestWithContext(ctx, "$JS.API.STREAM.INFO."+name, nil)
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

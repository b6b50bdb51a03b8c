package injector

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/store"
)

// steps groups the changes to one step inside this process: while a write of a step is
// in flight, further changes queue, and the handler that wrote goes on writing the
// queued ones together. It also remembers the last record and revision written, so
// joining a result is one compare-and-set write instead of a read and a write. Other
// injector processes meet on the compare-and-set: a stale revision fails and the record
// is read again.
type steps struct {
	mu sync.Mutex
	m  map[string]*stepQueue
	// window bounds how long a writer gathers the changes of a step still on their way
	// (gather); 0 writes at once.
	window time.Duration
}

type stepQueue struct {
	pending []*change
	running bool
	cached  *cachedStep
	// wake is signalled when a change is queued while the writer gathers (gather).
	wake chan struct{}
}

type change struct {
	apply func(*store.StepState) bool
	done  chan error
	// accounts is set when the change accounts for a call (its result or its wait for
	// approval): the writer counts these while it gathers.
	accounts bool
}

type cachedStep struct {
	st  *store.StepState
	rev uint64
}

func newSteps(window time.Duration) *steps {
	return &steps{m: map[string]*stepQueue{}, window: window}
}

func stepID(run string, step int) string { return run + "." + strconv.Itoa(step) }

// submit queues a change of step id and returns once it is written (or failed). write
// applies a batch to the record (cached is nil when it must be read) and returns the
// record as written. calls is the step's number of calls when the change accounts for
// one of them (a result, a wait for approval), 0 otherwise: a writer whose batch does
// not yet account for every call first gathers, up to s.window, the changes still on
// their way (gather).
func (s *steps) submit(id string, apply func(*store.StepState) bool, calls int,
	write func(batch []func(*store.StepState) bool, cached *cachedStep) (*cachedStep, error)) error {
	c := &change{apply: apply, done: make(chan error, 1), accounts: calls > 0}
	s.mu.Lock()
	q := s.m[id]
	if q == nil {
		if len(s.m) > 8192 {
			s.evictIdle()
		}
		q = &stepQueue{}
		s.m[id] = q
	}
	q.pending = append(q.pending, c)
	if q.running {
		if q.wake != nil {
			select {
			case q.wake <- struct{}{}:
			default:
			}
		}
		s.mu.Unlock()
		return <-c.done
	}
	q.running = true
	for {
		if calls > 1 && s.window > 0 {
			s.gather(q, calls)
		}
		batch := q.pending
		q.pending = nil
		cached := q.cached
		s.mu.Unlock()

		fns := make([]func(*store.StepState) bool, len(batch))
		for i, b := range batch {
			fns[i] = b.apply
		}
		next, err := write(fns, cached)
		for _, b := range batch {
			b.done <- err
		}

		s.mu.Lock()
		q.cached = next
		if err != nil || (next != nil && next.st.Complete()) {
			q.cached = nil // read again next time; a complete step takes no more writes
		}
		if len(q.pending) == 0 {
			q.running = false
			if q.cached == nil {
				delete(s.m, id)
			}
			s.mu.Unlock()
			return <-c.done
		}
	}
}

// gather waits, up to s.window and called with s.mu held (it releases it while it
// waits), until the changes queued for q and those its cached state already holds
// account for all calls of the step. The results of a step's calls usually arrive
// within a few milliseconds of each other: written as they come, a step of K calls costs
// two or three compare-and-set writes of its join state (the first result alone, then
// the ones that queued behind it); gathered, one. The change that completes the step is
// never held (the wait ends when it arrives), so the step settles no later than it
// would have; only the results before it are stored (and acknowledged) up to s.window
// later. A step whose other calls take longer is written after s.window as before.
func (s *steps) gather(q *stepQueue, calls int) {
	var timer *time.Timer
	defer func() {
		q.wake = nil
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		have := 0
		if q.cached != nil {
			have = accounted(q.cached.st)
		}
		for _, c := range q.pending {
			if c.accounts {
				have++
			}
		}
		if have >= calls {
			return
		}
		if timer == nil {
			timer = time.NewTimer(s.window)
			q.wake = make(chan struct{}, 1)
		}
		wake := q.wake
		s.mu.Unlock()
		select {
		case <-wake:
			s.mu.Lock()
		case <-timer.C:
			s.mu.Lock()
			return
		}
	}
}

// accounted is the number of calls of a join state that have a result or wait.
func accounted(st *store.StepState) int {
	n := 0
	for i := range st.CallCount {
		if st.Received.Has(i) || st.Waiting.Has(i) {
			n++
		}
	}
	return n
}

// evictIdle forgets cached steps no handler is writing; called with s.mu held.
func (s *steps) evictIdle() {
	for id, q := range s.m {
		if !q.running {
			delete(s.m, id)
		}
	}
}

// callCache keeps the calls of steps' recorded assistant messages (which never change
// once recorded), so checking a result against its call costs no read. Entries come
// from the step's model.responded event, heard on a core subscription (followCalls:
// call ids and tools only), or from a read of the assistant message (the whole calls);
// the results of a step that arrive together share one read.
//
// It is bounded in two generations: entries go into the current map; when it holds
// callGeneration entries it becomes the old one and the previous old one is dropped, and
// a hit in the old map moves the entry back to the current one. So the steps in flight
// stay, and steps this injector never joins (their results went to another injector)
// or whose events came too late age out. A step's entry is forgotten when its step
// completes or its run ends here. A miss is a read, as before the cache.
type callCache struct {
	mu       sync.Mutex
	cur, old map[string]callEntry
	loading  map[string]*callLoad
}

// callGeneration is the number of entries of one generation of callCache: well above
// the steps in flight at saturation (each takes one entry while its results come in).
const callGeneration = 8192

// callEntry is the calls of one step; full is false when they come from the step's
// model.responded event, which keeps the call ids and tools only (the arguments, up to
// the size of the whole answer, are not needed to check a result).
type callEntry struct {
	calls []toolbus.ToolCall
	full  bool
}

// callLoad is a read of a step's calls in progress.
type callLoad struct {
	done  chan struct{}
	calls []toolbus.ToolCall
	err   error
}

func newCallCache() *callCache {
	return &callCache{cur: map[string]callEntry{}, old: map[string]callEntry{}, loading: map[string]*callLoad{}}
}

// lookup returns the entry of step id; called with c.mu held.
func (c *callCache) lookup(id string) (callEntry, bool) {
	if e, ok := c.cur[id]; ok {
		return e, true
	}
	e, ok := c.old[id]
	if ok {
		delete(c.old, id)
		c.insert(id, e)
	}
	return e, ok
}

// insert stores the entry of step id in the current generation; called with c.mu held.
func (c *callCache) insert(id string, e callEntry) {
	if len(c.cur) >= callGeneration {
		c.old, c.cur = c.cur, make(map[string]callEntry, callGeneration)
	}
	delete(c.old, id)
	c.cur[id] = e
}

// get returns the calls of step id, reading them with read unless they are cached or
// being read already (then it waits for that read). full asks for the whole calls (with
// their arguments): an entry that has only the ids and tools is then read again.
func (c *callCache) get(ctx context.Context, id string, full bool, read func() ([]toolbus.ToolCall, error)) ([]toolbus.ToolCall, error) {
	c.mu.Lock()
	if e, ok := c.lookup(id); ok && (e.full || !full) {
		c.mu.Unlock()
		return e.calls, nil
	}
	if l := c.loading[id]; l != nil {
		c.mu.Unlock()
		select {
		case <-l.done:
			return l.calls, l.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	l := &callLoad{done: make(chan struct{})}
	c.loading[id] = l
	c.mu.Unlock()
	l.calls, l.err = read()
	c.mu.Lock()
	delete(c.loading, id)
	if l.err == nil {
		c.insert(id, callEntry{calls: l.calls, full: true})
	}
	c.mu.Unlock()
	close(l.done)
	return l.calls, l.err
}

// heard stores the calls of step id from its model.responded event, keeping their ids
// and tools only. An entry with the same ids and tools stays as it is (it may hold the
// arguments); a different one is replaced: the planner publishes the recorded answer,
// so the latest event is the record (they differ only if the record itself was lost
// and written again).
func (c *callCache) heard(id string, calls []toolbus.ToolCall) {
	ids := make([]toolbus.ToolCall, len(calls))
	for i, call := range calls {
		ids[i] = toolbus.ToolCall{CallID: call.CallID, Tool: call.Tool}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.lookup(id); ok && slices.EqualFunc(e.calls, ids, func(a, b toolbus.ToolCall) bool {
		return a.CallID == b.CallID && a.Tool == b.Tool
	}) {
		return
	}
	c.insert(id, callEntry{calls: ids})
}

// forget drops the calls of step id (its step completed, or its run ended).
func (c *callCache) forget(id string) {
	c.mu.Lock()
	delete(c.cur, id)
	delete(c.old, id)
	c.mu.Unlock()
}

// len returns the number of cached steps and of reads in progress.
func (c *callCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cur) + len(c.old) + len(c.loading)
}

// resultCache keeps the results this injector stored under their own keys (too large
// for the join state's inline budget) for steps not yet settled (a stored result never
// changes: the first one stands), so settling a step reads back only the results
// another injector stored there. It is consulted only for a call the join state marks
// without an inline result: then the result under its key is the call's.
type resultCache struct {
	mu sync.Mutex
	m  map[string]map[int]*toolbus.ToolResult
}

func newResultCache() *resultCache { return &resultCache{m: map[string]map[int]*toolbus.ToolResult{}} }

func (c *resultCache) put(id string, idx int, r toolbus.ToolResult) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.m[id]
	if m == nil {
		if len(c.m) >= 8192 {
			clear(c.m) // bounded; results reload from the history bucket
		}
		m = map[int]*toolbus.ToolResult{}
		c.m[id] = m
	}
	m[idx] = &r
}

// get returns the cached result of call idx of step id.
func (c *resultCache) get(id string, idx int) (*toolbus.ToolResult, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.m[id][idx]
	return r, ok
}

// forget drops the results of a settled step.
func (c *resultCache) forget(id string) {
	c.mu.Lock()
	delete(c.m, id)
	c.mu.Unlock()
}

package injector

import (
	"context"
	"strconv"
	"sync"

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
}

type stepQueue struct {
	pending []*change
	running bool
	cached  *cachedStep
}

type change struct {
	apply func(*store.StepState) bool
	done  chan error
}

type cachedStep struct {
	st  *store.StepState
	rev uint64
}

func newSteps() *steps { return &steps{m: map[string]*stepQueue{}} }

func stepID(run string, step int) string { return run + "." + strconv.Itoa(step) }

// submit queues a change of step id and returns once it is written (or failed). write
// applies a batch to the record (cached is nil when it must be read) and returns the
// record as written.
func (s *steps) submit(id string, apply func(*store.StepState) bool,
	write func(batch []func(*store.StepState) bool, cached *cachedStep) (*cachedStep, error)) error {
	c := &change{apply: apply, done: make(chan error, 1)}
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
		s.mu.Unlock()
		return <-c.done
	}
	q.running = true
	for {
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

// evictIdle forgets cached steps no handler is writing; called with s.mu held.
func (s *steps) evictIdle() {
	for id, q := range s.m {
		if !q.running {
			delete(s.m, id)
		}
	}
}

// callCache keeps the calls of recently joined steps' assistant messages (which never
// change once recorded), so checking a result against its call costs no read; the
// results of a step that arrive together share one read.
type callCache struct {
	mu      sync.Mutex
	m       map[string][]toolbus.ToolCall
	loading map[string]*callLoad
}

// callLoad is a read of a step's calls in progress.
type callLoad struct {
	done  chan struct{}
	calls []toolbus.ToolCall
	err   error
}

func newCallCache() *callCache {
	return &callCache{m: map[string][]toolbus.ToolCall{}, loading: map[string]*callLoad{}}
}

// get returns the calls of step id, reading them with read unless they are cached or
// being read already (then it waits for that read).
func (c *callCache) get(ctx context.Context, id string, read func() ([]toolbus.ToolCall, error)) ([]toolbus.ToolCall, error) {
	c.mu.Lock()
	if calls, ok := c.m[id]; ok {
		c.mu.Unlock()
		return calls, nil
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
		if len(c.m) >= 4096 {
			clear(c.m) // bounded; entries reload from the history bucket
		}
		c.m[id] = l.calls
	}
	c.mu.Unlock()
	close(l.done)
	return l.calls, l.err
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

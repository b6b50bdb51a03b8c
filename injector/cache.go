package injector

import (
	"hash/maphash"
	"strconv"
	"sync"

	"github.com/toolbus/toolbus/events"
)

// steps serialises the updates of one step inside this process and remembers the last
// record and revision it wrote, so joining a result is one compare-and-set write instead
// of a read and a write, with no conflict between this process's own handlers. Other
// injector processes still meet on the compare-and-set: a stale cached revision fails
// and the record is read again.
type steps struct {
	seed    maphash.Seed
	stripes [64]stripe
}

type stripe struct {
	mu  sync.Mutex
	rec map[string]cachedStep
}

type cachedStep struct {
	rec *events.StepRecord
	rev uint64
}

func newSteps() *steps {
	s := &steps{seed: maphash.MakeSeed()}
	for i := range s.stripes {
		s.stripes[i].rec = map[string]cachedStep{}
	}
	return s
}

func stepID(run string, step int) string { return run + "." + strconv.Itoa(step) }

// lock locks the stripe of a step and returns it; the caller unlocks it.
func (s *steps) lock(id string) *stripe {
	st := &s.stripes[maphash.String(s.seed, id)%uint64(len(s.stripes))]
	st.mu.Lock()
	return st
}

// get returns the cached record (a copy the caller may change) and its revision.
func (st *stripe) get(id string) (*events.StepRecord, uint64, bool) {
	c, ok := st.rec[id]
	if !ok {
		return nil, 0, false
	}
	cp := *c.rec
	cp.Results = append([]*events.ToolResult(nil), c.rec.Results...)
	cp.Waiting = append([]*events.ToolCall(nil), c.rec.Waiting...)
	return &cp, c.rev, true
}

func (st *stripe) put(id string, rec *events.StepRecord, rev uint64) {
	if len(st.rec) > 4096 {
		clear(st.rec) // bounded: records reload from the store
	}
	st.rec[id] = cachedStep{rec: rec, rev: rev}
}

func (st *stripe) drop(id string) { delete(st.rec, id) }

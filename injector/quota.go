package injector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/workerconfig"
)

// Quota bounds what one principal (the identity a client's credentials are bound to,
// the last token of its run.started subject) may start, so that one client cannot
// starve the others. It is checked where a run starts being processed: the injector
// takes the run's first run.started and, instead of asking for step 0, ends the run
// failed with code quota_exceeded (toolbus.CodeQuotaExceeded) and a reason that names
// the bound; nothing else of the run happens, and no other principal's run waits for it.
// Zero fields bound nothing.
//
// The counts are per injector: run.started events are shared out between the injectors
// (one durable), so with N injectors a principal may have up to N times
// MaxRunsInFlight runs in flight and N times StartsPerSecond starts.
type Quota struct {
	// MaxRunsInFlight bounds a principal's runs that have not ended.
	MaxRunsInFlight int
	// StartsPerSecond bounds a principal's new runs per second, with bursts of
	// max(1, StartsPerSecond) runs.
	StartsPerSecond float64
	// MaxStartBytes bounds a run.started's data (JSON bytes).
	MaxStartBytes int
}

// Validate reports a field out of range.
func (q Quota) Validate() error {
	switch {
	case q.MaxRunsInFlight < 0:
		return workerconfig.InvalidField("Quota.MaxRunsInFlight", q.MaxRunsInFlight, "0 (none) or more")
	case q.StartsPerSecond < 0:
		return workerconfig.InvalidField("Quota.StartsPerSecond", q.StartsPerSecond, "0 (none) or more")
	case q.MaxStartBytes < 0:
		return workerconfig.InvalidField("Quota.MaxStartBytes", q.MaxStartBytes, "0 (none) or more")
	}
	return nil
}

// admission applies a Quota per principal.
type admission struct {
	q  Quota
	mu sync.Mutex
	by map[string]*principalQuota
}

// principalQuota is one principal's admitted runs and start rate.
type principalQuota struct {
	mu       sync.Mutex
	limiter  *rate.Limiter
	inFlight map[string]struct{} // runs admitted and not known to have ended
}

func newAdmission(q Quota) *admission {
	return &admission{q: q, by: map[string]*principalQuota{}}
}

// maxQuotaPrincipals bounds the principals an injector remembers: beyond it, those with
// no run in flight are forgotten (their start rate starts afresh).
const maxQuotaPrincipals = 100000

func (a *admission) of(principal string) *principalQuota {
	a.mu.Lock()
	defer a.mu.Unlock()
	pq := a.by[principal]
	if pq == nil && len(a.by) >= maxQuotaPrincipals {
		for p, q := range a.by {
			if q.mu.TryLock() {
				if len(q.inFlight) == 0 {
					delete(a.by, p)
				}
				q.mu.Unlock()
			}
		}
	}
	if pq == nil {
		pq = &principalQuota{inFlight: map[string]struct{}{}}
		if a.q.StartsPerSecond > 0 {
			pq.limiter = rate.NewLimiter(rate.Limit(a.q.StartsPerSecond), max(1, int(a.q.StartsPerSecond)))
		}
		a.by[principal] = pq
	}
	return pq
}

// admit decides whether rs may start; refused, it returns the reason (and no error).
// ended reports whether a run has ended: runs counted in flight are read only when the
// principal is at its bound, to drop those that ended since.
func (a *admission) admit(ctx context.Context, rs toolbus.RunStarted, ended func(context.Context, string) (bool, error)) (string, error) {
	if a == nil || a.q == (Quota{}) {
		return "", nil
	}
	who := rs.Principal.ID
	name := who
	if name == "" {
		name = "(none)"
	}
	if a.q.MaxStartBytes > 0 {
		if b, err := json.Marshal(rs); err == nil && len(b) > a.q.MaxStartBytes {
			return fmt.Sprintf("run.started of principal %s is %d bytes, over the bound of %d (TOOLBUS_MAX_START_BYTES)",
				name, len(b), a.q.MaxStartBytes), nil
		}
	}
	pq := a.of(who)
	pq.mu.Lock()
	defer pq.mu.Unlock()
	if _, again := pq.inFlight[rs.RunID]; again {
		return "", nil // admitted before (a redelivery)
	}
	if a.q.MaxRunsInFlight > 0 && len(pq.inFlight) >= a.q.MaxRunsInFlight {
		for run := range pq.inFlight {
			done, err := ended(ctx, run)
			if err != nil {
				return "", err
			}
			if done {
				delete(pq.inFlight, run)
			}
		}
		if len(pq.inFlight) >= a.q.MaxRunsInFlight {
			return fmt.Sprintf("principal %s has %d runs in flight, its bound (TOOLBUS_MAX_RUNS_IN_FLIGHT=%d): start this run again once one ended",
				name, len(pq.inFlight), a.q.MaxRunsInFlight), nil
		}
	}
	if pq.limiter != nil && !pq.limiter.Allow() {
		return fmt.Sprintf("principal %s starts more than %g runs per second (TOOLBUS_STARTS_PER_SECOND): start this run again later",
			name, a.q.StartsPerSecond), nil
	}
	if a.q.MaxRunsInFlight > 0 {
		pq.inFlight[rs.RunID] = struct{}{}
	}
	return "", nil
}

// admitted applies the quota to a new run: refused, the run ends failed with code
// quota_exceeded and admitted returns false.
func (in *Injector) admitted(ctx context.Context, rs toolbus.RunStarted) (bool, error) {
	why, err := in.room.check(ctx, in.bus)
	if err == nil && why == "" {
		why, err = in.quota.admit(ctx, rs, in.hasEnded)
	}
	if err != nil || why == "" {
		return err == nil, err
	}
	return false, in.end(ctx, 0, toolbus.RunEnded{RunID: rs.RunID, Status: toolbus.RunFailed, Code: toolbus.CodeQuotaExceeded, Reason: why})
}

// hasEnded reports whether run has ended (or its state is gone).
func (in *Injector) hasEnded(ctx context.Context, run string) (bool, error) {
	st, _, err := in.bus.Store().RunState(ctx, run)
	if errors.Is(err, events.ErrRunNotFound) {
		return true, nil // its state is gone: it ended long ago
	}
	if err != nil {
		return false, err
	}
	return st.Status.Terminal(), nil
}

// storeRoom refuses new runs while the event stream holds StreamAdmitPercent of its
// byte bound, reading the stream's info at most once per storeRoomRecheck. A stream
// without a bound (as the injector opened it) costs nothing.
type storeRoom struct {
	// every is how often the stream's fill is read again (storeRoomRecheck).
	every      time.Duration
	mu         sync.Mutex
	checked    time.Time
	bytes, max int64
}

// storeRoomRecheck is how often the stream's fill is read again.
const storeRoomRecheck = time.Second

func (r *storeRoom) check(ctx context.Context, bus *events.Bus) (string, error) {
	s := bus.EventStream()
	if s == nil || s.CachedInfo() == nil || s.CachedInfo().Config.MaxBytes <= 0 {
		return "", nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) >= r.every {
		info, err := s.Info(ctx)
		if err != nil {
			return "", fmt.Errorf("injector: event stream info: %w", err)
		}
		r.checked, r.bytes, r.max = time.Now(), int64(info.State.Bytes), info.Config.MaxBytes
	}
	if r.max > 0 && r.bytes*100 >= r.max*events.StreamAdmitPercent {
		return fmt.Sprintf("the event stream %s holds %d of its %d bytes (TOOLBUS_STREAM_MAX_BYTES): new runs are refused above %d%% so that the runs in flight can finish; raise the bound or shorten TOOLBUS_RETENTION",
			s.CachedInfo().Config.Name, r.bytes, r.max, events.StreamAdmitPercent), nil
	}
	return "", nil
}

// decisionSize terminates an approval, denial or cancel over events.MaxDecisionBytes
// unapplied (a poison error naming the bound).
func decisionSize(data any) error {
	switch data.(type) {
	case *toolbus.Approval, *toolbus.Cancel:
		return events.DecisionSize(data)
	}
	return nil
}

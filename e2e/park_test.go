package e2e_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/executor/worker"
)

// queueParks counts, per consumer, how often an executor's queues parked and pulled
// again (consume.ParkObserver).
type queueParks struct {
	mu     sync.Mutex
	parked map[string]int
	pulled map[string]int
}

func newQueueParks() *queueParks {
	return &queueParks{parked: map[string]int{}, pulled: map[string]int{}}
}

func (*queueParks) Serving([]string)   {}
func (*queueParks) Stopped([]string)   {}
func (*queueParks) Redelivered(string) {}
func (*queueParks) Terminated(string)  {}
func (p *queueParks) Parked(consumer string, parked bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if parked {
		p.parked[consumer]++
	} else {
		p.pulled[consumer]++
	}
}

// waitParked waits until each tool's queue parked more often than it was asked to
// before (n: the parks counted then) and the server holds no pull for it.
func (p *queueParks) waitParked(t *testing.T, s *stack, n map[string]int, tools ...string) map[string]int {
	t.Helper()
	now := map[string]int{}
	eventstest.Eventually(t, 30*time.Second, func() error {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, tool := range tools {
			name := events.ToolConsumer(tool)
			if p.parked[name] <= n[name] || p.parked[name] != p.pulled[name]+1 {
				return fmt.Errorf("%s parked %d times (%d before), pulled again %d times", name, p.parked[name], n[name], p.pulled[name])
			}
			ci, err := s.bus.QueueStream().Consumer(s.ctx, name)
			if err != nil {
				return err
			}
			info, err := ci.Info(s.ctx)
			if err != nil || info.NumWaiting != 0 {
				return fmt.Errorf("the server holds %d pulls for the parked queue %s (%v)", info.NumWaiting, name, err)
			}
			now[name] = p.parked[name]
		}
		return nil
	})
	return now
}

var _ consume.ParkObserver = (*queueParks)(nil)

// With the executor role's credentials (auth-users.conf), the executor's idle queues
// park: the server accepts their doorbells (no permission violation) and holds no pull
// for them. A run started while they are parked calls both tools, their doorbells ring,
// and the run completes with one result per call; the queues park again afterwards.
func TestIdleQueuesParkWithRoleCredentials(t *testing.T) {
	t.Parallel()
	pw, vars := newPasswords()
	srv := startConfigured(t, "auth-users.conf", vars)
	opts := map[string][]nats.Option{}
	for _, role := range allRoles {
		opts[role] = []nats.Option{nats.UserInfo(role, pw[role])}
	}
	s := &secured{newSecuredStack(t, srv.ClientURL(), opts, secRoles, secModel())}
	parks := newQueueParks()
	s.startExecutor("park-executor", worker.Config{ParkAfter: 300 * time.Millisecond, Observer: parks})
	s.startPlanner("park-planner")
	s.startInjector("park-injector")
	// secModel: step 0 calls a (noop) and b (calculator), step 1 answers.
	n := parks.waitParked(t, s.stack, nil, "noop", "calculator")
	for i := range 2 {
		run := fmt.Sprintf("parked-%d", i)
		s.start(run, toolbus.Limits{Deadline: time.Now().Add(5 * time.Minute).UTC()})
		s.waitOutcome(run, toolbus.RunCompleted)
		for _, id := range []string{"a", "b"} {
			if r := s.result(run, id); r.Status != toolbus.StatusSucceeded {
				t.Fatalf("%s call %s: %+v", run, id, r)
			}
		}
		n = parks.waitParked(t, s.stack, n, "noop", "calculator")
	}
	if v := s.viol.all(); len(v) > 0 {
		t.Fatalf("permission violations: %v", v)
	}
}

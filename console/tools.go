package console

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sort"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// The tools page: what an operator asks first. Each tool of the catalog with its
// contract (owner, version, approval, limits), its queue (the durable consumer of its
// requests: pending calls not yet delivered, calls delivered and not yet acknowledged,
// redeliveries), the executor instances that serve it with their heartbeats, and the
// calls of active runs that are running or wait for a decision. Every read is a direct
// get but the queue's, which is a consumer info request ($JS.API.CONSUMER.INFO.TOOLBUS.*,
// which the client role has): nothing is created on the server.

// consoleMaxActiveScan bounds the active runs whose calls the tools page reads.
const consoleMaxActiveScan = 100

// toolView is one tool on the tools page.
type toolView struct {
	toolbus.ToolContract
	Queue events.ToolQueue
	// QueueErr says why the queue could not be read ("" when it was).
	QueueErr  string
	Instances []string
	Calls     []openCall
}

// instanceView is one executor instance.
type instanceView struct {
	store.Instance
	// Heartbeat is how long ago the instance last said it was alive.
	Heartbeat string
}

// openCall is a call of an active run without a result: running or waiting.
type openCall struct {
	Run, CallID, Tool, State string
	Step                     int
	Since                    time.Time
}

// toolsView is the tools page.
type toolsView struct {
	Tools     []*toolView
	Instances []instanceView
	// Calls are the open calls of tools the catalog does not list.
	Unlisted []openCall
	// Scanned is false when more active runs exist than the page reads.
	Partial bool
}

func (c *server) toolsPage(w http.ResponseWriter, r *http.Request) {
	var view toolsView
	if err := c.hub.read(r.Context(), func(ctx context.Context) error {
		var err error
		view, err = c.tools(ctx, time.Now(), viewerOf(r))
		return err
	}); err != nil {
		c.fail(w, err)
		return
	}
	c.render(w, "tools.html", c.pageData(r, map[string]any{"V": view}))
}

// tools joins the catalog, the instances, the queues and the open calls, of the tools,
// instances and runs the viewer sees (tenancy.go).
func (c *server) tools(ctx context.Context, now time.Time, v viewer) (toolsView, error) {
	var view toolsView
	contracts, err := c.bus.Contracts(ctx)
	if err != nil {
		return view, err
	}
	instances, err := c.bus.Instances(ctx)
	if err != nil {
		return view, err
	}
	sort.Slice(instances, func(i, j int) bool { return instances[i].Name < instances[j].Name })
	instances = slices.DeleteFunc(instances, func(in store.Instance) bool { return !v.seesTeam(in.Team) })
	for _, in := range instances {
		view.Instances = append(view.Instances, instanceView{Instance: in, Heartbeat: audit.Age(now.Sub(in.HeartbeatAt))})
	}
	byName := map[string]*toolView{}
	for _, tc := range contracts {
		if !v.seesTool(tc.Owner) {
			continue
		}
		tv := &toolView{ToolContract: tc, Instances: []string{}}
		for _, in := range instances {
			if in.Serves(tc.Owner, tc.Name) {
				tv.Instances = append(tv.Instances, in.Name)
			}
		}
		var q events.ToolQueue
		var err error
		if !c.bus.ClientAccount() { // a client account is not told the queues
			q, err = c.bus.ToolQueueInfo(ctx, tc.Name)
		}
		switch {
		case errors.Is(err, events.ErrNotFound):
			tv.QueueErr = "no queue: no executor ever served it (toolbus init creates it)"
		case err != nil:
			tv.QueueErr = err.Error()
		}
		tv.Queue = q
		byName[tc.Name] = tv
		view.Tools = append(view.Tools, tv)
	}
	sort.Slice(view.Tools, func(i, j int) bool { return view.Tools[i].Name < view.Tools[j].Name })
	calls, partial, err := c.openCalls(ctx)
	if err != nil {
		return view, err
	}
	view.Partial = partial
	if calls, err = c.visibleCalls(ctx, v, calls); err != nil {
		return view, err
	}
	for _, oc := range calls {
		if tv := byName[oc.Tool]; tv != nil {
			tv.Calls = append(tv.Calls, oc)
		} else if !v.restricted {
			view.Unlisted = append(view.Unlisted, oc)
		}
	}
	return view, nil
}

// openCalls reads the calls without a result of the active runs (the newest
// consoleMaxActiveScan of them; partial when there are more).
func (c *server) openCalls(ctx context.Context) ([]openCall, bool, error) {
	states, err := c.bus.Runs(ctx)
	if err != nil {
		return nil, false, err
	}
	var active []store.RunState
	for _, st := range states {
		if !st.Status.Terminal() {
			active = append(active, st)
		}
	}
	sort.Slice(active, func(i, j int) bool { return active[i].StartedAt.After(active[j].StartedAt) })
	partial := len(active) > consoleMaxActiveScan
	if partial {
		active = active[:consoleMaxActiveScan]
	}
	var out []openCall
	holds := newFairHolds(c.bus)
	for _, st := range active {
		evs, err := c.hub.runEvents(ctx, c.bus, st.RunID)
		if err != nil {
			return nil, false, err
		}
		rep := audit.Analyze(st.RunID, evs)
		times := timesOf(rep)
		at := func(v int64) time.Time { return rep.StartedAt.Add(time.Duration(v) * time.Millisecond) }
		for _, call := range rep.Calls {
			if call.Result != nil {
				continue
			}
			t := times[[2]string{itoa(call.Step), call.CallID}]
			oc := openCall{Run: st.RunID, CallID: call.CallID, Tool: call.Tool, Step: call.Step}
			switch {
			case t != nil && t.execStart() >= 0:
				oc.State, oc.Since = "running", at(t.execStart())
				if q := holds.queued(ctx, rep.Principal, call.Tool, st.RunID, call.Step, call.CallID); q != "" {
					oc.State = q
				}
			case call.Waited && call.Decision == "":
				oc.State = "waiting for approval"
				if t != nil && t.waiting >= 0 {
					oc.Since = at(t.waiting)
				}
			default:
				continue
			}
			out = append(out, oc)
		}
	}
	return out, partial, nil
}

// visibleCalls keeps the open calls of the runs the viewer sees.
func (c *server) visibleCalls(ctx context.Context, v viewer, calls []openCall) ([]openCall, error) {
	if !v.restricted {
		return calls, nil
	}
	vis, err := c.visibilityOf(ctx, v)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []openCall
	for _, oc := range calls {
		ok, known := seen[oc.Run]
		if !known {
			if ok, err = vis.sees(ctx, oc.Run); err != nil {
				return nil, err
			}
			seen[oc.Run] = ok
		}
		if ok {
			out = append(out, oc)
		}
	}
	return out, nil
}

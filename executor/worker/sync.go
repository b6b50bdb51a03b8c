package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/executor"
)

// The served tools: which tools this worker serves now, their contracts in the catalog,
// and Sync, which brings them in line with the registry at run time.

// Sync brings a running worker in line with its registry after tools were registered or
// unregistered at run time (tool providers such as MCP servers whose tool lists change):
// each new tool gets its queue and its contract in the catalog, and the instance record
// lists exactly the registered tools, so the planner stops offering removed ones at once.
// A worker limited to Config.Tools serves that fixed subset and ignores Sync.
// Sync before Run, or after Run returned, does nothing.
//
// Calls keep running while Sync talks to the bus: the read lock that every call takes
// is held only to read and to swap the set of served tools, never across network I/O.
func (w *Worker) Sync(ctx context.Context) error {
	if len(w.cfg.Tools) > 0 {
		return nil
	}
	w.syncMu.Lock() // one Sync at a time: each computes its changes from the last one's result
	defer w.syncMu.Unlock()
	w.smu.RLock()
	runCtx, serveCfg, serving, unreachable := w.runCtx, w.serveCfg, w.serving, w.unreachable
	w.smu.RUnlock()
	if runCtx == nil || runCtx.Err() != nil {
		return nil
	}
	// A tool whose queue the credentials no longer reach stays out until it does.
	names := slices.DeleteFunc(w.exec.Registry().Names(), func(n string) bool { return slices.Contains(unreachable, n) })
	var added []string
	for _, name := range names {
		t, ok := w.exec.Registry().Lookup(name)
		if !ok {
			continue
		}
		// Publishing every contract again also covers a tool whose schema changed.
		if err := w.publishTool(ctx, t); err != nil {
			return err
		}
		if !serving[name] { // serving is replaced, never modified: reading it unlocked is safe
			added = append(added, name)
		}
	}
	for _, name := range added {
		cons, err := w.queue(ctx, name)
		if err != nil {
			return err
		}
		w.extra.Go(func() {
			if err := consume.ServeAll(runCtx, []jetstream.Consumer{cons}, serveCfg, w.handle); err != nil {
				w.log.Error("queue stopped", "tool", name, "error", err)
			}
		})
	}
	next := make(map[string]bool, len(names))
	for _, n := range names {
		next[n] = true
	}
	w.smu.Lock()
	w.serving, w.servedList = next, names
	registered := w.exec.Registry().Names()
	w.unreachable = slices.DeleteFunc(slices.Clone(w.unreachable), func(n string) bool { return !slices.Contains(registered, n) })
	w.smu.Unlock()
	now := time.Now().UTC()
	in := store.Instance{Team: w.cfg.Team, Name: w.cfg.Instance, Boot: w.boot, Tools: names, Concurrency: w.cfg.Concurrency,
		StartedAt: now, HeartbeatAt: now}
	if err := w.writeLater(ctx, "record the instance's tools", func() error {
		_, err := w.bus.Store().PutInstance(ctx, in)
		return err
	}); err != nil {
		return err
	}
	w.log.Info("executor tools changed", "tools", names, "added", added)
	return nil
}

// publishTool offers t's contract, with this worker's team as owner, to the catalog. A
// refusal (the registered contract differs) is logged and counted here and returned.
func (w *Worker) publishTool(ctx context.Context, t executor.Tool) error {
	c := t.Contract()
	c.Owner = w.cfg.Team
	pctx, done := w.bus.Guard(ctx, "$KV.")
	err := done(w.writeLater(pctx, "publish the contract of "+t.Name, func() error {
		return w.bus.Store().PublishTool(pctx, c, w.cfg.ReplaceContracts)
	}))
	var changed *store.ContractChangedError
	if errors.As(err, &changed) {
		w.cfg.Metrics.ContractRefused(t.Name)
		w.log.Error("tool contract refused: the catalog holds a different contract for this tool",
			"tool", t.Name, "registered_owner", changed.Registered.Owner, "registered_version", changed.Registered.Version,
			"offered_owner", c.Owner, "offered_version", c.Version)
		return fmt.Errorf("executor: %w", err)
	}
	return err
}

// serves reports whether this worker serves tool now.
func (w *Worker) serves(tool string) bool {
	w.smu.RLock()
	defer w.smu.RUnlock()
	return w.serving[tool]
}

// servedTools returns the tools this worker serves now.
func (w *Worker) servedTools() []string {
	w.smu.RLock()
	defer w.smu.RUnlock()
	return w.servedList
}

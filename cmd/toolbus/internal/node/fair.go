package node

import (
	"context"
	"log/slog"
	"time"

	"github.com/sourcegraph/conc"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/fair"
)

// fairCheckEvery is how often an injector whose queue stream does not stage calls looks
// again: `toolbus init` may turn fair share on while it runs.
const fairCheckEvery = 10 * time.Second

// startFair runs the fair scheduler beside the injector once the queue stream stages
// calls (docs/fair-share.md), as long as the injector's services live. A staging queue
// stream with no scheduler would run no call, so the injector looks again now and then
// when it does not stage yet, and a scheduler that cannot start fails the injector.
func startFair(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger, wg *conc.WaitGroup) error {
	staging, err := fair.Staging(ctx, bus)
	if err != nil {
		return err
	}
	run := func() error {
		s, err := fair.New(ctx, bus, cfg.Shares, log)
		if err != nil {
			return err
		}
		wg.Go(func() {
			if err := s.Run(ctx); err != nil {
				log.Error("fair scheduler stopped: staged calls wait until an injector runs it again", "err", err)
			}
		})
		return nil
	}
	if staging {
		return run()
	}
	wg.Go(func() {
		t := time.NewTicker(fairCheckEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if on, err := fair.Staging(ctx, bus); err == nil && on {
				log.Info("the queue stream stages calls now: starting the fair scheduler")
				if err := run(); err != nil {
					log.Error("fair scheduler not started", "err", err)
				}
				return
			}
		}
	})
	return nil
}

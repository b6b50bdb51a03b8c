package node

import (
	"context"
	"log/slog"

	"github.com/sourcegraph/conc"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/fair"
)

// startFair runs the fair scheduler beside the injector when the queue stream stages
// calls (docs/fair-share.md): it lives as long as the injector's services. A staging
// queue stream with no scheduler would run no call, so failing to start it fails the
// injector.
func startFair(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger, wg *conc.WaitGroup) error {
	staging, err := fair.Staging(ctx, bus)
	if err != nil || !staging {
		return err
	}
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

package node

import (
	"context"
	"log/slog"
	"time"

	"github.com/sourcegraph/conc"

	"github.com/toolbus/toolbus/audit/checkpoint"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/telemetry"
)

// CheckpointInterval is how often the injector signs a checkpoint of the event stream
// while it grows (it also signs one at every run's end).
const CheckpointInterval = time.Minute

// startCheckpoints runs the core's checkpoints (audit/checkpoint) beside the injector
// of a process that signs (TOOLBUS_SIGNING_KEY); a failure of theirs ends nothing else.
// Its metrics (nil: none) show a stop (telemetry.Metrics.CheckpointsRefused).
func startCheckpoints(ctx context.Context, bus *events.Bus, log *slog.Logger, tel *telemetry.Metrics, wg *conc.WaitGroup) {
	if bus.Signer() == nil {
		return
	}
	svc := &checkpoint.Service{Bus: bus, Interval: CheckpointInterval, Log: log}
	if tel != nil {
		svc.Metrics = tel
	}
	wg.Go(func() {
		if err := svc.Run(ctx); err != nil {
			log.Warn("checkpoints stopped", "err", err)
		}
	})
}

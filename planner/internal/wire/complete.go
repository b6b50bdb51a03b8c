package wire

import (
	"context"
	"log/slog"

	"github.com/toolbus/toolbus/planner"
)

// Complete asks a provider for one answer under the adapter's retry policy (ask is one
// attempt), and names the model of an answer that names none: the one asked for. The
// one home of both for every adapter.
func Complete(ctx context.Context, retry planner.RetryPolicy, log *slog.Logger, model string, ask func(context.Context) (planner.Response, error)) (planner.Response, error) {
	var resp planner.Response
	err := retry.Do(ctx, log, func(ctx context.Context) error {
		var err error
		resp, err = ask(ctx)
		return err
	})
	if err != nil {
		return planner.Response{}, err
	}
	if resp.Model == "" {
		resp.Model = model
	}
	return resp, nil
}

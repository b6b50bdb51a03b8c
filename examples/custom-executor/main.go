// Command custom-executor is an executor of your own: one tool, served beside the
// toolbus fleet from the same TOOLBUS_* configuration (see "Deploy your own tools" in
// docs/writing-tools.md). Run it with TOOLBUS_NATS_URL pointing at the toolbus NATS server.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	// Traces over OTLP when OTEL_* ask for them; without this import the program links
	// no exporter and no gRPC (a smaller binary), and OTEL_* tracing is refused.
	_ "github.com/toolbus/toolbus/telemetry/otlp"
)

// In is the tool's input; its JSON Schema is derived from the type.
type In struct {
	Text string `json:"text" jsonschema:"minLength=1,description=the text to shout"`
}

// Out is the tool's output.
type Out struct {
	Shout string `json:"shout"`
	Key   string `json:"idempotency_key"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	reg := executor.NewRegistry()
	err := executor.RegisterFunc(reg, executor.Tool{Name: "shout", Description: "Upper-cases a text.", ReadOnly: true},
		func(ctx context.Context, in In) (Out, error) {
			ci, _ := executor.CallInfoFrom(ctx) // run, step, call id, principal, idempotency key
			return Out{Shout: strings.ToUpper(in.Text) + "!", Key: ci.IdempotencyKey}, nil
		})
	if err == nil {
		err = worker.Serve(ctx, reg) // until SIGINT/SIGTERM, then drains
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "custom-executor:", err)
		os.Exit(1)
	}
}

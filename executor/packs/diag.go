package packs

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
)

// Limits of the diag pack's tools.
const (
	// MaxSleepMS is the longest sleep the sleep tool accepts (10 minutes).
	MaxSleepMS = 600000
	// MaxBigOutputBytes is the largest output big_output produces (64 MiB).
	MaxBigOutputBytes = 64 << 20
)

// sleepInput is the argument object of the sleep tool.
type sleepInput struct {
	MS int `json:"ms" jsonschema:"description=How long to sleep in milliseconds (0 to 600000),minimum=0,maximum=600000"`
}

// SleepOutput is the result of the sleep tool.
type SleepOutput struct {
	SleptMS int `json:"slept_ms" jsonschema:"description=Milliseconds slept"`
}

// failInput is the argument object of the fail tool.
type failInput struct {
	Code      string `json:"code,omitempty" jsonschema:"description=Error code to fail with (default tool_error)"`
	Retryable bool   `json:"retryable,omitempty" jsonschema:"description=Whether the error is marked retryable"`
	Message   string `json:"message,omitempty" jsonschema:"description=Error message (optional)"`
}

// panicInput is the argument object of the panic tool.
type panicInput struct {
	Message string `json:"message,omitempty" jsonschema:"description=Panic value (optional)"`
}

// counterInput is the argument object of the counter tool.
type counterInput struct {
	Key string `json:"key,omitempty" jsonschema:"description=Counter key used when the call carries no idempotency key"`
}

// CounterOutput is the result of the counter tool.
type CounterOutput struct {
	Key   string `json:"key" jsonschema:"description=The key that was incremented"`
	Count int64  `json:"count" jsonschema:"description=The key's count after this call"`
}

// empty is the result of tools that return an empty object.
type empty struct{}

const (
	bigOutputInputSchema = `{"type":"object","properties":{"bytes":{"type":"integer","minimum":0,"maximum":67108864,` +
		`"description":"Approximate size of the output in bytes (0 to 67108864)"}},"required":["bytes"],"additionalProperties":false}`
	bigOutputOutputSchema = `{"type":"object","properties":{"data":{"type":"string"}},"required":["data"],"additionalProperties":false}`
	badOutputInputSchema  = `{"type":"object","properties":{},"additionalProperties":false}`
	badOutputOutputSchema = `{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"],"additionalProperties":false}`
	noopInputSchema       = `{"type":"object","properties":{"x":{"type":"string","description":"Ignored"}},"additionalProperties":false}`
	noopOutputSchema      = `{"type":"object","properties":{},"additionalProperties":false}`
)

// noopResult is shared by every noop call: returning an existing interface value
// allocates nothing.
var noopResult any = json.RawMessage(`{}`)

var badOutputResult = json.RawMessage(`{"ok":"not-a-bool"}`)

func registerDiag(r *executor.Registry) error {
	steps := []func() error{
		func() error {
			return executor.RegisterFunc(r, executor.Tool{
				Name: "sleep",
				Description: "Diagnostic: wait for the given number of milliseconds, then return {\"slept_ms\": n}. " +
					"Stops early with the call's cancellation or timeout. For tests of timeouts and cancellation.",
				ReadOnly: true,
			}, sleepTool)
		},
		func() error {
			return executor.RegisterFunc(r, executor.Tool{
				Name: "fail",
				Description: "Diagnostic: always fail with the given error code (default tool_error), " +
					"retryable flag and message. For tests of error handling and retries.",
				ReadOnly: true,
			}, failTool)
		},
		func() error {
			return executor.RegisterFunc(r, executor.Tool{
				Name:        "panic",
				Description: "Diagnostic: panic with the given message. For tests of panic recovery; never returns a result.",
				ReadOnly:    true,
			}, panicTool)
		},
		func() error {
			return r.Register(executor.Tool{
				Name: "big_output",
				Description: "Diagnostic: return {\"data\": \"xxx...\"} of about the requested number of bytes " +
					"(up to 64 MiB). For tests of output limits and truncation.",
				InputSchema:  json.RawMessage(bigOutputInputSchema),
				OutputSchema: json.RawMessage(bigOutputOutputSchema),
				ReadOnly:     true,
				Func:         bigOutputTool,
			})
		},
		func() error {
			return r.Register(executor.Tool{
				Name: "bad_output",
				Description: "Diagnostic: return {\"ok\": \"not-a-bool\"}, which violates this tool's own " +
					"output schema (ok must be a boolean). For tests of output validation.",
				InputSchema:  json.RawMessage(badOutputInputSchema),
				OutputSchema: json.RawMessage(badOutputOutputSchema),
				ReadOnly:     true,
				Func: func(context.Context, json.RawMessage) (any, error) {
					return badOutputResult, nil
				},
			})
		},
		func() error {
			return r.Register(executor.Tool{
				Name:         "noop",
				Description:  "Diagnostic: do nothing and return {} at once. For benchmarks of the call path.",
				InputSchema:  json.RawMessage(noopInputSchema),
				OutputSchema: json.RawMessage(noopOutputSchema),
				ReadOnly:     true,
				Func: func(context.Context, json.RawMessage) (any, error) {
					return noopResult, nil
				},
			})
		},
		func() error {
			return executor.RegisterFunc(r, executor.Tool{
				Name: "counter",
				Description: "Diagnostic side effect: increment a process-wide counter and return {\"key\", \"count\"}. " +
					"The counter is the call's idempotency key, or the key argument when the call has none. " +
					"For tests that prove a side-effecting call ran exactly once.",
				ReadOnly: false,
			}, counterTool)
		},
		func() error { return registerConfirm(r) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

func sleepTool(ctx context.Context, in sleepInput) (SleepOutput, error) {
	if in.MS < 0 || in.MS > MaxSleepMS {
		return SleepOutput{}, executor.NewError(toolbus.CodeInvalidArguments,
			fmt.Sprintf("ms must be between 0 and %d, got %d", MaxSleepMS, in.MS))
	}
	if in.MS == 0 {
		return SleepOutput{}, ctx.Err()
	}
	t := time.NewTimer(time.Duration(in.MS) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return SleepOutput{SleptMS: in.MS}, nil
	case <-ctx.Done():
		return SleepOutput{}, ctx.Err()
	}
}

func failTool(_ context.Context, in failInput) (empty, error) {
	code := in.Code
	if code == "" {
		code = toolbus.CodeToolError
	}
	msg := in.Message
	if msg == "" {
		msg = "the fail tool failed as requested (code " + code + ")"
	}
	if in.Retryable {
		return empty{}, executor.NewRetryableError(code, msg)
	}
	return empty{}, executor.NewError(code, msg)
}

func panicTool(_ context.Context, in panicInput) (empty, error) {
	msg := in.Message
	if msg == "" {
		msg = "the panic tool panicked as requested"
	}
	panic(msg)
}

// bigOutputTool returns {"data":"xxx..."} of exactly the requested size when it is at
// least the 11 bytes of {"data":""}, built with one allocation.
func bigOutputTool(_ context.Context, args json.RawMessage) (any, error) {
	var in struct {
		Bytes *int `json:"bytes"`
	}
	if err := json.Unmarshal(args, &in); err != nil || in.Bytes == nil {
		return nil, executor.NewError(toolbus.CodeInvalidArguments, `arguments must be {"bytes": <integer>}`)
	}
	n := *in.Bytes
	if n < 0 || n > MaxBigOutputBytes {
		return nil, executor.NewError(toolbus.CodeInvalidArguments,
			"bytes must be between 0 and "+strconv.Itoa(MaxBigOutputBytes)+", got "+strconv.Itoa(n))
	}
	return BigOutput(n), nil
}

// BigOutput returns the JSON object {"data":"xxx..."} whose encoding is exactly n bytes
// long, or {"data":""} when n is smaller than that.
func BigOutput(n int) json.RawMessage {
	const prefix, suffix = `{"data":"`, `"}`
	fill := max(n-len(prefix)-len(suffix), 0)
	b := make([]byte, len(prefix)+fill+len(suffix))
	copy(b, prefix)
	if fill > 0 {
		x := b[len(prefix) : len(prefix)+fill]
		x[0] = 'x'
		for done := 1; done < fill; done *= 2 {
			copy(x[done:], x[:done])
		}
	}
	copy(b[len(prefix)+fill:], suffix)
	return b
}

// counters is the process-wide state of the counter tool.
var counters struct {
	mu    sync.Mutex
	m     map[string]int64
	total int64
}

func counterTool(ctx context.Context, in counterInput) (CounterOutput, error) {
	key := in.Key
	if ci, ok := executor.CallInfoFrom(ctx); ok && ci.IdempotencyKey != "" {
		key = ci.IdempotencyKey
	}
	if key == "" {
		key = "default"
	}
	counters.mu.Lock()
	if counters.m == nil {
		counters.m = make(map[string]int64)
	}
	counters.m[key]++
	n := counters.m[key]
	counters.total++
	counters.mu.Unlock()
	return CounterOutput{Key: key, Count: n}, nil
}

// CounterValue returns how many times the counter tool has run for key since the last
// ResetCounters. The key is the call's idempotency key, or the key argument of a call
// without one ("default" when both are empty).
func CounterValue(key string) int64 {
	counters.mu.Lock()
	defer counters.mu.Unlock()
	return counters.m[key]
}

// TotalCounter returns how many times the counter tool has run, over all keys, since the
// last ResetCounters.
func TotalCounter() int64 {
	counters.mu.Lock()
	defer counters.mu.Unlock()
	return counters.total
}

// ResetCounters sets every counter of the counter tool back to zero.
func ResetCounters() {
	counters.mu.Lock()
	defer counters.mu.Unlock()
	clear(counters.m)
	counters.total = 0
}

package planner

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// ProviderError is a failed call to a model provider: an HTTP error status, a transport
// failure or an answer that could not be read. Retryable errors (429, 408, 5xx, transport
// errors and timeouts, unreadable answers) are retried by the adapter's RetryPolicy and,
// when the attempts run out, returned as a transient error so the planner retries the step
// later. Other errors reach the planner wrapped by Permanent and fail the run with the
// provider's message.
type ProviderError struct {
	// Provider names the adapter: "openai", "openai-responses" or "anthropic".
	Provider string
	// Status is the HTTP status, 0 when no response arrived.
	Status int
	// Message is the provider's own explanation (its error.message), or a description of
	// the failure.
	Message string
	// RetryAfter is the wait the provider asked for (Retry-After, Retry-After-Ms), if any.
	RetryAfter time.Duration
	// Retryable reports whether another attempt may succeed.
	Retryable bool
	// Err is the underlying error (the SDK's error, a net.Error, a context error).
	Err error
}

// Error reads "<provider>: <status> <status text>: <message>".
func (e *ProviderError) Error() string {
	// No "planner:" prefix: the planner wraps a model error once, with the run and step.
	var b strings.Builder
	b.WriteString(e.Provider)
	if e.Status != 0 {
		fmt.Fprintf(&b, ": %d %s", e.Status, http.StatusText(e.Status))
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	} else if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the underlying error.
func (e *ProviderError) Unwrap() error { return e.Err }

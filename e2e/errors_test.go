package e2e_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/planner/anthropic"
	"github.com/toolbus/toolbus/planner/openai"
)

// TestProvidersRefusalReason runs a step against a provider that refuses every request
// with a 400: the run fails with code model_error and a reason that names the run's
// step and carries the provider's message once, each layer of the error chain adding
// its prefix once (no "planner: ... planner: permanent model error: planner: openai").
func TestProvidersRefusalReason(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.DiscardHandler)
	const refusal = "max_tokens: 100000 > 64000"
	providers := []struct {
		name   string
		fake   func() *providerFake
		model  func(url string) (planner.Model, error)
		prefix string // the provider's own layer
	}{
		{"openai", chatFake, func(url string) (planner.Model, error) {
			return openai.NewChat(openai.ChatOptions{APIKey: "k", BaseURL: url + "/v1", Model: "fake-gpt", Logger: quiet})
		}, "openai: 400 Bad Request: "},
		{"openai-responses", responsesFake, func(url string) (planner.Model, error) {
			return openai.NewResponses(openai.ResponsesOptions{APIKey: "k", BaseURL: url + "/v1", Model: "fake-gpt", Logger: quiet})
		}, "openai-responses: 400 Bad Request: "},
		{"anthropic", anthropicFake, func(url string) (planner.Model, error) {
			return anthropic.New(anthropic.Options{APIKey: "k", BaseURL: url, Model: "fake-claude", Logger: quiet})
		}, "anthropic: 400 Bad Request: "},
	}
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) {
			body := p.fake().errorBody(refusal)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				_, _ = io.WriteString(w, body)
			}))
			t.Cleanup(srv.Close)
			model, err := p.model(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			s := newStack(t, model)
			s.startAll()
			run := "refused-" + strings.ReplaceAll(p.name, "-", "_")
			s.submit(run, toolbus.Limits{})
			ended := s.waitEnd(run)
			if ended.Status != toolbus.RunFailed || ended.Code != toolbus.CodeModelError {
				t.Fatalf("run ended %+v, want failed with code %s", ended, toolbus.CodeModelError)
			}
			want := "planner: model call for " + run + " step 0: " + p.prefix + refusal
			if ended.Reason != want {
				t.Fatalf("reason %q, want %q", ended.Reason, want)
			}
			if seg := repeatedSegment(ended.Reason); seg != "" {
				t.Fatalf("reason %q repeats the prefix %q", ended.Reason, seg)
			}
		})
	}
}

// repeatedSegment returns a ": "-separated segment of an error text that occurs twice,
// or "".
func repeatedSegment(msg string) string {
	seen := map[string]bool{}
	for _, seg := range strings.Split(msg, ": ") {
		if seen[seg] {
			return seg
		}
		seen[seg] = true
	}
	return ""
}

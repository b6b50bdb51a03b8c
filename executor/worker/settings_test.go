package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
)

// TestServeReadsTheExecutorSettings: Serve honours the variables the binary's executor
// role does (worker.Settings): the team recorded as the tools' owner, the subset of
// tools served, contract replacement.
func TestServeReadsTheExecutorSettings(t *testing.T) {
	js := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, 2*time.Minute)
	bus, _, err := provision.Setup(ctx, js.Conn, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	serve := func(t *testing.T, env map[string]string, tools ...executor.Tool) (stop func() error) {
		t.Helper()
		t.Setenv("TOOLBUS_NATS_URL", js.URL)
		t.Setenv("TOOLBUS_LOG_LEVEL", "error")
		for k, v := range env {
			t.Setenv(k, v)
		}
		reg := executor.NewRegistry()
		for _, tool := range tools {
			if err := reg.Register(tool); err != nil {
				t.Fatal(err)
			}
		}
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- worker.Serve(sctx, reg) }()
		return func() error { cancel(); return <-done }
	}
	owner := func(tool string) (string, string, error) {
		cat, err := bus.Store().WatchCatalog(ctx, nil)
		if err != nil {
			return "", "", err
		}
		c, ok := cat.Lookup(tool)
		if !ok {
			return "", "", fmt.Errorf("%s not in the catalog", tool)
		}
		return c.Owner, c.Description, nil
	}

	stop := serve(t, map[string]string{"TOOLBUS_TEAM": "alpha", "TOOLBUS_EXECUTOR_TOOLS": "served", "TOOLBUS_INSTANCE": "alpha-1"},
		echoTool("served"), echoTool("not_served"))
	eventstest.Eventually(t, time.Minute, func() error {
		o, _, err := owner("served")
		if err == nil && o != "alpha" {
			return fmt.Errorf("owner %q, want alpha (TOOLBUS_TEAM)", o)
		}
		return err
	})
	if err := stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if _, _, err := owner("not_served"); err == nil {
		t.Fatal("a tool outside TOOLBUS_EXECUTOR_TOOLS was published")
	}

	// The owner changes its tool on purpose with TOOLBUS_EXECUTOR_REPLACE_CONTRACTS.
	changed := echoTool("served")
	changed.Description = "echo, described anew"
	stop = serve(t, map[string]string{"TOOLBUS_TEAM": "alpha", "TOOLBUS_EXECUTOR_REPLACE_CONTRACTS": "true", "TOOLBUS_INSTANCE": "alpha-2"}, changed)
	eventstest.Eventually(t, time.Minute, func() error {
		if _, d, err := owner("served"); err != nil || d != changed.Description {
			return fmt.Errorf("description %q, %v: the contract was not replaced", d, err)
		}
		return nil
	})
	if err := stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// TestServeRefusesBadSettings: Serve refuses what the binary refuses, naming the value.
func TestServeRefusesBadSettings(t *testing.T) {
	t.Setenv("TOOLBUS_CALL_TIMEOUT", "-1s")
	if _, err := worker.LoadEnv(); !errors.Is(err, workerconfig.ErrInvalidConfig) || !strings.Contains(err.Error(), "CallTimeout") {
		t.Fatalf("LoadEnv with a negative call timeout: %v", err)
	}
}

package bench_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/cmd/toolbus/internal/bench"
	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
	"github.com/toolbus/toolbus/events/provision"
)

// The -tenants mode end to end at tiny sizes: the roles run in this process, each with
// the configuration its TOOLBUS_* settings give (node.Load, node.RunRoles: what the
// toolbus binary's role commands run), instead of as processes. It checks that every
// figure is measured and printed, never how large it is.
func TestTenantsSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the pipeline")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	o := bench.TenantOptions{FloodK: []int{2}, FloodSteps: 1, Quota: 2, QuietRuns: 2, ToolMS: 1,
		FloodWindow: 300 * time.Millisecond, Executors: 1, Launch: inProcess(t)}
	rep, err := bench.RunTenants(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 1 || len(rep.Medians) != 0 {
		t.Fatalf("%d rows, %d medians; want 1, 0", len(rep.Rows), len(rep.Medians))
	}
	r := rep.Rows[0]
	for name, q := range map[string]bench.QuietFigures{"alone": r.QuietAlone, "under flood": r.QuietFlood} {
		if q.Runs != 2 || q.StepP50MS <= 0 || q.StepP99MS < q.StepP50MS || q.S2SP50MS < 0 || q.S2SP99MS < q.S2SP50MS {
			t.Errorf("quiet %s: %+v", name, q)
		}
	}
	if r.StepP50X <= 0 || r.FloodAloneCallsPS < 0 || r.FloodBesideCallsPS < 0 {
		t.Errorf("row %+v", r)
	}
	var out bytes.Buffer
	bench.PrintTenants(&out, rep)
	if !strings.Contains(out.String(), "K=2 alone") || !strings.Contains(out.String(), "quiet schedule-to-start p99 ms") {
		t.Fatalf("table:\n%s", out.String())
	}
}

// inProcess launches toolbus init and the roles as goroutines. The settings of each are
// read by node.Load from the environment, set for that one load under a lock.
func inProcess(t *testing.T) bench.Launch {
	var mu sync.Mutex
	load := func(env []string) (node.Config, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			old, had := os.LookupEnv(k)
			os.Setenv(k, v)
			defer func() {
				if had {
					os.Setenv(k, old)
				} else {
					os.Unsetenv(k)
				}
			}()
		}
		cfg, err := node.Load()
		cfg.LogOut = io.Discard
		return cfg, err
	}
	return func(ctx context.Context, args, env []string) (<-chan error, error) {
		cfg, err := load(env)
		if err != nil {
			return nil, err
		}
		done := make(chan error, 1)
		if args[0] == "init" { // what toolbus init does for the executors' tools
			nc, err := nats.Connect(cfg.URL)
			if err != nil {
				return nil, err
			}
			defer nc.Close()
			_, _, err = provision.Setup(ctx, nc, cfg.Config, append(node.SetupOptions(cfg), provision.WithTools(cfg.ExecutorTools, cfg.AckWait, 0))...)
			done <- err
			return done, nil
		}
		c, err := node.Open(ctx, cfg, cfg.Logger(), false)
		if err != nil {
			return nil, err
		}
		go func() {
			err := node.RunRoles(ctx, cfg, c.Bus, cfg.Logger(), args[0])
			c.Close()
			if ctx.Err() != nil {
				err = nil
			}
			done <- err
		}()
		return done, nil
	}
}

// A role process that ends on its own ends the measurement with its error, instead of
// runs that wait for it.
func TestTenantsRoleEnded(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	roles := inProcess(t)
	broken := func(ctx context.Context, args, env []string) (<-chan error, error) {
		if args[0] != "executor" {
			return roles(ctx, args, env)
		}
		done := make(chan error, 1)
		done <- errors.New("executor gave up")
		return done, nil
	}
	o := bench.TenantOptions{FloodK: []int{2}, FloodSteps: 1, Quota: 2, QuietRuns: 1, ToolMS: 1, FloodWindow: time.Second, Executors: 1, Launch: broken}
	_, err := bench.RunTenants(ctx, o)
	if err == nil || !strings.Contains(err.Error(), "toolbus executor ended during the bench: executor gave up") {
		t.Fatalf("err %v; want the executor's end", err)
	}
}

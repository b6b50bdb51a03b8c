package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events"
)

// Launch starts one process of the toolbus command: args are its arguments (init,
// planner, injector, executor), env the TOOLBUS_* settings it gets over the
// environment's. It returns once the process started; cancelling ctx stops it, and done
// receives how it ended. `toolbus bench -tenants` launches the roles so: whatever they
// do, a fair scheduler included, is what main does with those settings.
type Launch func(ctx context.Context, args, env []string) (done <-chan error, err error)

// execLaunch runs the toolbus binary, its output kept for an error.
func execLaunch(binary string) Launch {
	return func(ctx context.Context, args, env []string) (<-chan error, error) {
		cmd := exec.CommandContext(ctx, binary, args...)
		cmd.Env = append(os.Environ(), env...)
		out := &lockedBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
		cmd.WaitDelay = 10 * time.Second
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		done := make(chan error, 1)
		go func() {
			err := cmd.Wait()
			if err != nil && ctx.Err() == nil {
				err = fmt.Errorf("toolbus %s: %w\n%s", args[0], err, out.tail(2000))
			} else if ctx.Err() != nil {
				err = nil // stopped
			}
			done <- err
		}()
		return done, nil
	}
}

// lockedBuffer is a process's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 1<<20 {
		l.b.Reset() // keep the recent part only
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.b.Bytes()
	return string(b[max(0, len(b)-n):])
}

// tenantDeployment is an embedded server in this process, set up by `toolbus init`, and
// the roles as processes: a planner, an injector with the quota, and the executors of
// the shared tool.
type tenantDeployment struct {
	nc    *nats.Conn
	cfg   events.Config
	stops []func()
	// ended receives why a role process ended before the bench stopped it.
	ended chan error
}

func (d *tenantDeployment) close() {
	for i := len(d.stops) - 1; i >= 0; i-- {
		d.stops[i]()
	}
}

// deployTenants starts the deployment and waits until the executors serve the tool.
func deployTenants(ctx context.Context, o TenantOptions) (*tenantDeployment, error) {
	d := &tenantDeployment{}
	// The bench's client reads the stream the roles use (TOOLBUS_STREAM and the rest).
	if err := envconfig.Process("TOOLBUS", &d.cfg); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	srv, stopServer, err := startServer(false)
	if err != nil {
		return nil, err
	}
	d.stops = append(d.stops, stopServer)
	fail := func(err error) (*tenantDeployment, error) { d.close(); return nil, err }
	launch := o.Launch
	if launch == nil {
		launch = execLaunch(o.Binary)
	}
	base := []string{"TOOLBUS_NATS_URL=" + srv.ClientURL(), "TOOLBUS_TOOLS=diag", "TOOLBUS_EXECUTOR_TOOLS=" + TenantTool,
		"TOOLBUS_MAX_RUNS_IN_FLIGHT=" + strconv.Itoa(o.Quota), "TOOLBUS_LOG_LEVEL=warn"}
	initDone, err := launch(ctx, []string{"init"}, base)
	if err != nil {
		return fail(err)
	}
	if err := <-initDone; err != nil {
		return fail(fmt.Errorf("toolbus init: %w", err))
	}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	d.stops = append(d.stops, func() { stop(); wg.Wait() })
	roles := [][]string{{"planner", "TOOLBUS_INSTANCE=bench-planner"}, {"injector", "TOOLBUS_INSTANCE=bench-injector"}}
	for i := range o.Executors {
		env := []string{"executor", "TOOLBUS_INSTANCE=bench-executor-" + strconv.Itoa(i)}
		if o.Concurrency > 0 {
			env = append(env, "TOOLBUS_CONCURRENCY="+strconv.Itoa(o.Concurrency))
		}
		roles = append(roles, env)
	}
	d.ended = make(chan error, len(roles))
	for _, r := range roles {
		done, err := launch(rctx, r[:1], slices.Concat(base, r[1:]))
		if err != nil {
			return fail(err)
		}
		wg.Add(1)
		go func() { // a role that ends before the bench stops it ends the measurement
			defer wg.Done()
			if err := <-done; rctx.Err() == nil {
				d.ended <- fmt.Errorf("toolbus %s ended during the bench: %v", r[0], err)
			}
		}()
	}
	if d.nc, err = srv.Connect(); err != nil {
		return fail(err)
	}
	d.stops = append(d.stops, d.nc.Close)
	if err := waitServed(ctx, srv, d, o.Executors); err != nil {
		return fail(err)
	}
	return d, nil
}

// waitServed waits until every executor serves the shared tool (its instance record
// names it), or a role process ended.
func waitServed(ctx context.Context, srv *embedded.Server, d *tenantDeployment, executors int) error {
	bus, err := events.Open(ctx, d.nc, d.cfg)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case err := <-d.ended:
			return err
		default:
		}
		ins, _ := bus.Store().Instances(ctx)
		serving := 0
		for _, in := range ins {
			if slices.Contains(in.Tools, TenantTool) {
				serving++
			}
		}
		if serving >= executors {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d executors serve %s after 2 minutes (server %s)", serving, executors, TenantTool, srv.ClientURL())
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

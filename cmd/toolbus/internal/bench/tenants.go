package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/planner"
)

// The two tenants of `toolbus bench -tenants`: two principals, as the injector's quota
// (TOOLBUS_MAX_RUNS_IN_FLIGHT) counts them, and the shared tool both call.
const (
	QuietPrincipal = "quiet"
	FloodPrincipal = "flood"
	TenantTool     = "sleep"
)

// TenantOptions are what `toolbus bench -tenants` measures.
type TenantOptions struct {
	// FloodK lists the flood's calls per step, one row each.
	FloodK []int `json:"flood_calls_per_step"`
	// FloodSteps are the steps with calls of each flood run (then it answers).
	FloodSteps int `json:"flood_steps_with_calls"`
	// Quota is TOOLBUS_MAX_RUNS_IN_FLIGHT of the injector: the flood keeps that many
	// runs in flight, starting one as one ends.
	Quota int `json:"max_runs_in_flight"`
	// QuietRuns are the quiet tenant's sequential runs of each phase.
	QuietRuns int `json:"quiet_runs"`
	// ToolMS is how long each call of the shared tool sleeps.
	ToolMS int `json:"tool_ms"`
	// FloodWarmup is how long the flood runs before its solo throughput is counted,
	// FloodWindow how long it is counted: half before the quiet tenant's phase under
	// the flood, half after it.
	FloodWarmup time.Duration `json:"flood_warmup"`
	FloodWindow time.Duration `json:"flood_window"`
	// Executors are the executor processes; Concurrency their TOOLBUS_CONCURRENCY (0:
	// as the environment sets it).
	Executors   int `json:"executors"`
	Concurrency int `json:"executor_concurrency,omitempty"`
	// Repeat measures each flood size this many times, on a new deployment each time,
	// and reports the medians.
	Repeat int `json:"repeat"`
	// Launch starts the deployment's processes (nil: the toolbus binary at Binary).
	Launch Launch `json:"-"`
	// Binary is the toolbus command the role processes run.
	Binary string `json:"-"`
	// Progress receives a line per phase done (nil: none).
	Progress io.Writer `json:"-"`
}

// TenantFlags registers the flags of the -tenants mode on fs (the caller adds -tenants
// itself), with their defaults: the setting of issue 55.
func TenantFlags(fs *flag.FlagSet) *TenantOptions {
	o := &TenantOptions{}
	fs.Func("flood-k", "-tenants: the flood's calls per step, comma-separated, a row each (default 16,8)", func(s string) error {
		o.FloodK = nil
		for _, v := range strings.Split(s, ",") {
			k, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || k < 1 {
				return fmt.Errorf("bad calls per step %q", v)
			}
			o.FloodK = append(o.FloodK, k)
		}
		return nil
	})
	fs.IntVar(&o.FloodSteps, "flood-steps", 3, "-tenants: steps with calls of each flood run")
	fs.IntVar(&o.Quota, "flood-runs", 16, "-tenants: TOOLBUS_MAX_RUNS_IN_FLIGHT of the injector, the quota per principal; the flood keeps that many runs in flight")
	fs.IntVar(&o.QuietRuns, "quiet-runs", 30, "-tenants: sequential runs of the quiet tenant, alone and under the flood")
	fs.IntVar(&o.ToolMS, "tool-ms", 200, "-tenants: how long each call of the shared tool sleep takes (ms)")
	fs.DurationVar(&o.FloodWarmup, "flood-warmup", 2*time.Second, "-tenants: how long the flood runs alone before its throughput is counted")
	fs.DurationVar(&o.FloodWindow, "flood-window", 10*time.Second, "-tenants: how long the flood's solo throughput is counted (half before the quiet tenant's phase under the flood, half after it)")
	fs.IntVar(&o.Executors, "executors", 1, "-tenants: executor processes serving the shared tool")
	fs.IntVar(&o.Concurrency, "executor-concurrency", 0, "-tenants: TOOLBUS_CONCURRENCY of each executor process (0: as the environment sets it, default 64)")
	fs.IntVar(&o.Repeat, "tenant-repeat", 1, "-tenants: measure each flood size this many times, each on a new deployment, and print the medians")
	return o
}

// Validate reports the first option out of range, and fills in the defaults.
func (o *TenantOptions) Validate() error {
	if len(o.FloodK) == 0 {
		o.FloodK = []int{16, 8}
	}
	o.Repeat = max(1, o.Repeat)
	switch {
	case o.FloodSteps < 1:
		return errors.New("bench: -flood-steps must be at least 1")
	case o.Quota < 1:
		return errors.New("bench: -flood-runs must be at least 1")
	case o.QuietRuns < 1:
		return errors.New("bench: -quiet-runs must be at least 1")
	case o.ToolMS < 0 || o.ToolMS > 60000:
		return errors.New("bench: -tool-ms must be 0 to 60000")
	case o.FloodWarmup < 0 || o.FloodWindow <= 0:
		return errors.New("bench: -flood-warmup must be 0 or more, -flood-window more than 0")
	case o.Executors < 1 || o.Concurrency < 0:
		return errors.New("bench: -executors must be at least 1, -executor-concurrency 0 or more")
	case o.Launch == nil && o.Binary == "":
		return errors.New("bench: -tenants needs the toolbus binary")
	}
	return nil
}

// TenantReport is what `toolbus bench -tenants` measured.
type TenantReport struct {
	When    time.Time     `json:"when"`
	Machine string        `json:"machine"`
	Options TenantOptions `json:"options"`
	Rows    []TenantRow   `json:"rows"`
	// Medians are the medians per flood size when it was measured several times.
	Medians []TenantRow `json:"medians,omitempty"`
}

// RunTenants measures each flood size of o (Repeat times), each time on a deployment of
// its own: an embedded server in this process and the roles as processes.
func RunTenants(ctx context.Context, o TenantOptions) (TenantReport, error) {
	if err := o.Validate(); err != nil {
		return TenantReport{}, err
	}
	rep := TenantReport{When: time.Now().UTC(), Machine: machine(), Options: o}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	for r := range o.Repeat {
		for _, k := range o.FloodK {
			row, err := tenantRow(ctx, o, k, progress)
			if err != nil {
				return rep, fmt.Errorf("bench tenants K=%d: %w", k, err)
			}
			if o.Repeat > 1 {
				row.Repeat = r + 1
			}
			rep.Rows = append(rep.Rows, row)
		}
	}
	rep.Medians = MedianRows(rep.Rows)
	return rep, nil
}

// tenantRow measures one flood size on a new deployment: the quiet tenant alone, the
// flood alone, then the quiet tenant while the flood goes on.
func tenantRow(ctx context.Context, o TenantOptions, k int, progress io.Writer) (row TenantRow, err error) {
	row = TenantRow{FloodK: k, FloodSteps: o.FloodSteps, FloodRuns: o.Quota, ToolMS: o.ToolMS}
	d, err := deployTenants(ctx, o)
	if err != nil {
		return row, err
	}
	defer d.close()
	// A role process that ends meanwhile ends the row, with its output as the error.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case err := <-d.ended:
			cancel(err)
		case <-ctx.Done():
		}
	}()
	defer func() {
		if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause
		}
	}()
	tb, err := newTenantBus(ctx, d)
	if err != nil {
		return row, err
	}
	defer tb.close()
	quiet := tb.quiet(o)
	if _, err := quiet(ctx, "quiet-warm", 1); err != nil { // every role up and warm
		return row, err
	}
	alone, err := quiet(ctx, "quiet-alone", o.QuietRuns)
	if err != nil {
		return row, err
	}
	fmt.Fprintf(progress, "bench tenants K=%d: quiet alone done\n", k)
	fl := tb.flood(ctx, o, k)
	defer fl.stop()
	if err := sleepCtx(ctx, o.FloodWarmup); err != nil {
		return row, err
	}
	// The flood alone is counted half before the quiet tenant's phase and half after
	// it, so that a drift of the machine's load over the row shifts both figures alike.
	var aloneCalls int64
	var aloneTime time.Duration
	countAlone := func() error {
		n0, t0 := tb.floodCalls.Load(), time.Now()
		err := sleepCtx(ctx, o.FloodWindow/2)
		aloneCalls, aloneTime = aloneCalls+tb.floodCalls.Load()-n0, aloneTime+time.Since(t0)
		return err
	}
	if err := countAlone(); err != nil {
		return row, err
	}
	n0, t0 := tb.floodCalls.Load(), time.Now()
	under, err := quiet(ctx, "quiet-flood", o.QuietRuns)
	if err != nil {
		return row, err
	}
	row.FloodBesideCallsPS = float64(tb.floodCalls.Load()-n0) / time.Since(t0).Seconds()
	if err := countAlone(); err != nil {
		return row, err
	}
	row.FloodAloneCallsPS = float64(aloneCalls) / aloneTime.Seconds()
	if err := fl.stop(); err != nil {
		return row, err
	}
	row.FloodFailed = int(tb.floodFailed.Load())
	fmt.Fprintf(progress, "bench tenants K=%d: flood done (%.0f calls/s alone, %.0f beside the quiet tenant)\n", k, row.FloodAloneCallsPS, row.FloodBesideCallsPS)
	// Read once the flood is over: the reads are the bench's, not the tenants'.
	if row.QuietAlone, err = tb.measureQuiet(ctx, alone); err != nil {
		return row, err
	}
	if row.QuietFlood, err = tb.measureQuiet(ctx, under); err != nil {
		return row, err
	}
	if row.FairSplit, err = tb.fairSplit(ctx, under); err != nil {
		return row, err
	}
	row.setRatios()
	return row, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// tenantBus is the bench's client of a deployment: it starts the tenants' runs, hears
// their ends and counts the flood's finished calls.
type tenantBus struct {
	bus         *events.Bus
	nc          *nats.Conn
	subs        []*nats.Subscription
	mu          sync.Mutex
	ended       map[string]chan string // run -> its status, once it ends
	floodCalls  atomic.Int64
	floodFailed atomic.Int64
}

func newTenantBus(ctx context.Context, d *tenantDeployment) (*tenantBus, error) {
	tb := &tenantBus{nc: d.nc, ended: map[string]chan string{}}
	var err error
	if tb.bus, err = events.Open(ctx, d.nc, d.cfg); err != nil {
		return nil, err
	}
	sub, err := d.nc.Subscribe(events.SubjectPrefix+".*.run.*", func(m *nats.Msg) {
		status := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		run, _ := events.RunIDFromSubject(m.Subject)
		switch toolbus.RunStatus(status) {
		case toolbus.RunCompleted, toolbus.RunFailed, toolbus.RunLimitReached, toolbus.RunCancelled:
		default:
			return
		}
		if strings.HasPrefix(run, "flood") && status != string(toolbus.RunCompleted) {
			tb.floodFailed.Add(1)
		}
		tb.mu.Lock()
		ch := tb.ended[run]
		delete(tb.ended, run)
		tb.mu.Unlock()
		if ch != nil {
			ch <- status
		}
	})
	if err != nil {
		return nil, err
	}
	tb.subs = append(tb.subs, sub)
	sub, err = d.nc.Subscribe(events.SubjectPrefix+".*.tool.finished."+TenantTool, func(m *nats.Msg) {
		if run, _ := events.RunIDFromSubject(m.Subject); strings.HasPrefix(run, "flood") {
			tb.floodCalls.Add(1)
		}
	})
	if err != nil {
		tb.close()
		return nil, err
	}
	tb.subs = append(tb.subs, sub)
	return tb, nil
}

func (tb *tenantBus) close() {
	for _, s := range tb.subs {
		_ = s.Unsubscribe()
	}
}

// start starts a run of principal with the script of steps, and returns the channel
// its end status arrives on.
func (tb *tenantBus) start(ctx context.Context, run, principal, model string, steps int) (<-chan string, error) {
	ch := make(chan string, 1)
	tb.mu.Lock()
	tb.ended[run] = ch
	tb.mu.Unlock()
	err := tb.bus.StartRun(ctx, "/toolbus/bench/tenants", toolbus.RunStarted{RunID: run, Model: model,
		Principal: toolbus.Principal{ID: principal}, Limits: toolbus.Limits{MaxSteps: steps + 1},
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "bench tenants"}}})
	if err != nil {
		tb.mu.Lock()
		delete(tb.ended, run)
		tb.mu.Unlock()
		return nil, err
	}
	return ch, nil
}

// quiet returns the quiet tenant's phase: n runs one after the other, each one call of
// the shared tool, under ids prefix-<i>; it returns the run ids once all ended.
func (tb *tenantBus) quiet(o TenantOptions) func(ctx context.Context, prefix string, n int) ([]string, error) {
	model := sleepScript("quiet", 1, 1, o.ToolMS)
	return func(ctx context.Context, prefix string, n int) ([]string, error) {
		var runs []string
		for i := range n {
			run := fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e9, i)
			ch, err := tb.start(ctx, run, QuietPrincipal, model, 2)
			if err != nil {
				return nil, err
			}
			select {
			case status := <-ch:
				if status != string(toolbus.RunCompleted) {
					return nil, fmt.Errorf("quiet run %s ended %s", run, status)
				}
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(2*time.Minute + 10*time.Duration(o.ToolMS)*time.Millisecond):
				return nil, fmt.Errorf("quiet run %s did not end in 2 minutes", run)
			}
			runs = append(runs, run)
		}
		return runs, nil
	}
}

// flooder keeps the flood's runs in flight until stop.
type flooder struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// stop stops starting runs, waits for those in flight to end, and reports the first
// start that failed.
func (f *flooder) stop() error {
	f.once.Do(func() { f.cancel(); f.err = <-f.done })
	return f.err
}

// flood starts o.Quota runs of the flood principal, each FloodSteps steps of k calls
// of the shared tool, and starts a new one as each ends, until stopped.
func (tb *tenantBus) flood(ctx context.Context, o TenantOptions, k int) *flooder {
	fctx, cancel := context.WithCancel(ctx)
	f := &flooder{cancel: cancel, done: make(chan error, 1)}
	model := sleepScript("flood", o.FloodSteps, k, o.ToolMS)
	var seq atomic.Int64
	prefix := fmt.Sprintf("flood-%d-", time.Now().UnixNano()%1e9)
	go func() {
		var wg sync.WaitGroup
		errs := make(chan error, o.Quota)
		for range o.Quota {
			wg.Add(1)
			go func() { // one slot of the quota: a run after the other
				defer wg.Done()
				for fctx.Err() == nil {
					run := prefix + strconv.FormatInt(seq.Add(1), 10)
					// Started with ctx: a run started goes on to its end after stop.
					ch, err := tb.start(ctx, run, FloodPrincipal, model, o.FloodSteps+1)
					if err != nil {
						errs <- err
						return
					}
					select {
					case <-ch:
					case <-ctx.Done():
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		f.done <- <-errs
	}()
	return f
}

// sleepScript is the model name of a script shipped with the run (planner.InlineScript):
// steps steps of k calls of the shared tool, each sleeping ms, then the answer.
func sleepScript(name string, steps, k, ms int) string {
	f := planner.ScriptFile{Name: "script:bench-" + name}
	args := json.RawMessage(fmt.Sprintf(`{"ms":%d}`, ms))
	for range steps {
		var st planner.ScriptStep
		for range k {
			st.Calls = append(st.Calls, planner.ScriptCall{Tool: TenantTool, Arguments: args})
		}
		f.Steps = append(f.Steps, st)
	}
	f.Steps = append(f.Steps, planner.ScriptStep{Say: "done"})
	b, _ := json.Marshal(f) // plain data: no error
	return "script:" + string(b)
}

// measureQuiet reads what the server stored of each quiet run (its events and its
// claims) and computes the phase's figures.
func (tb *tenantBus) measureQuiet(ctx context.Context, runs []string) (QuietFigures, error) {
	var steps, s2s []time.Duration
	for _, run := range runs {
		var msgs []stored
		for _, src := range []struct{ stream, filter string }{
			{tb.bus.Config().Stream, events.SubjectRun(run)},
			{"KV_" + store.BucketClaims, "$KV." + store.BucketClaims + "." + TenantTool + "." + run + ".>"},
		} {
			got, err := readStored(ctx, tb.bus.JetStream(), src.stream, src.filter)
			if err != nil {
				return QuietFigures{}, err
			}
			msgs = append(msgs, got...)
		}
		step, wait, err := quietSample(run, msgs)
		if err != nil {
			return QuietFigures{}, err
		}
		steps, s2s = append(steps, step), append(s2s, wait)
	}
	return quietFigures(steps, s2s), nil
}

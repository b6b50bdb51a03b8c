package fair

import (
	"fmt"
	"strconv"
	"strings"
)

// Shares is the scheduler's configuration, read with envconfig in the role that runs it
// (the injector: cmd/toolbus/internal/node). Tenants are principals (docs/fair-share.md).
type Shares struct {
	// Weights are the tenants' shares of a contended tool: "alice=3,bob=1" (default 1).
	Weights string `envconfig:"FAIR_WEIGHTS" desc:"fair share: tenants' (principals') weights on a tool they share, tenant=weight,... (default 1 each)"`
	// Minimum is each tenant's guaranteed calls in flight per tool, served before any
	// share: "bob=2" ("*=1" for every tenant). Work-conserving: an idle tenant's
	// minimum goes to the others.
	Minimum string `envconfig:"FAIR_MINIMUM" desc:"fair share: calls in flight per tool guaranteed to a tenant before the weights apply, tenant=n,... (* for every tenant)"`
	// Cap is the default concurrency key: calls of one tenant in flight per tool (0:
	// none). Caps sets it per tool: "sleep=8,search=4".
	Cap  int    `envconfig:"FAIR_CAP" desc:"fair share: calls of one tenant in flight per tool (a concurrency key; beyond it calls are queued, and call/run say so; 0: no cap)"`
	Caps string `envconfig:"FAIR_CAPS" desc:"fair share: the concurrency key per tool, tool=n,... (overrides TOOLBUS_FAIR_CAP)"`
	// Window is how many released calls of a tool may wait for an executor (window.go):
	// "credit" (the default), none beyond the executors' free slots (keeping the
	// guaranteed minimums of tenants seen lately free), "pace", calls for one release
	// cycle at the rate the tool's calls start, or "running", as many as its executors
	// run (up to 32).
	// Lookahead is the least of the pace and running windows.
	Window    string `envconfig:"FAIR_WINDOW" default:"credit" desc:"fair share: the release window: credit (calls only into the executors' free slots, the guaranteed minimums of tenants seen in the last 10 s kept free; pace for calls under 50 ms), pace (what one release cycle needs at the rate calls start) or running (as many as the executors run, up to 32)"`
	Lookahead int    `envconfig:"FAIR_LOOKAHEAD" default:"2" desc:"fair share: with the pace or running window (or credit before it knows the executors' slots), calls of a tool released to its executors beyond those they run, at least: what a quiet tenant's call may wait behind"`
}

// policy is a parsed Shares.
type policy struct {
	weights   map[string]float64
	minimum   map[string]int
	cap       int
	caps      map[string]int
	lookahead int
	window    string
}

func (c Shares) parse() (policy, error) {
	p := policy{weights: map[string]float64{}, minimum: map[string]int{}, caps: map[string]int{}, cap: c.Cap, lookahead: c.Lookahead}
	if p.lookahead <= 0 {
		p.lookahead = 2
	}
	switch p.window = c.Window; p.window {
	case "":
		p.window = windowCredit
	case windowPace, windowRunning, windowCredit:
	default:
		return p, fmt.Errorf("fair: TOOLBUS_FAIR_WINDOW %q is none of %s, %s, %s", c.Window, windowPace, windowCredit, windowRunning)
	}
	if p.cap < 0 {
		return p, fmt.Errorf("fair: TOOLBUS_FAIR_CAP %d is negative", p.cap)
	}
	if err := pairs("TOOLBUS_FAIR_WEIGHTS", c.Weights, func(k string, v float64) { p.weights[k] = v }); err != nil {
		return p, err
	}
	if err := pairs("TOOLBUS_FAIR_MINIMUM", c.Minimum, func(k string, v float64) { p.minimum[k] = int(v) }); err != nil {
		return p, err
	}
	if err := pairs("TOOLBUS_FAIR_CAPS", c.Caps, func(k string, v float64) { p.caps[k] = int(v) }); err != nil {
		return p, err
	}
	return p, nil
}

// Validate checks the lists (a bad weight fails the injector at start, not a call).
func (c Shares) Validate() error { _, err := c.parse(); return err }

// pairs parses "k=v,k=v" with positive numbers.
func pairs(name, s string, set func(string, float64)) error {
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		k, v, ok := strings.Cut(f, "=")
		n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if !ok || strings.TrimSpace(k) == "" || err != nil || n <= 0 {
			return fmt.Errorf("fair: %s: %q is not name=<positive number>", name, f)
		}
		set(strings.TrimSpace(k), n)
	}
	return nil
}

func (p policy) weight(tenant string) float64 {
	if w, ok := p.weights[tenant]; ok {
		return w
	}
	return 1
}

func (p policy) min(tenant string) int {
	if m, ok := p.minimum[tenant]; ok {
		return m
	}
	return p.minimum["*"]
}

func (p policy) capOf(tool string) int {
	if c, ok := p.caps[tool]; ok {
		return c
	}
	return p.cap
}

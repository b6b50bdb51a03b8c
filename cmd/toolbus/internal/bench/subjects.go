package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events"
)

// subjectCounter counts the messages clients send to the server by kind of subject (run
// ids, tool names, keys and reply tokens folded away), from a subscription to every
// subject: where the messages per call go.
type subjectCounter struct {
	nc  *nats.Conn
	sub *nats.Subscription
	mu  sync.Mutex
	n   map[string]int64
}

// countSubjects starts counting; stop it with stop.
func countSubjects(srv *embedded.Server) (*subjectCounter, error) {
	nc, err := srv.Connect()
	if err != nil {
		return nil, err
	}
	c := &subjectCounter{nc: nc, n: map[string]int64{}}
	c.sub, err = nc.Subscribe(">", func(m *nats.Msg) {
		if strings.HasPrefix(m.Reply, "$JS.ACK.") {
			return // a consumer's delivery: it shows the stored subject, not the inbox it went to
		}
		k := subjectKind(m.Subject)
		if k == "" {
			return
		}
		c.mu.Lock()
		c.n[k]++
		c.mu.Unlock()
	})
	if err != nil {
		nc.Close()
		return nil, err
	}
	if err := c.sub.SetPendingLimits(-1, -1); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nc.Flush()
}

// stop ends the count and returns it, per call.
func (c *subjectCounter) stop(calls float64) map[string]float64 {
	_ = c.nc.Flush()
	_ = c.sub.Unsubscribe()
	c.nc.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]float64, len(c.n))
	for k, v := range c.n {
		out[k] = float64(v) / calls
	}
	return out
}

// subjectKind folds a subject to its kind; "" for what the server sends itself (replies,
// advisories), which it does not count as received.
func subjectKind(s string) string {
	t := strings.Split(s, ".")
	switch {
	case strings.HasPrefix(s, "_INBOX.") || strings.HasPrefix(s, "$JS.EVENT.") || strings.HasPrefix(s, "$SYS."):
		return ""
	case t[0] == "toolbus" && len(t) >= 4:
		k := "toolbus.*." + t[2] + "." + t[3]
		if len(t) > 4 {
			k += ".*"
		}
		return k
	case t[0] == "$KV" && len(t) >= 2:
		return "$KV." + t[1] + " (put)"
	case strings.HasPrefix(s, "$JS.API.DIRECT.GET.") && len(t) >= 5:
		k := "$JS.API.DIRECT.GET." + t[4]
		if len(t) > 5 {
			k += ".<subject>"
		}
		return k
	case strings.HasPrefix(s, "$JS.API.CONSUMER.MSG.NEXT.") && len(t) >= 7:
		return "$JS.API.CONSUMER.MSG.NEXT." + t[5] + "." + consumerKind(t[6])
	case t[0] == "$JS" && len(t) >= 2 && t[1] == "ACK":
		// v1: $JS.ACK.<stream>.<consumer>.<7 tokens>; v2 adds domain and account hash.
		if len(t) >= 11 {
			return "$JS.ACK." + t[4] + "." + consumerKind(t[5])
		}
		if len(t) >= 4 {
			return "$JS.ACK." + t[2] + "." + consumerKind(t[3])
		}
	case t[0] == "$JS" && len(t) >= 4:
		return strings.Join(t[:min(len(t), 4)], ".")
	}
	return s
}

// consumerKind folds per-tool consumer names.
func consumerKind(c string) string {
	if events.IsToolConsumer(c) {
		return "tool_*"
	}
	return c
}

// printSubjects writes the per-call messages of each row by kind of subject.
func printSubjects(out io.Writer, rep Report) {
	for _, r := range rep.Rows {
		printSubjectCounts(out, fmt.Sprintf("messages per call by subject, %s %s K=%d", r.Storage, r.Durability, r.K), r.Subjects)
	}
}

// printSubjectCounts writes counts by kind of subject, the largest first.
func printSubjectCounts(out io.Writer, title string, counts map[string]float64) {
	if len(counts) == 0 {
		return
	}
	fmt.Fprintf(out, "\n%s (total %.2f)\n", title, sum(counts))
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if counts[a] != counts[b] {
			if counts[a] > counts[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, k := range keys {
		fmt.Fprintf(tw, "  %.3f\t%s\n", counts[k], k)
	}
	tw.Flush()
}

func sum(m map[string]float64) float64 {
	s := 0.0
	for _, v := range m {
		s += v
	}
	return s
}

// trouble counts what goes wrong while saturated: redeliveries per consumer (the loops'
// observer) and the warnings the workers log, by message. A healthy row has none.
type trouble struct {
	debug bool // count debug records too (costs CPU: the hot path logs at debug)
	mu    sync.Mutex
	redel map[string]int64
	warns map[string]int64
	// stalls counts the 3 s windows in which no run ended, restarts the pulls made
	// again by the consume loops (consume.PullObserver), parked the queues parked now
	// (consume.ParkObserver).
	stalls, restarts, parked atomic.Int64
}

func newTrouble() *trouble { return &trouble{redel: map[string]int64{}, warns: map[string]int64{}} }

func (t *trouble) Serving([]string) {}
func (t *trouble) Stopped([]string) {}
func (t *trouble) Redelivered(consumer string) {
	t.mu.Lock()
	t.redel[consumerKind(consumer)]++
	t.mu.Unlock()
}
func (t *trouble) PullRestarted(string) { t.restarts.Add(1) }
func (t *trouble) Parked(_ string, parked bool) {
	if parked {
		t.parked.Add(1)
	} else {
		t.parked.Add(-1)
	}
}
func (t *trouble) Terminated(consumer string) {
	t.mu.Lock()
	t.warns["terminated on "+consumerKind(consumer)]++
	t.mu.Unlock()
}

// Enabled, Handle, WithAttrs and WithGroup make trouble a slog.Handler of warnings.
func (t *trouble) Enabled(_ context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || t.debug && l >= slog.LevelDebug
}
func (t *trouble) Handle(_ context.Context, r slog.Record) error {
	t.mu.Lock()
	if r.Level < slog.LevelWarn && r.Message == "call finished" {
		t.mu.Unlock()
		return nil
	}
	t.warns[r.Message]++
	t.mu.Unlock()
	return nil
}
func (t *trouble) WithAttrs([]slog.Attr) slog.Handler { return t }
func (t *trouble) WithGroup(string) slog.Handler      { return t }

// note records a line of its own.
func (t *trouble) note(s string) {
	t.mu.Lock()
	t.warns[s]++
	t.mu.Unlock()
}

// summary returns the redeliveries and warnings so far, as "name=count" lists.
func (t *trouble) summary() (redelivered int64, detail string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var parts []string
	for k, v := range t.redel {
		redelivered += v
		parts = append(parts, fmt.Sprintf("redelivered on %s=%d", k, v))
	}
	for k, v := range t.warns {
		parts = append(parts, fmt.Sprintf("%q=%d", k, v))
	}
	slices.Sort(parts)
	return redelivered, strings.Join(parts, ", ")
}

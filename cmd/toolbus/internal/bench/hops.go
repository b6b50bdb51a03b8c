package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
)

// Hops are the parts of a step with calls, in order, from its model.requested to the
// next one, as the server stored them: what one step waits on, one run in flight. Each
// ends when the server stored the write named, so the hops of a step add up to the step.
var Hops = []string{
	"answer recorded", // model.requested -> the step's assistant record (planner: read, model, create)
	"responded",       // -> model.responded (planner: the record's ack, publish)
	"calls published", // -> the step's last tool.requested
	"first claim",     // -> the first claim of the step's calls (executor: delivery, checks, create)
	"last claim",      // -> the last claim (the executor's handlers side by side)
	"results",         // -> the step's last tool.finished (tools, publishes)
	"joined",          // -> the step's last join-state write (injector: delivery, compare-and-set)
	"next request",    // -> the next model.requested (injector: publish)
}

// HopRow is the median of each hop over the steps with calls of the latency runs
// (Options.Hops), in the order of Hops, and the median of their steps.
type HopRow struct {
	Storage    string    `json:"storage"`
	Durability string    `json:"durability"`
	K          int       `json:"calls_per_step"`
	Steps      int       `json:"steps_measured"`
	P50MS      []float64 `json:"hop_p50_ms"`
	StepP50MS  float64   `json:"step_p50_ms"`
	// Cores is the CPU time of the process over the wall time of the latency runs: how
	// many cores one run in flight keeps busy (near the machine's count, a step waits
	// for CPU more than for the server).
	Cores float64 `json:"cores_busy"`
}

// stored is a message of a run as the server stored it.
type stored struct {
	at      time.Time
	subject string
}

// runHops reads what the server stored of each run (events, history records, claims)
// and measures the hops of its steps with calls.
func runHops(ctx context.Context, js jetstream.JetStream, stream string, runs []string, steps int) (hops [][]time.Duration, step []time.Duration, err error) {
	hops = make([][]time.Duration, len(Hops))
	for _, run := range runs {
		var msgs []stored
		for _, src := range []struct{ stream, filter string }{
			{stream, events.SubjectRun(run)},
			{"KV_" + store.BucketHistory, "$KV." + store.BucketHistory + "." + run + ".>"},
			{"KV_" + store.BucketClaims, "$KV." + store.BucketClaims + ".*." + run + ".>"},
		} {
			got, err := readStored(ctx, js, src.stream, src.filter)
			if err != nil {
				return nil, nil, err
			}
			msgs = append(msgs, got...)
		}
		sort.SliceStable(msgs, func(i, j int) bool { return msgs[i].at.Before(msgs[j].at) })
		for s := 0; s < steps-1; s++ {
			marks, err := stepMarks(msgs, run, s)
			if err != nil {
				return nil, nil, err
			}
			for i := range Hops {
				hops[i] = append(hops[i], marks[i+1].Sub(marks[i]))
			}
			step = append(step, marks[len(marks)-1].Sub(marks[0]))
		}
	}
	return hops, step, nil
}

// stepMarks returns when the server stored each mark of step s of run: its
// model.requested, then the end of each hop. msgs are the run's, in store order.
func stepMarks(msgs []stored, run string, s int) ([]time.Time, error) {
	nth := func(suffix string, n int) (time.Time, int) {
		for i, m := range msgs {
			if strings.HasSuffix(m.subject, suffix) {
				if n == 0 {
					return m.at, i
				}
				n--
			}
		}
		return time.Time{}, -1
	}
	req, _ := nth(".model.requested", s)
	next, nextAt := nth(".model.requested", s+1)
	responded, respAt := nth(".model.responded", s)
	prefix := "$KV." + store.BucketHistory + "." + run + "." + strconv.Itoa(s) + "."
	claims := "." + run + "." + strconv.Itoa(s) + "."
	var answer, lastCall, firstClaim, lastClaim, lastResult, joined time.Time
	for i, m := range msgs {
		switch {
		case m.subject == prefix+"a":
			answer = m.at
		case m.subject == prefix+"s" && (nextAt < 0 || i < nextAt):
			joined = m.at
		case strings.Contains(m.subject, ".tool.requested.") && i > respAt && (nextAt < 0 || i < nextAt):
			lastCall = m.at
		case strings.HasPrefix(m.subject, "$KV."+store.BucketClaims+".") && strings.Contains(m.subject, claims):
			if firstClaim.IsZero() {
				firstClaim = m.at
			}
			lastClaim = m.at
		case strings.Contains(m.subject, ".tool.finished.") && i > respAt && (nextAt < 0 || i < nextAt):
			lastResult = m.at
		}
	}
	marks := []time.Time{req, answer, responded, lastCall, firstClaim, lastClaim, lastResult, joined, next}
	if i := slices.IndexFunc(marks, time.Time.IsZero); i >= 0 || respAt < 0 {
		return nil, fmt.Errorf("bench hops: run %s step %d: mark %d not found in %d stored messages", run, s, i, len(msgs))
	}
	// A hop that began before the one before it ended (a call claimed before the last
	// call was published) counts from that end: the hops stay the parts of the step.
	for i := 1; i < len(marks); i++ {
		if marks[i].Before(marks[i-1]) {
			marks[i] = marks[i-1]
		}
	}
	return marks, nil
}

// readStored reads every message of stream on filter with its store time (the events'
// reader: records of the buckets, which are no events, keep their subject and time).
func readStored(ctx context.Context, js jetstream.JetStream, stream, filter string) ([]stored, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("bench hops: %s: %w", stream, err)
	}
	evs, err := runlog.Read(ctx, st, filter)
	if err != nil {
		return nil, fmt.Errorf("bench hops: %s: %w", stream, err)
	}
	out := make([]stored, len(evs))
	for i, ev := range evs {
		out[i] = stored{ev.Time, ev.Subject}
	}
	return out, nil
}

// measureHops measures the hops of the steps of the latency runs of hs, which the
// toolbus case of row ran on srv (its event stream is TOOLBUS).
func measureHops(ctx context.Context, srv *embedded.Server, r Row, hs *hopSamples) (*HopRow, error) {
	nc, err := srv.Connect()
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	hops, step, err := runHops(ctx, js, "TOOLBUS", hs.runs, r.Steps)
	if err != nil {
		return nil, err
	}
	hr := &HopRow{Storage: r.Storage, Durability: r.Durability, K: r.K, Steps: len(step), StepP50MS: pct(step, 50)}
	for _, h := range hops {
		hr.P50MS = append(hr.P50MS, pct(h, 50))
	}
	if hs.wall > 0 {
		hr.Cores = hs.cpu.Seconds() / hs.wall.Seconds()
	}
	return hr, nil
}

// printHops writes the hops of every row that measured them.
func printHops(out io.Writer, rows []HopRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "where a step waits, one run in flight (p50 ms of each hop, from the server's store times; the hops of a step add up to it)")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "hops\tdurability\tK\tsteps\t%s\tstep p50\tcores busy\t\n", strings.Join(Hops, "\t"))
	for _, r := range rows {
		cells := make([]string, len(r.P50MS))
		for i, v := range r.P50MS {
			cells[i] = fmt.Sprintf("%.3f", v)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%.3f\t%.2f\t\n", r.Storage, r.Durability, r.K, r.Steps, strings.Join(cells, "\t"), r.StepP50MS, r.Cores)
	}
	tw.Flush()
}

package faults_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// probeTeamRoutes attacks, with one team's legitimate credentials (an executor in the
// team's own account), the calls, results and records of another team's tool in a run
// the attacker takes part in (so it knows the run id): every route to read them (direct
// gets in both forms, under the core's API prefix and the account's own, message gets,
// stream info, pulls of the victim's queue, consumers made on the event stream or its
// read mirror, the runs, history and claims buckets, everything the attacker's account
// can hear), and every route to get a message stored in the core (a pull of its own
// queue whose reply subject is a core subject, results published for the victim's tool).
// It returns what leaked or was stored; admin checks the core's side.
func probeTeamRoutes(ctx context.Context, attacker *nats.Conn, admin jetstream.JetStream, ownTool, victimTool, run, victimCall string, writes bool) []string {
	var leaks []string
	const pre = "JS.core.API"
	modelResponded := events.SubjectModelResponded(run)
	claimKey := "$KV." + store.BucketClaims + "." + store.ClaimKey(events.ToolToken(victimTool), run, 0, victimCall)
	probeRun := "probe-" + run
	requests := []struct{ subject, body string }{
		{pre + ".DIRECT.GET.TOOLBUS." + events.SubjectToolRequested(run, victimTool), ""},
		{pre + ".DIRECT.GET.TOOLBUS." + events.SubjectToolFinished(run, victimTool), ""},
		{pre + ".DIRECT.GET.TOOLBUS." + modelResponded, ""},
		{pre + ".DIRECT.GET.TOOLBUS", fmt.Sprintf(`{"last_by_subj":%q}`, modelResponded)},
		{"$JS.API.DIRECT.GET.TOOLBUS", fmt.Sprintf(`{"last_by_subj":%q}`, modelResponded)},
		{pre + ".DIRECT.GET.TOOLBUS", `{"seq":1}`},
		{pre + ".DIRECT.GET." + events.ReadMirrorName("TOOLBUS"), `{"seq":1}`},
		{pre + ".STREAM.MSG.GET.TOOLBUS", `{"seq":1}`},
		{pre + ".STREAM.INFO.TOOLBUS", `{"subjects_filter":">"}`},
		{pre + ".STREAM.INFO.KV_" + store.BucketClaims, `{"subjects_filter":">"}`},
		{pre + ".STREAM.LIST", `{}`},
		{pre + ".CONSUMER.MSG.NEXT.TOOLBUS_QUEUES." + events.ToolConsumer(victimTool), `{"batch":1,"expires":500000000}`},
		{pre + ".CONSUMER.CREATE.TOOLBUS", `{"stream_name":"TOOLBUS","config":{"name":"probe","ack_policy":"none","deliver_subject":"probe.deliver"}}`},
		{pre + ".CONSUMER.CREATE." + events.ReadMirrorName("TOOLBUS") + ".probe", `{"stream_name":"` + events.ReadMirrorName("TOOLBUS") + `","config":{"name":"probe","ack_policy":"none"}}`},
		{pre + ".DIRECT.GET.KV_" + store.BucketRuns + ".$KV." + store.BucketRuns + "." + run, ""},
		{pre + ".DIRECT.GET.KV_" + store.BucketHistory, fmt.Sprintf(`{"last_by_subj":"$KV.%s.%s.0.assistant"}`, store.BucketHistory, run)},
		{pre + ".DIRECT.GET.KV_" + store.BucketClaims + "." + claimKey, ""},
		{"$JS.API.DIRECT.GET.KV_" + store.BucketClaims + "." + claimKey, ""},
	}
	// Writes into the core: a pull of its own queue answered to a core subject, a
	// forged result and a forged call of the victim's tool.
	attacks := []struct{ subject, reply, body string }{
		{pre + ".CONSUMER.MSG.NEXT.TOOLBUS_QUEUES." + events.ToolConsumer(ownTool), events.SubjectRunEnded(probeRun, "completed"), `{"batch":1,"expires":500000000}`},
		{events.SubjectToolFinished(probeRun, victimTool), "", `{"forged":true}`},
		{events.SubjectToolRequested(probeRun, victimTool), "", `{"forged":true}`},
	}
	// Everything the attacker's account hears meanwhile, its inboxes included, but for
	// what it publishes itself.
	own := map[string]bool{}
	for _, r := range requests {
		own[r.subject] = true
	}
	for _, w := range attacks {
		own[w.subject] = true
	}
	var (
		mu    sync.Mutex
		heard []string
	)
	all, err := attacker.Subscribe(">", func(m *nats.Msg) {
		if own[m.Subject] {
			return
		}
		if strings.Contains(m.Subject, events.ToolToken(victimTool)) || strings.Contains(string(m.Data), victimTool) {
			mu.Lock()
			heard = append(heard, m.Subject)
			mu.Unlock()
		}
	})
	if err != nil {
		return []string{"subscribe to >: " + err.Error()}
	}
	defer all.Unsubscribe() //nolint:errcheck // end of the probe
	for _, r := range requests {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		m, err := attacker.RequestWithContext(rctx, r.subject, []byte(r.body))
		cancel()
		switch {
		case errors.Is(err, nats.ErrNoResponders), errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		case err != nil:
			leaks = append(leaks, fmt.Sprintf("%s: unexpected error %v", r.subject, err))
		case m.Header.Get("Nats-Subject") != "" || (len(m.Data) > 0 && !strings.Contains(string(m.Data), `"error"`)):
			leaks = append(leaks, fmt.Sprintf("%s answered: %s %.200s", r.subject, m.Header, m.Data))
		}
	}
	if !writes {
		mu.Lock()
		defer mu.Unlock()
		return append(leaks, heard...)
	}
	for _, w := range attacks {
		_ = attacker.PublishRequest(w.subject, w.reply, []byte(w.body)) // what the server does with it is checked below
	}
	_ = attacker.Flush()
	time.Sleep(time.Second) // the pull's expiry: what it would have stored is stored by now
	stream, err := admin.Stream(ctx, "TOOLBUS")
	if err != nil {
		return append(leaks, "admin: "+err.Error())
	}
	for _, s := range []string{events.SubjectRunEnded(probeRun, "completed"), events.SubjectToolFinished(probeRun, victimTool), events.SubjectToolRequested(probeRun, victimTool)} {
		if _, err := stream.GetLastMsgForSubject(ctx, s); !errors.Is(err, jetstream.ErrMsgNotFound) {
			leaks = append(leaks, fmt.Sprintf("stored in the core on %s (%v)", s, err))
		}
	}
	for _, name := range []string{"probe"} {
		if _, err := stream.Consumer(ctx, name); !errors.Is(err, jetstream.ErrConsumerNotFound) {
			leaks = append(leaks, fmt.Sprintf("consumer %s made on the event stream (%v)", name, err))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, s := range heard {
		leaks = append(leaks, "heard "+s)
	}
	return leaks
}

// probeFromTeam runs probeTeamRoutes with the credentials file of a team's executor
// against the victim tool's first call in run (once the run's first step is recorded)
// and returns what leaked or was stored. It may run beside the test's goroutine.
func (e *env) probeFromTeam(creds, ownTool, victimTool, run string) []string {
	var call string
	deadline := time.Now().Add(time.Minute)
	for call == "" {
		if time.Now().After(deadline) {
			return []string{"the first step of " + run + " was never recorded"}
		}
		if mr, err := e.bus.Store().Assistant(e.ctx, run, 0); err == nil {
			for _, c := range mr.Message.ToolCalls {
				if c.Tool == victimTool && call == "" {
					call = c.CallID
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	attacker, err := nats.Connect(e.nodes[0].url(), nats.UserCredentials(creds))
	if err != nil {
		return []string{"connect: " + err.Error()}
	}
	defer attacker.Close()
	admin, err := jetstream.New(e.nc)
	if err != nil {
		return []string{err.Error()}
	}
	// The probe's control: the core's own credentials read the victim's call by most of
	// the routes (a probe that finds nothing there finds nothing anywhere).
	if got := probeTeamRoutes(e.ctx, e.nc, admin, ownTool, victimTool, run, call, false); len(got) < 5 {
		return []string{fmt.Sprintf("the probe's control: the admin's credentials reached only %d routes: %v", len(got), got)}
	}
	return probeTeamRoutes(e.ctx, attacker, admin, ownTool, victimTool, run, call, true)
}

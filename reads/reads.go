// Package reads is the core account's read service for clients in accounts of their own
// (docs/tenancy-design.md, "Clients and front doors"). A run id names no tenant, so a
// client account imports none of the core's JetStream API: it asks this service, which
// answers a checked subset of that API (stream info without the state that lists
// others' subjects, direct gets inside the runs the identity may see, the catalog) and
// the list of the identity's runs. The identity is the second token of the request's
// subject (events.ReadSubject): the core exports it only to the accounts bound to it.
//
// A run is visible to an identity when the run's first run.started names it a decider
// (its principal or one of its approvers): the first run.started of a run id is the one
// that stands, so a later one naming someone else changes nothing. A run that is not
// visible answers exactly as one that does not exist.
package reads

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// PerIdentity bounds the requests of one identity (or, for questions, one tool) the
// service works on at once: one beyond it is refused at once (status 429), so a tenant
// that floods the service delays nobody else's reads, and the service holds at most this
// many goroutines per identity or tool.
const PerIdentity = 16

// Service answers the read service's requests with a bus of the core account.
type Service struct {
	bus *events.Bus
	log *slog.Logger

	mu       sync.Mutex
	streams  map[string]jetstream.Stream // the streams read, by name
	inFlight map[string]int              // requests in progress, by identity
	wg       sync.WaitGroup
	// cat is the catalog view the tools are answered from, made at the first request
	// for them (catalog) and followed until serveCtx ends.
	catMu    sync.Mutex
	cat      *store.Catalog
	idx      *runIndex // who may see which run, made at the first listing (runIndex)
	serveCtx context.Context
}

// New returns the read service of bus (opened in the core account).
func New(bus *events.Bus, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	return &Service{bus: bus, log: log, streams: map[string]jetstream.Stream{}, inFlight: map[string]int{}}
}

// Serve answers requests on every identity's read subjects, in the queue group
// events.ReadQueue (every instance of the service shares the work), until ctx ends; it
// then drains the subscription, so the requests already received are answered.
func (s *Service) Serve(ctx context.Context) error {
	s.catMu.Lock()
	s.serveCtx = ctx
	s.catMu.Unlock()
	nc := s.bus.Conn()
	var subs []*nats.Subscription
	for subject, handle := range map[string]func(context.Context, string, *nats.Msg) *nats.Msg{
		events.ReadServicePrefix + ".*.>":     s.handle,
		events.ToolReadPrefix + ".*.question": s.question,
	} {
		sub, err := nc.QueueSubscribe(subject, events.ReadQueue, func(m *nats.Msg) { s.dispatch(ctx, m, handle) })
		if err != nil {
			return fmt.Errorf("reads: subscribe %s: %w", subject, err)
		}
		subs = append(subs, sub)
	}
	for subject, handle := range map[string]func(*nats.Msg){
		events.FollowServicePrefix + ".*.*": func(m *nats.Msg) { s.dispatchFollow(ctx, m) },
		events.TeamReadPrefix + ".*.>":      func(m *nats.Msg) { s.dispatchTeam(ctx, m) },
	} {
		sub, err := nc.QueueSubscribe(subject, events.ReadQueue, handle)
		if err != nil {
			return fmt.Errorf("reads: subscribe %s: %w", subject, err)
		}
		subs = append(subs, sub)
	}
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("reads: subscribe: %w", err)
	}
	<-ctx.Done()
	var errs []error
	for _, sub := range subs {
		if err := sub.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			errs = append(errs, fmt.Errorf("reads: drain: %w", err))
		}
	}
	s.wg.Wait()
	return errors.Join(errs...)
}

// dispatch works on a request in a goroutine of its own, within the bound of the
// identity or tool its subject names (its second token).
func (s *Service) dispatch(ctx context.Context, m *nats.Msg, handle func(context.Context, string, *nats.Msg) *nats.Msg) {
	if m.Reply == "" {
		return
	}
	who := strings.SplitN(m.Subject, ".", 3)[1]
	key := m.Subject[:strings.IndexByte(m.Subject, '.')] + "." + who
	busy := fmt.Sprintf("toolbus read service: %d requests of %s in progress: retry when one is answered", PerIdentity, who)
	s.admit(m, key, PerIdentity, busy, func() {
		// A request received is answered even while the service drains.
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		defer cancel()
		s.respond(m, handle(hctx, who, m))
	})
}

// admit runs work in a goroutine of its own, counted in flight under key until it
// returns, when fewer than limit requests of key are in flight; else it answers m with
// a 429 refusal that says busy. The one bound of every request of the service.
func (s *Service) admit(m *nats.Msg, key string, limit int, busy string, work func()) {
	s.mu.Lock()
	if s.inFlight[key] >= limit {
		s.mu.Unlock()
		s.respond(m, refusal(429, busy))
		return
	}
	s.inFlight[key]++
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			if s.inFlight[key]--; s.inFlight[key] == 0 {
				delete(s.inFlight, key)
			}
			s.mu.Unlock()
		}()
		work()
	}()
}

// requestTimeout bounds the work on one request.
const requestTimeout = 10 * time.Second

// handle answers one request of a client's identity id. Nothing it does not check gets
// an answer of the core.
func (s *Service) handle(ctx context.Context, id string, m *nats.Msg) *nats.Msg {
	if id == events.NoIdentityToken || events.IdentityToken(id) != id {
		return refusal(400, "toolbus read service: no identity in the subject")
	}
	rest := strings.SplitN(m.Subject, ".", 3)[2]
	switch {
	case rest == "runs":
		return s.runs(ctx, id)
	case rest == "tools":
		return s.tools(ctx)
	case strings.HasPrefix(rest, "API."):
		return s.api(ctx, id, strings.TrimPrefix(rest, "API."), m.Data)
	}
	return refusal(404, "toolbus read service: unknown request "+rest+": it answers API.STREAM.INFO, API.DIRECT.GET, runs and tools")
}

func (s *Service) respond(m, out *nats.Msg) {
	out.Subject = m.Reply
	if err := m.RespondMsg(out); err != nil {
		s.log.Warn("reads: respond", "subject", m.Subject, "err", err)
	}
}

// refusal is a status answer as the JetStream API gives for a direct get: no data, the
// status and its description in the headers.
func refusal(code int, desc string) *nats.Msg {
	h := nats.Header{}
	h.Set("Status", fmt.Sprint(code))
	h.Set("Description", desc)
	return &nats.Msg{Header: h}
}

// notFound is the answer for a message that does not exist or that the identity may
// not see: the same, so nobody learns whether another's run exists.
func notFound() *nats.Msg { return refusal(404, "Message Not Found") }

// runs lists the run states of the runs visible to id, as JSON: the runs its index
// names (runIndex), each read on its own, so a listing costs the asker's runs only.
func (s *Service) runs(ctx context.Context, id string) *nats.Msg {
	out := []store.RunState{}
	mine, err := s.runIndex().visibleRuns(ctx, id)
	for _, run := range mine {
		st, _, gerr := s.bus.Store().RunState(ctx, run)
		if gerr == nil {
			out = append(out, st)
		} else if !errors.Is(gerr, store.ErrRunNotFound) {
			err = gerr
			break
		}
	}
	if err != nil {
		s.log.Warn("reads: runs", "err", err)
		return refusal(503, "toolbus read service: runs: "+err.Error())
	}
	data, err := json.Marshal(out)
	if err != nil {
		return refusal(500, "toolbus read service: "+err.Error())
	}
	return &nats.Msg{Data: data}
}

// runIndex returns the service's run index, made at the first listing: an injector
// whose clients never list runs reads none.
func (s *Service) runIndex() *runIndex {
	s.catMu.Lock()
	defer s.catMu.Unlock()
	if s.idx == nil {
		s.idx = newRunIndex(s.bus, s.log)
	}
	return s.idx
}

// tools lists the tools a client may be offered: the contracts a live instance serves
// (store.Catalog.Tools), the same for every identity, as JSON.
func (s *Service) tools(ctx context.Context) *nats.Msg {
	cat, err := s.catalog(ctx)
	if err != nil {
		s.log.Warn("reads: tools", "err", err)
		return refusal(503, "toolbus read service: tools: "+err.Error())
	}
	data, err := json.Marshal(append([]toolbus.ToolContract{}, cat.Tools(nil)...))
	if err != nil {
		return refusal(500, "toolbus read service: "+err.Error())
	}
	return &nats.Msg{Data: data}
}

// catalog returns the service's catalog view, made at the first call: an injector
// whose clients never ask for tools polls no catalog.
func (s *Service) catalog(ctx context.Context) (*store.Catalog, error) {
	s.catMu.Lock()
	defer s.catMu.Unlock()
	if s.cat != nil {
		return s.cat, nil
	}
	follow := s.serveCtx
	if follow == nil {
		follow = ctx
	}
	cat, err := s.bus.Store().WatchCatalog(follow, s.log)
	if err != nil {
		return nil, err
	}
	s.cat = cat
	return cat, nil
}

// visible reports whether the run's first run.started names id as a decider.
func (s *Service) visible(ctx context.Context, id, run string) bool {
	rs, err := s.bus.RunStarted(ctx, run)
	return err == nil && rs != nil && rs.NamesDecider(id)
}

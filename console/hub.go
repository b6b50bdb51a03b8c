package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/internal/retry"
)

// The console's bus readers are bounded whatever the number of browsers: one watcher of
// every run's events is fanned out to all the live streams (SSE), and the pages' reads
// take one of consoleReaders slots (each reads with direct gets: no consumer).
// No number of page loads or open streams adds consumers to the server.

const (
	// consoleReaders bounds the pages that read the bus at once; more wait for a slot.
	consoleReaders = 4
	// consoleReadWait is how long a page waits for a reader slot before a 503.
	consoleReadWait = 10 * time.Second
	// consoleMaxStreams bounds the live streams (each an open connection and a goroutine).
	consoleMaxStreams = 1000
)

// errConsoleBusy is the answer when no reader slot freed in time.
var errConsoleBusy = errors.New("console: busy, try again")

// consoleNote is what a live stream is told: an event was stored on subject.
type consoleNote struct {
	Subject, Type string
}

// hub fans the events of one watcher out to the live streams.
type hub struct {
	bus   *events.Bus
	log   *slog.Logger
	slots chan struct{}
	// live is set while the watcher follows the bus (/readyz).
	live atomic.Bool

	mu   sync.Mutex
	subs map[chan consoleNote]string // stream -> subject prefix it follows ("" all)
}

func newHub(bus *events.Bus, log *slog.Logger) *hub {
	return &hub{bus: bus, log: log, slots: make(chan struct{}, consoleReaders), subs: map[chan consoleNote]string{}}
}

// run watches every run's events until ctx ends, from the next one stored, and sends
// each to the streams that follow its run. A failed watch is started again (the streams
// then fetch their page once more: they may have missed events).
func (h *hub) run(ctx context.Context) {
	_ = retry.Do(ctx, retry.Policy{Base: 200 * time.Millisecond, Max: 10 * time.Second,
		OnError: func(_ int, err error, wait time.Duration) (time.Duration, error) {
			h.log.Warn("console: live updates interrupted; watching again", "err", err, "retry_in", wait)
			return wait, nil
		}}, func(ctx context.Context) error {
		if h.bus.ClientAccount() {
			return h.poll(ctx)
		}
		w, err := runlog.Watch(ctx, h.bus, events.FilterAll, false)
		if err != nil {
			return err
		}
		h.live.Store(true)
		defer h.live.Store(false)
		h.broadcast(consoleNote{Type: "ready"})
		for {
			ev, ok, err := w.Next(ctx, 5*time.Second)
			if err != nil {
				return err
			}
			if ok {
				typ := ev.Meta.Type
				if typ == "" {
					typ = "event"
				}
				h.broadcast(consoleNote{Subject: ev.Subject, Type: typ})
			}
		}
	})
}

// poll is run's loop in a client account, which follows no stream of every run: every
// second it reads the stream's last sequence (the read service tells it to every
// client) and, when it moved, tells every live stream to fetch its page again.
func (h *hub) poll(ctx context.Context) error {
	last := uint64(0)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	defer h.live.Store(false)
	for first := true; ; first = false {
		info, err := h.bus.EventStream().Info(ctx)
		if err != nil {
			return err
		}
		if first {
			h.live.Store(true)
			h.broadcast(consoleNote{Type: "ready"})
		} else if info.State.LastSeq != last {
			h.broadcast(consoleNote{Type: "event"})
		}
		last = info.State.LastSeq
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// broadcast sends n to every stream that follows its subject (all of them for a
// "ready"). A stream whose buffer is full misses it: it refreshes on the next anyway.
func (h *hub) broadcast(n consoleNote) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch, prefix := range h.subs {
		if n.Subject != "" && prefix != "" && !strings.HasPrefix(n.Subject, prefix) {
			continue
		}
		select {
		case ch <- n:
		default:
		}
	}
}

// subscribe returns a stream of the events of run ("" every run), or false when
// consoleMaxStreams streams are open.
func (h *hub) subscribe(run string) (chan consoleNote, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) >= consoleMaxStreams {
		return nil, false
	}
	ch := make(chan consoleNote, 16)
	prefix := ""
	if run != "" {
		prefix = strings.TrimSuffix(events.SubjectRun(run), ">")
	}
	h.subs[ch] = prefix
	return ch, true
}

func (h *hub) unsubscribe(ch chan consoleNote) {
	h.mu.Lock()
	delete(h.subs, ch)
	h.mu.Unlock()
}

// streams is the number of open streams.
func (h *hub) streams() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// read runs f in a reader slot, waiting at most consoleReadWait for one.
func (h *hub) read(ctx context.Context, f func(context.Context) error) error {
	t := time.NewTimer(consoleReadWait)
	defer t.Stop()
	select {
	case h.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return errConsoleBusy
	}
	defer func() { <-h.slots }()
	return f(ctx)
}

// runEvents reads the events of run with direct gets on bus (the console's, or on a
// client account's the viewer's: events.Bus.As) (runlog.Events), which
// create no consumer: a page load leaves nothing behind on the server, and the console
// needs no right to create consumers (the client role has none).
func (h *hub) runEvents(ctx context.Context, bus *events.Bus, run string) ([]runlog.StoredEvent, error) {
	evs, err := runlog.Events(ctx, bus, run)
	if err != nil {
		return nil, fmt.Errorf("console: read %s: %w", run, err)
	}
	return evs, nil
}

package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// The raw events of a run: every event stored on the run's subjects, in stream order,
// as the CloudEvent it is (its ce-* attributes and data, shown in the CloudEvents JSON
// format), with the stream's sequence and time. Read with direct gets
// (runlog.Events): the client role reads them, and no consumer is created.

// rawEvent is one stored event of a run.
type rawEvent struct {
	Seq     uint64    `json:"seq"`
	Subject string    `json:"subject"`
	Stored  time.Time `json:"stored_at"`
	Type    string    `json:"-"`
	// CloudEvent is the event in the CloudEvents JSON format (structured mode).
	CloudEvent json.RawMessage `json:"cloudevent,omitempty"`
	// Error says why a message on the run's subjects is not a toolbus event (or why its
	// subject and body disagree): such an event counts for no run.
	Error string `json:"error,omitempty"`
}

// rawEvents reads the run's events as v reads them (withhold.go); none when the run has
// none.
func (c *server) rawEvents(ctx context.Context, v viewer, run string) ([]rawEvent, error) {
	evs, err := c.hub.runEvents(ctx, c.bus, run)
	if err != nil {
		return nil, err
	}
	rd, err := c.readingOf(ctx, v, run)
	if err != nil {
		return nil, err
	}
	evs = rd.events(evs)
	out := make([]rawEvent, 0, len(evs))
	for _, ev := range evs {
		re := rawEvent{Seq: ev.Seq, Subject: ev.Subject, Stored: ev.Time, Type: ev.Meta.Type}
		if ev.Err != nil {
			re.Error = ev.Err.Error()
		}
		if ev.Meta.Type != "" {
			if msg, err := events.EncodeStructured(ev.Subject, ev.Meta, ev.Data); err == nil {
				re.CloudEvent = msg.Data
			} else if re.Error == "" {
				re.Error = err.Error()
			}
		}
		out = append(out, re)
	}
	return out, nil
}

// readRawEvents validates the run id and reads its events; it answers the request
// itself (and returns false) when it cannot.
func (c *server) readRawEvents(w http.ResponseWriter, r *http.Request) (string, []rawEvent, bool) {
	run := r.PathValue("run")
	if !toolbus.ValidRunID(run) {
		http.Error(w, "invalid run id", http.StatusBadRequest)
		return run, nil, false
	}
	if !c.mustSee(w, r, run) {
		return run, nil, false
	}
	var evs []rawEvent
	if err := c.hub.read(r.Context(), func(ctx context.Context) error {
		var err error
		evs, err = c.rawEvents(ctx, viewerOf(r), run)
		return err
	}); err != nil {
		c.fail(w, err)
		return run, nil, false
	}
	if len(evs) == 0 {
		http.Error(w, fmt.Sprintf("run %s not found", run), http.StatusNotFound)
		return run, nil, false
	}
	return run, evs, true
}

func (c *server) eventsPage(w http.ResponseWriter, r *http.Request) {
	run, evs, ok := c.readRawEvents(w, r)
	if !ok {
		return
	}
	c.render(w, "events.html", c.pageData(r, map[string]any{"Run": run, "Events": evs}))
}

// eventsJSON serves the run's events as a JSON array (for scripts and downloads).
func (c *server) eventsJSON(w http.ResponseWriter, r *http.Request) {
	_, evs, ok := c.readRawEvents(w, r)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(evs); err != nil {
		c.log.Warn("console: events", "err", err)
	}
}

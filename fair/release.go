package fair

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// releaseAck is the server's answer to one release: stored (err nil) or not.
type releaseAck struct {
	seq uint64
	at  time.Time
	err error
}

// releaser is the scheduler's own JetStream publisher: its releases' acknowledgements
// come to two handlers on the client's ack goroutine (no goroutine per release), which
// only queue them for drainAcks (they must not block, and release holds s.mu while it
// publishes). It only publishes (no API call, so no API prefix), as the bus's own would.
func (s *Scheduler) releaser() (jetstream.JetStream, error) {
	heard := func(m *nats.Msg, err error) {
		seq, perr := strconv.ParseUint(m.Header.Get(events.FairStagedHeader), 10, 64)
		if perr != nil {
			return
		}
		s.ackMu.Lock()
		s.acks = append(s.acks, releaseAck{seq: seq, at: time.Now(), err: err})
		s.ackMu.Unlock()
		s.signal()
	}
	js, err := jetstream.New(s.nc, jetstream.WithPublishAsyncTimeout(10*time.Second),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) { heard(m, nil) }),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) { heard(m, err) }))
	if err != nil {
		return nil, fmt.Errorf("fair: publisher: %w", err)
	}
	return js, nil
}

// drainAcks takes in the acknowledgements heard: a stored release may raise the
// low-water mark, one not stored is held again. Called with s.mu held.
func (s *Scheduler) drainAcks() {
	s.ackMu.Lock()
	acks := s.acks
	s.acks = nil
	s.ackMu.Unlock()
	for _, a := range acks {
		c := s.pending[a.seq]
		if c == nil {
			continue
		}
		delete(s.pending, a.seq)
		if a.err != nil {
			s.failed(c, a.err)
			continue
		}
		s.rtt.add(a.at.Sub(c.released))
		s.stored[c.seq] = true
	}
	if len(acks) > 0 {
		s.advance()
	}
}

// release publishes c on its tool's queue subject with the staged message's headers,
// none of the stream's (Nats-*: the server refuses a published source header, so the
// call's subject goes in events.FairCallSubjectHeader), and the staged sequence as
// message id. Called with s.mu held; the store is heard by releaser's handlers.
func (s *Scheduler) release(c *call) {
	s.drainAcks() // the low-water mark as of now
	// The staged headers are the scheduler's own: the release reuses them (a release
	// not stored and sent again finds its subject in FairCallSubjectHeader).
	msg := &nats.Msg{Subject: events.QueuePrefix + "." + c.tool, Header: c.hdr}
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	msg.Header.Set(events.FairCallSubjectHeader, events.CallSubject(msg.Subject, msg.Header))
	for k := range msg.Header {
		if strings.HasPrefix(k, "Nats-") {
			delete(msg.Header, k)
		}
	}
	seq := strconv.FormatUint(c.seq, 10)
	msg.Header.Set(nats.MsgIdHdr, "fair-"+seq)
	msg.Header.Set(events.FairStagedHeader, seq)
	msg.Header.Set(events.FairLowHeader, strconv.FormatUint(s.low(), 10))
	msg.Data = c.data
	c.released = time.Now()
	s.pending[c.seq] = c
	if _, err := s.js.PublishMsgAsync(msg); err != nil {
		delete(s.pending, c.seq)
		s.failed(c, err)
	}
}

// stagedRequest is what scheduling needs of a staged toolbus.ToolRequested.
type stagedRequest struct {
	RunID string `json:"run_id"`
	Step  int    `json:"step"`
	Call  struct {
		CallID string `json:"call_id"`
		Tool   string `json:"tool"`
	} `json:"call"`
	Principal struct {
		ID string `json:"id"`
	} `json:"principal"`
}

// decodeStaged reads a staged call's run, step, call and tenant: a binary-mode event
// (as the core's planner writes it) straight from its JSON data, anything else through
// events.Decode.
func decodeStaged(subject string, hdr nats.Header, data []byte) (stagedRequest, error) {
	var req stagedRequest
	if hdr.Get("ce-type") == events.TypeToolRequested && hdr.Get(events.HeaderContentType) == events.ContentTypeJSON && len(data) > 0 {
		return req, json.Unmarshal(data, &req)
	}
	_, err := events.Decode(&nats.Msg{Subject: subject, Header: hdr, Data: data}, &req)
	return req, err
}

// finishedKey is the claim key of a tool.finished event's call: from its call
// attributes (binary mode, as executors write it) without reading the result, else from
// its data.
func finishedKey(m *nats.Msg) (string, bool) {
	tool := events.ToolTokenOfSubject(m.Subject)
	run, step, id := m.Header.Get("ce-"+events.ExtRunID), m.Header.Get("ce-"+events.ExtStep), m.Header.Get("ce-"+events.ExtCallID)
	if n, err := strconv.Atoi(step); err == nil && run != "" && id != "" && m.Header.Get("ce-type") == events.TypeToolFinished {
		return store.ClaimKey(tool, run, n, id), true
	}
	ev, err := events.DecodeEvent(m)
	var tf struct {
		RunID  string `json:"run_id"`
		Step   int    `json:"step"`
		CallID string `json:"call_id"`
	}
	if err != nil || json.Unmarshal(ev.Data, &tf) != nil {
		return "", false
	}
	return store.ClaimKey(tool, tf.RunID, tf.Step, tf.CallID), true
}

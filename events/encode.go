package events

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"
)

// Encoding an event: its attributes checked as the CloudEvents SDK checks them (a source
// and dataschema once per distinct value) and written as headers (binary mode) or as one
// JSON document (structured mode).

// Encode builds the NATS message of one event in binary content mode: the attributes in
// ce-* headers, Content-Type application/json, data JSON-encoded in the body and the id
// repeated in Nats-Msg-Id. m.ID, m.Type and m.Source are required; m.Time defaults to
// now, m.DataSchema to DataSchema(m.Type), m.Subject to the call id or the run id.
//
// The attributes are validated as the CloudEvents SDK (event.EventContextV1.Validate)
// validates them and written straight to the headers, as the SDK's binary binding would
// write them. The source and dataschema, which repeat from event to event, are checked
// with the SDK once per distinct value; an event that fails any check is validated by
// the SDK itself, whose error Encode returns.
func Encode(natsSubject string, m Meta, data any) (*nats.Msg, error) {
	body, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("events: encode %s data: %w", m.Type, err)
	}
	m.fill()
	if !m.valid() {
		if _, err := m.context(); err != nil {
			return nil, err
		}
	}
	h := make(nats.Header, 17) // and a signer's three (events/seal)
	h[headerPrefix+"specversion"] = []string{event.CloudEventsVersionV1}
	h[headerPrefix+"id"] = []string{m.ID}
	h[headerPrefix+"source"] = []string{m.Source}
	h[headerPrefix+"type"] = []string{m.Type}
	h[headerPrefix+"subject"] = []string{m.Subject}
	h[headerPrefix+"time"] = []string{types.FormatTime(m.Time)}
	h[headerPrefix+"dataschema"] = []string{m.DataSchema}
	h[HeaderContentType] = []string{ContentTypeJSON}
	if m.RunID != "" {
		h[headerPrefix+ExtRunID] = []string{m.RunID}
	}
	h[headerPrefix+ExtStep] = []string{strconv.Itoa(int(int32(m.Step)))}
	if m.HasCall || m.CallID != "" {
		h[headerPrefix+ExtCallID] = []string{m.CallID}
		h[headerPrefix+ExtCallIndex] = []string{strconv.Itoa(int(int32(m.CallIndex)))}
		h[headerPrefix+ExtCallCount] = []string{strconv.Itoa(int(int32(m.CallCount)))}
	}
	if m.TraceParent != "" {
		h[headerPrefix+ExtTraceParent] = []string{m.TraceParent}
	}
	h[HeaderMsgID] = []string{m.ID}
	return &nats.Msg{Subject: natsSubject, Header: h, Data: body}, nil
}

// valid reports whether the SDK would accept the context of m (after fill), checking
// the source and the dataschema with the SDK once per distinct value (validURIs).
func (m Meta) valid() bool {
	return strings.TrimSpace(m.ID) != "" && strings.TrimSpace(m.Type) != "" &&
		(m.Subject == "" || strings.TrimSpace(m.Subject) != "") &&
		validURIs.get([2]string{m.Source, m.DataSchema}, uriPairValid)
}

// validURIs remembers the source and dataschema pairs the SDK accepted (a worker has
// one source, the contract a schema per type).
var validURIs = newMemo[[2]string, bool]()

// uriPairValid is the SDK's own checks of a source and a dataschema, as context and
// Validate make them.
func uriPairValid(k [2]string) bool {
	source, schema := k[0], k[1]
	if src := types.ParseURIRef(source); src != nil && source != "" && strings.TrimSpace(src.String()) != "" {
		u := types.ParseURI(schema)
		return u == nil || u.Validate()
	}
	return false
}

// memo is a bounded, concurrency-safe cache of a pure function's results: the codec
// asks the SDK about each distinct source and dataschema once, not once per event.
type memo[K comparable, V any] struct {
	mu sync.RWMutex
	m  map[K]V
}

func newMemo[K comparable, V any]() *memo[K, V] { return &memo[K, V]{m: map[K]V{}} }

// get returns f(k), computing it on first use; at most 1024 results are kept (values
// beyond that are computed each time: a bounded set of workers and types stays far
// below it).
func (c *memo[K, V]) get(k K, f func(K) V) V {
	c.mu.RLock()
	v, known := c.m[k]
	c.mu.RUnlock()
	if known {
		return v
	}
	v = f(k)
	c.mu.Lock()
	if len(c.m) < 1024 {
		c.m[k] = v
	}
	c.mu.Unlock()
	return v
}

// fill applies the defaults of Encode.
func (m *Meta) fill() {
	if m.Subject == "" {
		m.Subject = m.CallID
		if m.Subject == "" {
			m.Subject = m.RunID
		}
	}
	if m.Time.IsZero() {
		m.Time = time.Now()
	}
	if m.DataSchema == "" {
		m.DataSchema = DataSchema(m.Type)
	}
}

// context builds and validates the CloudEvents context of m (after fill).
func (m Meta) context() (*event.EventContextV1, error) {
	ec := &event.EventContextV1{ID: m.ID, Type: m.Type, Extensions: make(map[string]any, 6)}
	ct := ContentTypeJSON
	ec.DataContentType = &ct
	if src := types.ParseURIRef(m.Source); src != nil && m.Source != "" {
		ec.Source = *src
	}
	if m.Subject != "" {
		subj := m.Subject
		ec.Subject = &subj
	}
	ec.Time = &types.Timestamp{Time: m.Time.UTC()}
	ec.DataSchema = types.ParseURI(m.DataSchema)
	if m.RunID != "" {
		ec.Extensions[ExtRunID] = m.RunID
	}
	ec.Extensions[ExtStep] = int32(m.Step)
	if m.HasCall || m.CallID != "" {
		ec.Extensions[ExtCallID] = m.CallID
		ec.Extensions[ExtCallIndex] = int32(m.CallIndex)
		ec.Extensions[ExtCallCount] = int32(m.CallCount)
	}
	if m.TraceParent != "" {
		ec.Extensions[ExtTraceParent] = m.TraceParent
	}
	if err := ec.Validate(); err != nil {
		return nil, fmt.Errorf("events: invalid event %q: %w", m.ID, err)
	}
	return ec, nil
}

// EncodeStructured builds the NATS message of one event in structured content mode
// (application/cloudevents+json). toolbus itself publishes binary mode; this exists for
// clients that prefer structured mode and for tests of the decoder.
func EncodeStructured(natsSubject string, m Meta, data any) (*nats.Msg, error) {
	body, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("events: encode %s data: %w", m.Type, err)
	}
	ev, err := m.event(body)
	if err != nil {
		return nil, err
	}
	raw, err := format.JSON.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("events: encode %s: %w", m.Type, err)
	}
	msg := nats.NewMsg(natsSubject)
	msg.Header.Set(HeaderContentType, format.JSON.MediaType())
	msg.Header.Set(HeaderMsgID, m.ID)
	msg.Data = raw
	return msg, nil
}

func (m Meta) event(body []byte) (*event.Event, error) {
	m.fill()
	ec, err := m.context()
	if err != nil {
		return nil, err
	}
	ev := event.New()
	ev.Context = ec
	ev.DataEncoded = body
	return &ev, nil
}

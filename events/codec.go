package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"
)

// ErrNotCloudEvent is wrapped by Decode errors for messages that are not CloudEvents (in
// binary or structured mode), or whose data does not decode. Consumers terminate such
// messages: redelivering them cannot help.
var ErrNotCloudEvent = errors.New("events: not a toolbus CloudEvent")

// Header names used on NATS messages.
const (
	HeaderMsgID       = "Nats-Msg-Id"
	HeaderContentType = "Content-Type"
	ContentTypeJSON   = "application/json"
	headerPrefix      = "ce-"
)

// Extension attribute names (lower-case alphanumeric, as CloudEvents requires).
const (
	ExtRunID       = "runid"
	ExtStep        = "step"
	ExtCallID      = "callid"
	ExtCallIndex   = "callindex"
	ExtCallCount   = "callcount"
	ExtTraceParent = "traceparent"
)

// SchemaBaseURI is the base of every dataschema URI. The URIs are stable identifiers
// (the $id of each schema), not a service to fetch from: the schema of type T is the file
// schemas/T.v1.json of this repository (SchemaFile), so a subscriber maps the base to
// that directory.
const SchemaBaseURI = "https://toolbus.dev/schemas/"

// SchemaVersion is the version of the data schemas; a changed field is a new version,
// never a silent rename.
const SchemaVersion = "v1"

// SchemaFile returns the file name of the JSON Schema of the data of events of type typ,
// e.g. toolbus.tool.finished.v1.json.
func SchemaFile(typ string) string { return typ + "." + SchemaVersion + ".json" }

// DataSchema returns the dataschema URI of events of type typ, e.g.
// https://toolbus.dev/schemas/toolbus.tool.finished.v1.json.
func DataSchema(typ string) string { return SchemaBaseURI + SchemaFile(typ) }

// Meta holds the CloudEvents attributes of a toolbus event.
type Meta struct {
	ID          string
	Type        string
	Source      string
	Subject     string
	Time        time.Time
	DataSchema  string
	RunID       string
	Step        int
	CallID      string
	CallIndex   int
	CallCount   int
	TraceParent string
	// HasCall is true when the call extensions (callid, callindex, callcount) are present.
	HasCall bool
}

var ceSpecs = spec.WithPrefix(headerPrefix)

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

// Decode reads a NATS message in binary or structured mode, returns its attributes and
// unmarshals its data into v (when v is not nil). Errors wrap ErrNotCloudEvent.
func Decode(msg *nats.Msg, v any) (Meta, error) {
	ev, err := DecodeEvent(msg)
	if err != nil {
		return ev.Meta, err
	}
	if v == nil {
		return ev.Meta, nil
	}
	return ev.Meta, ev.Bind(v)
}

// Event is a decoded event: its attributes and its data, not yet unmarshalled.
type Event struct {
	Meta
	// Data is the event's data (the body in binary mode, the data member in structured
	// mode) and ContentType its media type.
	Data        []byte
	ContentType string
}

// DecodeEvent reads the attributes of a NATS message in binary or structured mode.
// Errors wrap ErrNotCloudEvent.
func DecodeEvent(msg *nats.Msg) (Event, error) {
	var (
		ev  Event
		err error
	)
	if f := format.Lookup(header(msg, HeaderContentType)); f != nil && f != format.JSONBatch {
		ev.Meta, ev.Data, ev.ContentType, err = decodeStructured(msg)
	} else {
		ev.Meta, ev.Data, ev.ContentType, err = decodeBinary(msg)
	}
	return ev, err
}

// Bind unmarshals the event's JSON data into v. Errors wrap ErrNotCloudEvent.
func (e Event) Bind(v any) error {
	if e.ContentType != "" && !strings.HasPrefix(e.ContentType, ContentTypeJSON) {
		return fmt.Errorf("%w: data content type %q is not %s", ErrNotCloudEvent, e.ContentType, ContentTypeJSON)
	}
	if len(e.Data) == 0 {
		return fmt.Errorf("%w: %s event %q has no data", ErrNotCloudEvent, e.Type, e.ID)
	}
	if err := json.Unmarshal(e.Data, v); err != nil {
		return fmt.Errorf("%w: %s data: %w", ErrNotCloudEvent, e.Type, err)
	}
	return nil
}

// decodeStructured reads application/cloudevents+json with the SDK.
func decodeStructured(msg *nats.Msg) (Meta, []byte, string, error) {
	ev, err := binding.ToEvent(context.Background(), newMessage(msg))
	if err != nil {
		return Meta{}, nil, "", fmt.Errorf("%w: %w", ErrNotCloudEvent, err)
	}
	if err := ev.Validate(); err != nil {
		return Meta{}, nil, "", fmt.Errorf("%w: %w", ErrNotCloudEvent, err)
	}
	m := Meta{ID: ev.ID(), Type: ev.Type(), Source: ev.Source(), Subject: ev.Subject(), Time: ev.Time(), DataSchema: ev.DataSchema()}
	if err := m.readExtensions(ev.Extensions()); err != nil {
		return m, nil, "", err
	}
	return m, ev.Data(), ev.DataContentType(), nil
}

// decodeBinary reads a binary-mode message: the ce-* headers fill an SDK
// EventContextV1, which the SDK validates. A message that passes the same checks made
// directly (decodeBinaryDirect) is read without building the SDK's context.
func decodeBinary(msg *nats.Msg) (Meta, []byte, string, error) {
	var m Meta
	if header(msg, headerPrefix+"specversion") != event.CloudEventsVersionV1 {
		return m, nil, "", fmt.Errorf("%w: no %sspecversion 1.0 header and not structured mode", ErrNotCloudEvent, headerPrefix)
	}
	if m, ct, ok := decodeBinaryDirect(msg); ok {
		return m, msg.Data, ct, nil
	}
	return decodeBinarySDK(msg)
}

// contentTypeAttr is the name binaryAttributes gives the Content-Type header (a
// CloudEvents attribute name has no '-', so it cannot collide with one).
const contentTypeAttr = "content-type"

// binaryAttributes yields the CloudEvents attributes of a binary-mode message: the name
// of each ce- header in lower case without its prefix, and its first value; the
// Content-Type header is yielded as contentTypeAttr. Both decode paths read the headers
// through it, so they agree on which headers count. NATS header names keep their case,
// so one attribute may come twice ("ce-step" and "Ce-Step"); which one counts must not
// depend on the map's order: the lower-case one, else the smallest name.
func binaryAttributes(msg *nats.Msg) iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for k, vs := range msg.Header {
			if len(vs) == 0 {
				continue
			}
			var name string
			switch {
			case len(k) == len(contentTypeAttr) && strings.EqualFold(k, contentTypeAttr):
				name = contentTypeAttr
			case len(k) > len(headerPrefix) && strings.EqualFold(k[:len(headerPrefix)], headerPrefix):
				name = strings.ToLower(k[len(headerPrefix):])
			default:
				continue
			}
			if shadowed(msg.Header, k) {
				continue
			}
			if !yield(name, vs[0]) {
				return
			}
		}
	}
}

// shadowed reports whether another header of h names the same attribute as k and takes
// precedence: a lower-case k never is shadowed; another k is by the lower-case name or a
// smaller name equal to it but for case.
func shadowed(h nats.Header, k string) bool {
	lower := true
	for i := 0; i < len(k); i++ {
		if 'A' <= k[i] && k[i] <= 'Z' {
			lower = false
			break
		}
	}
	if lower {
		return false
	}
	for k2, vs := range h {
		if len(vs) > 0 && k2 != k && len(k2) == len(k) && strings.EqualFold(k2, k) && (k2 < k || k2 == strings.ToLower(k)) {
			return true
		}
	}
	return false
}

// decodeBinarySDK is decodeBinary through the SDK's EventContextV1 and its checks.
func decodeBinarySDK(msg *nats.Msg) (Meta, []byte, string, error) {
	var m Meta
	ec := &event.EventContextV1{}
	exts := map[string]any{}
	ct := ""
	for name, val := range binaryAttributes(msg) {
		var err error
		switch name {
		case contentTypeAttr:
			ct = val
		case "specversion":
		case "id":
			err = ec.SetID(val)
		case "source":
			err = ec.SetSource(val)
		case "type":
			err = ec.SetType(val)
		case "subject":
			err = ec.SetSubject(val)
		case "time":
			var ts *types.Timestamp
			if ts, err = types.ParseTimestamp(val); err == nil && ts != nil {
				ec.Time = ts
			}
		case "dataschema":
			err = ec.SetDataSchema(val)
		case "datacontenttype":
			ct = val
		default:
			exts[name] = val
		}
		if err != nil {
			return m, nil, "", fmt.Errorf("%w: attribute %s: %w", ErrNotCloudEvent, name, err)
		}
	}
	if err := ec.Validate(); err != nil {
		return m, nil, "", fmt.Errorf("%w: %w", ErrNotCloudEvent, err)
	}
	m = Meta{ID: ec.ID, Type: ec.Type, Source: ec.Source.String()}
	if ec.Subject != nil {
		m.Subject = *ec.Subject
	}
	if ec.Time != nil {
		m.Time = ec.Time.Time
	}
	if ec.DataSchema != nil {
		m.DataSchema = ec.DataSchema.String()
	}
	if err := m.readExtensions(exts); err != nil {
		return m, nil, "", err
	}
	return m, msg.Data, ct, nil
}

// decodeBinaryDirect reads the attributes of a binary-mode message as decodeBinary's
// SDK path does (the same trimming, URI normalisation and checks, the source and
// dataschema checked with the SDK once per distinct value), into Meta directly. ok is
// false for anything that path would refuse: it then reports the error.
func decodeBinaryDirect(msg *nats.Msg) (m Meta, ct string, ok bool) {
	var (
		src, schema                    string
		haveSrc                        bool
		step, index, count             string
		haveStep, haveIndex, haveCount bool
	)
	for name, val := range binaryAttributes(msg) {
		switch name {
		case contentTypeAttr:
			ct = val
		case "id":
			m.ID = strings.TrimSpace(val)
		case "source":
			src, haveSrc = val, true
		case "type":
			m.Type = strings.TrimSpace(val)
		case "subject":
			m.Subject = strings.TrimSpace(val)
		case "time":
			ts, err := types.ParseTimestamp(val)
			if err != nil {
				return m, "", false
			}
			if ts != nil {
				m.Time = ts.Time
			}
		case "dataschema":
			schema = val
		case "datacontenttype":
			ct = val
		case ExtRunID:
			m.RunID = val
		case ExtTraceParent:
			m.TraceParent = val
		case ExtStep:
			step, haveStep = val, true
		case ExtCallID:
			m.CallID, m.HasCall = val, true
		case ExtCallIndex:
			index, haveIndex = val, true
		case ExtCallCount:
			count, haveCount = val, true
		}
	}
	if m.ID == "" || m.Type == "" || !haveSrc {
		return m, "", false
	}
	var err error
	n := decodedSources.get(src, readSource)
	if m.Source = n.value; !n.ok {
		return m, "", false
	}
	if n = decodedSchemas.get(schema, readSchema); !n.ok {
		return m, "", false
	}
	m.DataSchema = n.value
	atoi := func(s string, present bool) int {
		if !present || err != nil {
			return 0
		}
		var n int
		n, err = strconv.Atoi(s)
		return n
	}
	m.Step = atoi(step, haveStep)
	if m.HasCall {
		m.CallIndex = atoi(index, haveIndex)
		m.CallCount = atoi(count, haveCount)
	}
	if err != nil {
		return m, "", false
	}
	return m, ct, true
}

// decodedSources and decodedSchemas remember how the SDK reads the source and
// dataschema values met so far.
var (
	decodedSources = newMemo[string, normalized]()
	decodedSchemas = newMemo[string, normalized]()
)

type normalized struct {
	value string
	ok    bool
}

// readSource is what SetSource and Validate make of a ce-source value.
func readSource(raw string) normalized {
	ec := &event.EventContextV1{}
	if ec.SetSource(raw) != nil {
		return normalized{}
	}
	v := ec.Source.String()
	return normalized{value: v, ok: strings.TrimSpace(v) != ""}
}

// readSchema is what SetDataSchema and Validate make of a ce-dataschema value ("" for
// none).
func readSchema(raw string) normalized {
	ec := &event.EventContextV1{}
	if ec.SetDataSchema(raw) != nil {
		return normalized{}
	}
	if ec.DataSchema == nil {
		return normalized{ok: true}
	}
	return normalized{value: ec.DataSchema.String(), ok: ec.DataSchema.Validate()}
}

func (m *Meta) readExtensions(exts map[string]any) error {
	var err error
	m.RunID = extString(exts, ExtRunID)
	m.TraceParent = extString(exts, ExtTraceParent)
	if m.Step, err = extInt(exts, ExtStep); err != nil {
		return err
	}
	if _, ok := exts[ExtCallID]; ok {
		m.HasCall = true
		m.CallID = extString(exts, ExtCallID)
		if m.CallIndex, err = extInt(exts, ExtCallIndex); err != nil {
			return err
		}
		if m.CallCount, err = extInt(exts, ExtCallCount); err != nil {
			return err
		}
	}
	return nil
}

func extString(exts map[string]any, name string) string {
	v, ok := exts[name]
	if !ok {
		return ""
	}
	s, err := types.ToString(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return s
}

// extInt reads an integer extension; binary mode carries it as a string.
func extInt(exts map[string]any, name string) (int, error) {
	v, ok := exts[name]
	if !ok {
		return 0, nil
	}
	switch x := v.(type) {
	case int32:
		return int(x), nil
	case string:
		n, err := strconv.Atoi(x)
		if err != nil {
			return 0, fmt.Errorf("%w: extension %s=%q is not an integer", ErrNotCloudEvent, name, x)
		}
		return n, nil
	}
	n, err := types.ToInteger(v)
	if err != nil {
		return 0, fmt.Errorf("%w: extension %s: %w", ErrNotCloudEvent, name, err)
	}
	return int(n), nil
}

// message adapts a received NATS message to binding.Message. It implements
// binding.MessageMetadataReader, which binding.ToEvent requires.
type message struct {
	msg     *nats.Msg
	version spec.Version
	format  format.Format
}

var (
	_ binding.Message               = (*message)(nil)
	_ binding.MessageMetadataReader = (*message)(nil)
)

func newMessage(msg *nats.Msg) *message {
	m := &message{msg: msg}
	if f := format.Lookup(header(msg, HeaderContentType)); f != nil && f != format.JSONBatch {
		m.format = f
		return m
	}
	m.version = ceSpecs.Version(header(msg, headerPrefix+"specversion"))
	return m
}

// header reads a header case-insensitively: NATS headers keep the case they were sent with.
func header(msg *nats.Msg, name string) string {
	if msg.Header == nil {
		return ""
	}
	if v := msg.Header.Get(name); v != "" {
		return v
	}
	for k, vs := range msg.Header {
		if len(vs) > 0 && strings.EqualFold(k, name) {
			return vs[0]
		}
	}
	return ""
}

func (m *message) ReadEncoding() binding.Encoding {
	switch {
	case m.format != nil:
		return binding.EncodingStructured
	case m.version != nil:
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (m *message) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if m.format == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, m.format, bytes.NewReader(m.msg.Data))
}

func (m *message) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	if m.version == nil {
		return binding.ErrNotBinary
	}
	for k, vs := range m.msg.Header {
		if len(vs) == 0 {
			continue
		}
		lk := strings.ToLower(k)
		if lk == strings.ToLower(HeaderContentType) {
			if err := w.SetAttribute(m.version.AttributeFromKind(spec.DataContentType), vs[0]); err != nil {
				return err
			}
			continue
		}
		if !strings.HasPrefix(lk, headerPrefix) {
			continue
		}
		if attr := m.version.Attribute(lk); attr != nil {
			if err := w.SetAttribute(attr, vs[0]); err != nil {
				return err
			}
		} else if err := w.SetExtension(lk[len(headerPrefix):], vs[0]); err != nil {
			return err
		}
	}
	if len(m.msg.Data) > 0 {
		return w.SetData(bytes.NewReader(m.msg.Data))
	}
	return nil
}

func (m *message) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	if m.version == nil {
		return nil, nil
	}
	attr := m.version.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	var v string
	if k == spec.DataContentType {
		v = header(m.msg, HeaderContentType)
	} else {
		v = header(m.msg, attr.PrefixedName())
	}
	if v == "" {
		return attr, nil
	}
	return attr, v
}

func (m *message) GetExtension(name string) any {
	if v := header(m.msg, headerPrefix+name); v != "" {
		return v
	}
	return nil
}

func (m *message) Finish(error) error { return nil }

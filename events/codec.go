package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
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

// DataSchema returns the versioned schema name of the data of events of type typ.
func DataSchema(typ string) string {
	return "urn:toolbus:schema:v1:" + strings.TrimPrefix(typ, "toolbus.")
}

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
func Encode(natsSubject string, m Meta, data any) (*nats.Msg, error) {
	body, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("events: encode %s data: %w", m.Type, err)
	}
	ev, err := m.event(body)
	if err != nil {
		return nil, err
	}
	msg := nats.NewMsg(natsSubject)
	w := (*binaryWriter)(msg)
	if _, err := binding.Write(context.Background(), binding.ToMessage(ev), nil, w); err != nil {
		return nil, fmt.Errorf("events: encode %s: %w", m.Type, err)
	}
	msg.Header.Set(HeaderMsgID, m.ID)
	return msg, nil
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
	ev := event.New()
	ev.SetID(m.ID)
	ev.SetType(m.Type)
	ev.SetSource(m.Source)
	subj := m.Subject
	if subj == "" {
		subj = m.CallID
		if subj == "" {
			subj = m.RunID
		}
	}
	if subj != "" {
		ev.SetSubject(subj)
	}
	t := m.Time
	if t.IsZero() {
		t = time.Now()
	}
	ev.SetTime(t)
	ds := m.DataSchema
	if ds == "" {
		ds = DataSchema(m.Type)
	}
	ev.SetDataSchema(ds)
	if m.RunID != "" {
		ev.SetExtension(ExtRunID, m.RunID)
	}
	ev.SetExtension(ExtStep, m.Step)
	if m.HasCall || m.CallID != "" {
		ev.SetExtension(ExtCallID, m.CallID)
		ev.SetExtension(ExtCallIndex, m.CallIndex)
		ev.SetExtension(ExtCallCount, m.CallCount)
	}
	if m.TraceParent != "" {
		ev.SetExtension(ExtTraceParent, m.TraceParent)
	}
	ev.SetDataContentType(ContentTypeJSON)
	ev.DataEncoded = body
	if err := ev.Validate(); err != nil {
		return nil, fmt.Errorf("events: invalid event %q: %w", m.ID, err)
	}
	return &ev, nil
}

// Decode reads a NATS message in binary or structured mode, returns its attributes and
// unmarshals its data into v (when v is not nil). Errors wrap ErrNotCloudEvent.
func Decode(msg *nats.Msg, v any) (Meta, error) {
	ev, err := binding.ToEvent(context.Background(), newMessage(msg))
	if err != nil {
		return Meta{}, fmt.Errorf("%w: %w", ErrNotCloudEvent, err)
	}
	if err := ev.Validate(); err != nil {
		return Meta{}, fmt.Errorf("%w: %w", ErrNotCloudEvent, err)
	}
	m := Meta{
		ID: ev.ID(), Type: ev.Type(), Source: ev.Source(), Subject: ev.Subject(),
		Time: ev.Time(), DataSchema: ev.DataSchema(),
	}
	exts := ev.Extensions()
	m.RunID = extString(exts, ExtRunID)
	m.TraceParent = extString(exts, ExtTraceParent)
	if m.Step, err = extInt(exts, ExtStep); err != nil {
		return m, err
	}
	if _, ok := exts[ExtCallID]; ok {
		m.HasCall = true
		m.CallID = extString(exts, ExtCallID)
		if m.CallIndex, err = extInt(exts, ExtCallIndex); err != nil {
			return m, err
		}
		if m.CallCount, err = extInt(exts, ExtCallCount); err != nil {
			return m, err
		}
	}
	if v != nil {
		if ct := ev.DataContentType(); ct != "" && !strings.HasPrefix(ct, ContentTypeJSON) {
			return m, fmt.Errorf("%w: data content type %q is not %s", ErrNotCloudEvent, ct, ContentTypeJSON)
		}
		if len(ev.Data()) == 0 {
			return m, fmt.Errorf("%w: %s event %q has no data", ErrNotCloudEvent, m.Type, m.ID)
		}
		if err := json.Unmarshal(ev.Data(), v); err != nil {
			return m, fmt.Errorf("%w: %s data: %w", ErrNotCloudEvent, m.Type, err)
		}
	}
	return m, nil
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

// binaryWriter writes binary-mode attributes into a NATS message's headers.
type binaryWriter nats.Msg

var _ binding.BinaryWriter = (*binaryWriter)(nil)

func (w *binaryWriter) Start(context.Context) error { return nil }
func (w *binaryWriter) End(context.Context) error   { return nil }

func (w *binaryWriter) SetAttribute(attr spec.Attribute, value any) error {
	if value == nil {
		return nil
	}
	s, err := types.Format(value)
	if err != nil {
		return err
	}
	if attr.Kind() == spec.DataContentType {
		w.Header.Set(HeaderContentType, s)
		return nil
	}
	w.Header.Set(headerPrefix+attr.Name(), s)
	return nil
}

func (w *binaryWriter) SetExtension(name string, value any) error {
	if value == nil {
		return nil
	}
	s, err := types.Format(value)
	if err != nil {
		return err
	}
	w.Header.Set(headerPrefix+name, s)
	return nil
}

func (w *binaryWriter) SetData(r io.Reader) error {
	b, err := io.ReadAll(r)
	w.Data = b
	return err
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

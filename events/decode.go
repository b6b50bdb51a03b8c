package events

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"strings"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"
)

// Decoding an event in binary or structured mode, and which ce- headers count as its
// attributes; the SDK path here is the reference the direct path must match.

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

package events

import (
	"bytes"
	"context"
	"strings"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/nats-io/nats.go"
)

// A received NATS message as the SDK's binding.Message, for the SDK decoding path.

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

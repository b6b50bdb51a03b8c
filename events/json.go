package events

import (
	"encoding/json"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func unmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func natsMsg(m jetstream.Msg) *nats.Msg {
	return &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}
}

// DecodeMsg decodes a consumed JetStream message into v; errors wrap ErrNotCloudEvent.
func DecodeMsg(msg jetstream.Msg, v any) (Meta, error) {
	return Decode(natsMsg(msg), v)
}

// DecodeEventMsg decodes the attributes of a consumed message and keeps its data for
// a later Bind, so a consumer that switches on the type reads the headers once.
func DecodeEventMsg(msg jetstream.Msg) (Event, error) {
	return DecodeEvent(natsMsg(msg))
}

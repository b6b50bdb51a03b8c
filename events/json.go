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

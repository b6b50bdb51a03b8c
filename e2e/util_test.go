package e2e_test

import (
	"encoding/json"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func jsonUnmarshalData(raw *jetstream.RawStreamMsg, v any) error {
	_, err := events.Decode(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, v)
	return err
}

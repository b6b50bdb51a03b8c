package intake_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/intake/intaketest"
)

// TestOutsiderMalformedHeaders: team alpha hides an instruction to the stream in a
// header the service knows by another spelling (nats-rollup, NATS-TTL,
// nats-expected-last-msg-id: nats-server reads its headers by their exact names, and a
// service that matched them loosely could pass one it means to refuse), a status line a
// reader would take the stored message's answer for (Status 404, Description), the
// server's Nats-Request-Info naming another account, an allowed header sent twice, and
// a key of another bucket's form: each is refused 400 by the write service and nothing
// is stored. CONTROL: the same write with only toolbus's headers is stored, with
// Nats-Request-Info dropped (the server's word to the service, never stored).
func TestOutsiderMalformedHeaders(t *testing.T) {
	srv := intaketest.StartTenants(t, map[string][]string{"alpha": {"calc"}, "beta": {"search"}}, nil)
	ctx := eventstest.Context(t, time.Minute)
	core := provisionedCore(t, ctx, srv)
	js, err := jetstream.New(core)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := js.Stream(ctx, "KV_toolbus_claims")
	if err != nil {
		t.Fatal(err)
	}
	alpha := eventstest.Connect(t, srv, "alpha")
	write := func(key string, h nats.Header) answer {
		t.Helper()
		r, err := alpha.RequestMsgWithContext(ctx, &nats.Msg{Subject: "$KV.toolbus_claims." + key, Header: h, Data: []byte(`"v"`)})
		if err != nil {
			t.Fatalf("write %s: %v", key, err)
		}
		var a answer
		if err := json.Unmarshal(r.Data, &a); err != nil {
			t.Fatalf("write %s: %v: %s", key, err, r.Data)
		}
		return a
	}
	for i, h := range []nats.Header{
		{"nats-rollup": {"all"}}, {"NATS-ROLLUP": {"sub"}}, {"NATS-TTL": {"1s"}}, {"nats-expected-last-msg-id": {"x"}},
		{"Nats-Expected-Last-Subject-Sequence": {"0", "0"}}, {"Status": {"404"}}, {"Description": {"No Messages"}},
		{"KV-Operation": {"PURGE"}}, {"kv-operation": {"DEL"}}, {"Nats-Msg-Id": {"calc.r1.0.c1"}},
	} {
		key := "calc.r1.0.m" + string(rune('a'+i))
		a := write(key, h)
		if a.Error == nil || a.Error.Code != 400 || a.Error.ErrCode != events.WriteRefusedErrCode {
			t.Errorf("HOLE: alpha's write with %v is not refused: %+v", h, a)
		}
		if _, err := claims.GetLastMsgForSubject(ctx, "$KV.toolbus_claims."+key); err == nil {
			t.Errorf("HOLE: alpha's write with %v is stored", h)
		}
	}
	if a := write("calc.r1.0.ok", nats.Header{"Nats-Request-Info": {`{"acc":"CORE"}`}}); a.Error != nil || a.Seq == 0 {
		t.Fatalf("control: alpha's plain write: %+v", a.Error)
	}
	m, err := claims.GetLastMsgForSubject(ctx, "$KV.toolbus_claims.calc.r1.0.ok")
	if err != nil {
		t.Fatalf("control: alpha's plain write is not stored: %v", err)
	}
	if v := m.Header.Get("Nats-Request-Info"); v != "" {
		t.Errorf("the server's Nats-Request-Info is stored with alpha's write: %q", v)
	}
}

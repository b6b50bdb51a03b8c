package events

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events/seal"
)

// The direct reading of binary-mode attributes accepts exactly what the SDK path
// accepts and reads the same attributes from it.
func TestDecodeBinaryDirectMatchesSDK(t *testing.T) {
	good, err := Encode("toolbus.r.tool.finished.x", Meta{ID: "r/0/c/tool.finished", Type: TypeToolFinished,
		Source: "/toolbus/executor/e1", RunID: "r", Step: 3, CallID: "c", CallIndex: 1, CallCount: 2, HasCall: true,
		TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Time: time.Unix(1700000000, 123456789)}, map[string]int{"a": 1})
	if err != nil {
		t.Fatal(err)
	}
	with := func(kv ...string) *nats.Msg {
		h := nats.Header{}
		for k, v := range good.Header {
			h[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == "<none>" {
				delete(h, kv[i])
				continue
			}
			h[kv[i]] = []string{kv[i+1]}
		}
		return &nats.Msg{Subject: "s", Header: h, Data: good.Data}
	}
	cases := []*nats.Msg{
		good,
		with("ce-id", "  spaced  "), with("ce-id", " "), with("ce-id", "<none>"),
		with("ce-type", ""), with("ce-type", " t "),
		with("ce-source", ""), with("ce-source", "<none>"), with("ce-source", "::bad"), with("ce-source", "http://x/ y"),
		with("ce-source", "urn:a:b"), with("ce-source", "HTTP://Example.com/%7Ea"),
		with("ce-dataschema", ""), with("ce-dataschema", "<none>"), with("ce-dataschema", "relative/path"),
		with("ce-dataschema", "::bad"), with("ce-dataschema", " https://x/s.json "),
		with("ce-subject", " "), with("ce-subject", "<none>"),
		with("ce-time", "yesterday"), with("ce-time", ""), with("ce-time", "<none>"),
		with("ce-step", ""), with("ce-step", "x"), with("ce-step", "<none>"), with("ce-step", "-4"),
		with("ce-callid", "<none>"), with("ce-callid", ""), with("ce-callindex", "1.5"), with("ce-callcount", "<none>"),
		with("ce-runid", "<none>"), with("ce-traceparent", "<none>"), with("ce-other", "v"),
		with("CE-ID", "upper", "ce-id", "<none>"), with("Ce-Step", "7", "ce-step", "<none>"),
		with("Content-Type", "<none>", "ce-datacontenttype", "text/plain"), with("content-type", "application/json; x=y", "Content-Type", "<none>"),
	}
	for i, msg := range cases {
		if err := directMatchesSDK(msg); err != "" {
			t.Errorf("case %d: %s", i, err)
		}
	}
}

// directMatchesSDK compares the two decode paths on msg: "" when they agree.
func directMatchesSDK(msg *nats.Msg) string {
	dm, dct, ok := decodeBinaryDirect(msg)
	sm, sdata, sct, serr := decodeBinarySDK(msg)
	switch {
	case !ok && serr == nil:
		return fmt.Sprintf("refused directly, accepted by the SDK path as %+v", sm)
	case ok && serr != nil:
		return fmt.Sprintf("accepted directly as %+v, refused by the SDK path: %v", dm, serr)
	case ok && (!reflect.DeepEqual(dm, sm) || dct != sct || string(sdata) != string(msg.Data)):
		return fmt.Sprintf("direct %+v %q, SDK %+v %q", dm, dct, sm, sct)
	}
	return ""
}

// FuzzDecodeBinaryDirect: whatever the attribute values, the direct reading accepts
// exactly what the SDK path accepts and reads the same Meta.
func FuzzDecodeBinaryDirect(f *testing.F) {
	f.Add("r/0/c/tool.finished", "toolbus.tool.finished", "/toolbus/executor/e1", "", "c", "2023-11-14T22:13:20.123456789Z", "3", "1", "Ce-Step")
	f.Add(" ", "t", "::bad", "relative/path", " ", "yesterday", "x", "1.5", "CE-ID")
	f.Add("id", "t", "HTTP://Example.com/%7Ea", " https://x/s.json ", "", "", "-4", "", "content-type")
	f.Fuzz(func(t *testing.T, id, typ, source, schema, subject, tm, step, index, extra string) {
		h := nats.Header{
			"ce-specversion": {"1.0"}, "ce-id": {id}, "ce-type": {typ}, "ce-source": {source},
			"ce-dataschema": {schema}, "ce-subject": {subject}, "ce-time": {tm}, "ce-step": {step},
			"ce-callid": {"c"}, "ce-callindex": {index}, "ce-callcount": {"2"}, "Content-Type": {ContentTypeJSON},
		}
		h[extra] = []string{id} // a header of any name: an attribute again in other case, or none
		if err := directMatchesSDK(&nats.Msg{Subject: "s", Header: h, Data: []byte(`{}`)}); err != "" {
			t.Fatal(err)
		}
	})
}

// TestSealOnlyWhenSigning: a bus without a signing key names no previous event (its
// digest is not computed); with one, the event names its parent and is signed.
func TestSealOnlyWhenSigning(t *testing.T) {
	parent, err := Encode("toolbus.r.tool.requested.x", Meta{ID: "r/0/c/tool.requested", Type: TypeToolRequested,
		Source: "/toolbus/planner/p", RunID: "r", CallID: "c", HasCall: true}, map[string]int{"a": 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := seal.WithParent(context.Background(), parent.Header, parent.Data)
	m := Meta{ID: "r/0/c/tool.finished", Type: TypeToolFinished, Source: "/toolbus/executor/e", RunID: "r", CallID: "c", HasCall: true}
	b := &Bus{}
	msg, err := b.encode(ctx, "toolbus.r.tool.finished.x", m, map[string]int{"b": 2})
	if err != nil {
		t.Fatal(err)
	}
	if v := msg.Header[seal.HeaderPrevDigest]; v != nil {
		t.Fatalf("unsigned bus: prevdigest %v", v)
	}
	kf, _ := seal.NewKeyFile("team.x")
	b.SetSigner(seal.SignerOf(kf))
	if msg, err = b.encode(ctx, "toolbus.r.tool.finished.x", m, map[string]int{"b": 2}); err != nil {
		t.Fatal(err)
	}
	if got, want := msg.Header.Get(seal.HeaderPrevDigest), seal.Digest(parent.Header, parent.Data); got != want {
		t.Fatalf("signed bus: prevdigest %q, want %q", got, want)
	}
	if _, err := seal.Verify(msg.Header, msg.Data, func(string) (ed25519.PublicKey, bool) { return kf.Public(), true }); err != nil {
		t.Fatal(err)
	}
}

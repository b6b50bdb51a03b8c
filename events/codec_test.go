package events_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

func sampleMeta() events.Meta {
	return events.Meta{
		ID: events.IDToolFinished("run-1", 2, "call_01"), Type: events.TypeToolFinished,
		Source: events.Source("executor", "e1"), RunID: "run-1", Step: 2, CallID: "call_01",
		CallIndex: 1, CallCount: 3, HasCall: true, Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
}

func TestCodecRoundTrip(t *testing.T) {
	res := toolbus.ToolFinished{RunID: "run-1", Step: 2, CallIndex: 1, CallCount: 3, ToolResult: toolbus.ToolResult{
		CallID: "call_01", Tool: "lookup_incident", Status: toolbus.StatusFailed, Content: "x",
		Error: &toolbus.ToolError{Code: "incident_not_found", Message: "no incident INC-404"},
	}}
	encoders := []struct {
		name string
		enc  func(string, events.Meta, any) (*nats.Msg, error)
		mode string
	}{
		{"binary", events.Encode, "binary"},
		{"structured", events.EncodeStructured, "structured"},
	}
	for _, e := range encoders {
		t.Run(e.name, func(t *testing.T) {
			m := sampleMeta()
			msg, err := e.enc("toolbus.run-1.tool.finished.lookup_incident", m, res)
			if err != nil {
				t.Fatal(err)
			}
			if got := msg.Header.Get(events.HeaderMsgID); got != m.ID {
				t.Fatalf("Nats-Msg-Id %q, want %q", got, m.ID)
			}
			if e.mode == "binary" {
				for h, want := range map[string]string{"ce-id": m.ID, "ce-type": m.Type, "ce-source": m.Source,
					"ce-specversion": "1.0", "ce-subject": "call_01", "ce-runid": "run-1", "ce-step": "2",
					"ce-callindex": "1", "ce-callcount": "3", "Content-Type": "application/json",
					"ce-dataschema": "https://toolbus.dev/schemas/toolbus.tool.finished.v1.json"} {
					if got := msg.Header.Get(h); got != want {
						t.Errorf("header %s = %q, want %q", h, got, want)
					}
				}
			} else if ct := msg.Header.Get("Content-Type"); ct != "application/cloudevents+json" {
				t.Fatalf("structured content type %q", ct)
			}
			var got toolbus.ToolFinished
			meta, err := events.Decode(msg, &got)
			if err != nil {
				t.Fatal(err)
			}
			m.Subject = "call_01"
			m.DataSchema = events.DataSchema(m.Type)
			if meta.ID != m.ID || meta.Type != m.Type || meta.Source != m.Source || meta.RunID != m.RunID ||
				meta.Step != m.Step || meta.CallID != m.CallID || meta.CallIndex != m.CallIndex ||
				meta.CallCount != m.CallCount || !meta.Time.Equal(m.Time) || meta.TraceParent != m.TraceParent ||
				meta.Subject != m.Subject || meta.DataSchema != m.DataSchema || !meta.HasCall {
				t.Fatalf("meta\n got %+v\nwant %+v", meta, m)
			}
			if got.ToolResult.Error == nil || got.ToolResult.Error.Code != "incident_not_found" || got.CallCount != 3 {
				t.Fatalf("data %+v", got)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	good, err := events.Encode("toolbus.r.model.requested", events.Meta{ID: "r/0/model.requested", Type: events.TypeModelRequested, Source: "/t", RunID: "r"}, toolbus.ModelRequested{RunID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		msg  *nats.Msg
	}{
		{"no headers", &nats.Msg{Subject: "s", Data: []byte("hello")}},
		{"json but not an event", &nats.Msg{Subject: "s", Data: []byte(`{"a":1}`)}},
		{"structured garbage", &nats.Msg{Subject: "s", Header: nats.Header{"Content-Type": {"application/cloudevents+json"}}, Data: []byte("{nope")}},
		{"binary without id", func() *nats.Msg {
			m := &nats.Msg{Subject: "s", Header: nats.Header{}, Data: good.Data}
			for k, v := range good.Header {
				if k != "ce-id" {
					m.Header[k] = v
				}
			}
			return m
		}()},
		{"binary with garbage data", &nats.Msg{Subject: "s", Header: good.Header, Data: []byte("\x00garbage")}},
		{"step not an integer", func() *nats.Msg {
			m := &nats.Msg{Subject: "s", Header: nats.Header{}, Data: good.Data}
			for k, v := range good.Header {
				m.Header[k] = v
			}
			m.Header.Set("ce-step", "two")
			return m
		}()},
		{"not json content", func() *nats.Msg {
			m := &nats.Msg{Subject: "s", Header: nats.Header{}, Data: good.Data}
			for k, v := range good.Header {
				m.Header[k] = v
			}
			m.Header.Set("Content-Type", "text/plain")
			return m
		}()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var v toolbus.ModelRequested
			_, err := events.Decode(tc.msg, &v)
			if !errors.Is(err, events.ErrNotCloudEvent) {
				t.Fatalf("err %v, want ErrNotCloudEvent", err)
			}
		})
	}
}

// A consumer must accept header names in any case (NATS keeps them as sent).
func TestDecodeHeaderCase(t *testing.T) {
	msg, err := events.Encode("toolbus.r.model.requested", events.Meta{ID: "x", Type: events.TypeModelRequested, Source: "/t", RunID: "r", Step: 4}, toolbus.ModelRequested{RunID: "r", Step: 4})
	if err != nil {
		t.Fatal(err)
	}
	up := &nats.Msg{Subject: msg.Subject, Header: nats.Header{}, Data: msg.Data}
	for k, v := range msg.Header {
		up.Header[strings.ToUpper(k[:1])+k[1:]] = v
	}
	meta, err := events.Decode(up, nil)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Step != 4 || meta.RunID != "r" {
		t.Fatalf("meta %+v", meta)
	}
}

func TestEncodeValidates(t *testing.T) {
	if _, err := events.Encode("s", events.Meta{Type: events.TypeRunStarted, Source: "/t"}, 1); err == nil {
		t.Fatal("an event without id was encoded")
	}
	if _, err := events.Encode("s", events.Meta{ID: "x", Type: events.TypeRunStarted, Source: "/t"}, func() {}); err == nil {
		t.Fatal("unmarshalable data was encoded")
	}
}

func FuzzDecode(f *testing.F) {
	good, _ := events.Encode("toolbus.r.tool.finished.x", sampleMeta(), toolbus.ToolFinished{RunID: "r"})
	f.Add(good.Data, "application/json", "1.0", "2")
	f.Add([]byte(`{"specversion":"1.0","id":"x","type":"t","source":"/s","data":{}}`), "application/cloudevents+json", "", "")
	f.Add([]byte("\xff\xfe"), "", "1.0", "-1")
	f.Fuzz(func(t *testing.T, data []byte, ct, spec, step string) {
		h := nats.Header{}
		for k, v := range good.Header {
			h[k] = v
		}
		h.Set("Content-Type", ct)
		h.Set("ce-specversion", spec)
		h.Set("ce-step", step)
		var tf toolbus.ToolFinished
		_, err := events.Decode(&nats.Msg{Subject: "s", Header: h, Data: data}, &tf)
		if err != nil && !errors.Is(err, events.ErrNotCloudEvent) {
			t.Fatalf("error does not wrap ErrNotCloudEvent: %v", err)
		}
	})
}

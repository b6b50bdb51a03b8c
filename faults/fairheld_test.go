package faults_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/fair"
)

// fairHeldProbes: what the fair scheduler holds of a tool is the core's to see whole; a
// client bound to alice sees alice's held calls and nothing of bob's. The core stores
// calls of a tool nobody serves for alice and for bob (held beyond the lookahead);
// alice's credentials then ask every tenant's subject and bob's: in one account the
// server refuses both (a permissions violation, no answer); in the accounts layout
// (accounts) her account imports neither (no responders). Her own subject answers with
// her calls only. Controls: the admin's credentials get both tenants on the first and
// bob's on the second; in the accounts layout bob's own credentials get his.
func fairHeldProbes(t *testing.T, url string, creds func(user string) string, accounts bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := nats.Connect(url, nats.UserCredentials(creds("admin")))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	bus, err := events.Open(ctx, admin, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const tool = "held-probe"
	for _, who := range []string{"alice", "bob"} {
		for i := range 4 {
			tr := toolbus.ToolRequested{RunID: "held-" + who, Step: 0, CallIndex: i, CallCount: 4, Principal: toolbus.Principal{ID: who},
				Call: toolbus.ToolCall{CallID: fmt.Sprintf("c%d", i), Tool: tool, Arguments: "{}"}}
			if _, err := bus.PublishEvent(ctx, events.ToolRequestedEvent(events.Source("faults", "test"), tr, true)); err != nil {
				t.Fatal(err)
			}
		}
	}
	ask := func(nc *nats.Conn, subject string) ([]fair.Held, error) {
		msg, err := nc.Request(subject, nil, 3*time.Second)
		if err != nil {
			return nil, err
		}
		var hs []fair.Held
		return hs, json.Unmarshal(msg.Data, &hs)
	}
	tenants := func(hs []fair.Held) string {
		var out []string
		for _, h := range hs {
			out = append(out, h.Tenant)
		}
		return strings.Join(out, ",")
	}
	// The control: the core sees both tenants' held calls once the scheduler read them.
	deadline := time.Now().Add(time.Minute)
	for {
		hs, err := ask(admin, events.FairHeldSubject(tool))
		if err == nil && tenants(hs) == "alice,bob" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the admin's view of %s: %+v (%v), want alice's and bob's held calls", tool, hs, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if hs, err := ask(admin, events.FairHeldForSubject(tool, "bob")); err != nil || tenants(hs) != "bob" {
		t.Fatalf("the admin's view of bob's calls: %+v (%v), want bob's", hs, err)
	}
	var mu sync.Mutex
	var denied []string
	alice, err := nats.Connect(url, nats.UserCredentials(creds(natsjwt.ClientUser("alice"))),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			denied = append(denied, err.Error())
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	hs, err := ask(alice, events.FairHeldForSubject(tool, "alice"))
	if err != nil || tenants(hs) != "alice" || hs[0].Queued+hs[0].InFlight != 4 {
		t.Fatalf("alice's view of her own calls: %+v (%v), want her 4 calls only", hs, err)
	}
	if accounts {
		bob, err := nats.Connect(url, nats.UserCredentials(creds(natsjwt.ClientUser("bob"))))
		if err != nil {
			t.Fatal(err)
		}
		defer bob.Close()
		if hs, err := ask(bob, events.FairHeldForSubject(tool, "bob")); err != nil || tenants(hs) != "bob" {
			t.Fatalf("bob's view of his own calls through his import: %+v (%v), want his", hs, err)
		}
	}
	for _, subject := range []string{events.FairHeldSubject(tool), events.FairHeldForSubject(tool, "bob")} {
		if hs, err := ask(alice, subject); err == nil {
			t.Fatalf("client alice asked %s and got %+v: another tenant's held calls", subject, hs)
		} else if accounts {
			if !errors.Is(err, nats.ErrNoResponders) {
				t.Fatalf("client alice's %s across accounts: %v, want no responders (not imported)", subject, err)
			}
			continue
		}
		mu.Lock()
		got := strings.Join(denied, "; ")
		mu.Unlock()
		if !strings.Contains(strings.ToLower(got), "permissions violation") || !strings.Contains(got, subject) {
			t.Fatalf("client alice's %s: no permissions violation from the server (%q)", subject, got)
		}
	}
}

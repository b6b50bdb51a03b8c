package store_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/store"
)

// A contract over MaxContractBytes (one team's 854 KiB description went into every
// model request of every run) is refused by PublishTool and, written into the bucket
// directly, ignored by every reader of the catalog; one within the bound is kept.
func TestCatalogBoundsContracts(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	huge := toolbus.ToolContract{Name: "huge", Description: strings.Repeat("x", store.MaxContractBytes), InputSchema: json.RawMessage(`{"type":"object"}`)}
	if err := bus.Store().PublishTool(ctx, huge, false); !errors.Is(err, store.ErrContractTooLarge) {
		t.Fatalf("PublishTool of %d bytes: %v, want ErrContractTooLarge", len(huge.Description), err)
	}
	kv, err := bus.JetStream().KeyValue(ctx, store.BucketTools)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(huge)
	if _, err := kv.Put(ctx, "huge", b); err != nil {
		t.Fatal(err)
	}
	fine := toolbus.ToolContract{Name: "fine", Description: strings.Repeat("y", 1000), InputSchema: json.RawMessage(`{"type":"object"}`)}
	if err := bus.Store().PublishTool(ctx, fine, false); err != nil {
		t.Fatal(err)
	}
	cat, err := bus.Store().WatchCatalog(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cat.Lookup("fine"); !ok {
		t.Fatal("a contract within the bound is missing")
	}
	if _, ok := cat.Lookup("huge"); ok {
		t.Fatal("the catalog holds a contract over the bound")
	}
	if _, ok := cat.Resolve(ctx, "huge"); ok {
		t.Fatal("Resolve read a contract over the bound")
	}
}

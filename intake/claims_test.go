package intake_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/intake/intaketest"
)

// TestTenantClaimsAreBounded: the claims bucket is shared by every team, keeps a claim
// as long as the events, and has no bound of its own. Team alpha writes claims of its
// own tool (new run ids each, every key of a shape toolbus writes) with no byte rate to
// stop it: the write service refuses it at its claims share with 507 store_full naming
// TOOLBUS_TENANT_CLAIMS_BYTES, and the refused claim is not stored. Controls: alpha's
// claims under the share were stored, its result on the event stream (a share of its
// own) and team beta's claim, written afterwards, are stored. Without the share alpha
// wrote claims without end.
func TestTenantClaimsAreBounded(t *testing.T) {
	const share, size = 64 << 10, 1000
	lim := intake.Limits{ClaimsShare: intake.StreamShare{Bytes: share, Window: time.Hour}}
	srv := intaketest.StartTenantsLimited(t, map[string][]string{"alpha": {"calc"}, "beta": {"search"}}, nil, lim)
	ctx := eventstest.Context(t, time.Minute)
	core := provisionedCore(t, ctx, srv)
	alpha, beta := eventstest.Connect(t, srv, "alpha"), eventstest.Connect(t, srv, "beta")
	claim := func(tool string, i int) string {
		return "$KV." + store.BucketClaims + "." + store.ClaimKey(tool, fmt.Sprintf("r%d", i), 0, "c1")
	}
	value := `{"instance":"` + strings.Repeat("i", size) + `"}`
	var refused *answer
	stored := 0
	for i := range 4 * share / size {
		a := write(t, ctx, alpha, claim("calc", i), value, "")
		if a.Error != nil {
			refused = &a
			break
		}
		stored++
	}
	if refused == nil || refused.Error.Code != 507 || refused.Error.ErrCode != events.WriteStoreFullErrCode || !strings.Contains(refused.Error.Desc, "TOOLBUS_TENANT_CLAIMS_BYTES") {
		t.Fatalf("alpha's %d claims are not refused store_full at its claims share: %+v", stored, refused)
	}
	if stored == 0 || stored > share/size {
		t.Errorf("alpha stored %d claims of %d bytes, want some and at most its share's %d", stored, size, share/size)
	}
	t.Logf("alpha stored %d claims, then: %s", stored, refused.Error.Desc)
	js, err := jetstream.New(core)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, store.BucketClaims)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, strings.TrimPrefix(claim("calc", stored), "$KV."+store.BucketClaims+".")); err == nil {
		t.Errorf("alpha's refused claim %s is stored", claim("calc", stored))
	}
	if _, err := kv.Get(ctx, strings.TrimPrefix(claim("calc", stored-1), "$KV."+store.BucketClaims+".")); err != nil {
		t.Errorf("control: alpha's last claim under its share: %v", err)
	}
	if a := write(t, ctx, alpha, events.SubjectToolFinished("r1", "calc"), `{"ok":true}`, ""); a.Error != nil || a.Seq == 0 {
		t.Errorf("control: alpha's result beside its claims at their share: %+v", a.Error)
	}
	if a := write(t, ctx, beta, claim("search", 1), value, ""); a.Error != nil || a.Seq == 0 {
		t.Errorf("control: beta's claim beside alpha's at their share: %+v", a.Error)
	}
}

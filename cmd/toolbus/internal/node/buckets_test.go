package node

import (
	"strings"
	"testing"

	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/intake"
)

// TestTenantBucketBoundsConfig: the per-team bounds of the shared buckets are on with no
// setting (intake.DefaultBucketBounds), a setting overrides one bucket's and 0 lifts it,
// and an unknown bucket is refused with the variable named.
func TestTenantBucketBoundsConfig(t *testing.T) {
	t.Setenv("TOOLBUS_TENANT_BUCKET_KEYS", "")
	t.Setenv("TOOLBUS_TENANT_VALUE_BYTES", "")
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if c.TenantBytesPerSecond <= 0 {
		t.Errorf("TOOLBUS_TENANT_BYTES_PER_SECOND is %v with no setting: tenants' bytes are unbounded", c.TenantBytesPerSecond)
	}
	b, err := intake.BucketBounds(c.TenantBucketKeys, c.TenantValueBytes)
	if err != nil || b[store.BucketSecrets].Keys <= 0 || b[store.BucketSecrets].ValueBytes <= 0 {
		t.Fatalf("default bounds: %+v, %v", b, err)
	}
	t.Setenv("TOOLBUS_TENANT_BUCKET_KEYS", "secrets:32,outputs:0")
	if c, err = Load(); err != nil {
		t.Fatal(err)
	}
	b, _ = intake.BucketBounds(c.TenantBucketKeys, c.TenantValueBytes)
	if b[store.BucketSecrets].Keys != 32 || b[store.BucketOutputs].Keys != 0 || b[store.BucketInstances] != intake.DefaultBucketBounds[store.BucketInstances] {
		t.Errorf("overridden bounds: %+v", b)
	}
	t.Setenv("TOOLBUS_TENANT_BUCKET_KEYS", "approvals:3")
	if _, err := Load(); err == nil || !strings.Contains(err.Error(), "approvals") || !strings.Contains(err.Error(), "TOOLBUS_TENANT_BUCKET_KEYS") {
		t.Errorf("an unknown bucket: %v", err)
	}
}

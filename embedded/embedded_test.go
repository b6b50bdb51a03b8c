package embedded_test

import (
	"testing"

	"github.com/toolbus/toolbus/embedded"
)

// Strict durability reaches the running JetStream: its file stores fsync every write.
func TestSyncAlways(t *testing.T) {
	for _, strict := range []bool{false, true} {
		srv, err := embedded.Start(embedded.Config{Port: -1, StoreDir: t.TempDir(), SyncAlways: strict})
		if err != nil {
			t.Fatal(err)
		}
		got := srv.SyncAlways()
		srv.Stop()
		if got != strict {
			t.Fatalf("SyncAlways %v: the running server has sync always = %v", strict, got)
		}
	}
}

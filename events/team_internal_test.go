package events

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// testSeed is a user nkey seed made for this test only (it signs nothing anywhere).
const testSeed = "SUADEYXX4S5WE5PO4XTB3ZL7MQEKTVIIZLSVIF3AXHGKSHZSALZMGOEI2M"

// The message ids of a team account are the same in every language (the TypeScript
// package's test/units.test.ts holds the same golden values): another instance of the
// team re-publishing an event is a duplicate whatever it is written in, and the ids of
// different credentials differ.
func TestTeamMessageIDs(t *testing.T) {
	kp, err := nkeys.FromSeed([]byte(testSeed))
	if err != nil {
		t.Fatal(err)
	}
	const id = "r1/0/c1/tool.finished"
	for _, tc := range []struct {
		name string
		opts nats.Options
		want string
	}{
		{"user and password", nats.Options{User: "alpha", Password: "alpha"}, id + "/guarded/DybNudHESvt_6nimygzu_A"},
		{"token", nats.Options{Token: "s3cret"}, id + "/guarded/EktPQI2NRnPa5wzZ-96Lqg"},
		{"nkey", nats.Options{SignatureCB: kp.Sign}, id + "/guarded/NzsGKxcWiGjhsLCaUKV_mA"},
		{"none", nats.Options{}, id},
	} {
		got := (&Bus{team: true, msgKey: teamMsgKey(&nats.Conn{Opts: tc.opts})}).msgID(id)
		t.Logf("%s: %s", tc.name, got)
		if got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

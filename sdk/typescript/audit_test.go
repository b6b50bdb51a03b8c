package typescript_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/audit/checkpoint"
	"github.com/toolbus/toolbus/audit/trail"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events/seal"
	"github.com/toolbus/toolbus/planner"
)

var update = flag.Bool("update", false, "write the bundle of TestNPMAuditTrail to test/fixtures/audit-bundle.json")

// TestNPMAuditTrail: a run calling a TypeScript tool, served with the team's signing key,
// verifies with the Go verifier (every event signed by a signer allowed to publish it and
// chained), and the same run served without the key is reported unsigned, naming the
// result, as a Go executor without its key is. Then the package's own verifier
// (test/audit-verify.test.ts, written from CONTRACT.md) verifies the exported bundle and
// names the event of each tampering: proof that an auditor outside Go can verify.
func TestNPMAuditTrail(t *testing.T) {
	npm := needNPM(t)
	model := planner.ModelFunc(func(context.Context, planner.Request) (planner.Response, error) {
		return planner.Answer("done")(planner.Request{}), nil
	})
	p := testpipe.Start(t, 4*time.Minute, model)
	const tool, team = "ts_audited", "tsteam"
	dir := t.TempDir()
	from := time.Now().Add(-time.Minute)
	var ring seal.Keyring
	files := map[string]string{}
	for _, signer := range []string{"role.planner", "team." + team, "client.tester"} {
		kf, err := seal.NewKeyFile(signer)
		if err != nil {
			t.Fatal(err)
		}
		k := seal.Key{KeyID: kf.KeyID, Signer: signer, Public: kf.Public(), Created: from}
		switch signer {
		case "role.planner": // every Go role of the pipeline signs with it, on its one bus
			p.Bus.SetSigner(seal.SignerOf(kf))
		case "team." + team:
			k.Tools = map[string][]seal.Span{tool: {{From: from}}}
		case "client.tester":
			k.Identities = map[string][]seal.Span{"tester": {{From: from}}}
		}
		files[signer] = filepath.Join(dir, signer+".sign")
		if err := seal.WriteKeyFile(files[signer], kf); err != nil {
			t.Fatal(err)
		}
		ring.Keys = append(ring.Keys, k)
	}
	if _, err := seal.PublishKeyring(p.Ctx, p.Bus.JetStream(), ring); err != nil {
		t.Fatal(err)
	}
	// The core's checkpoints (signed with the planner's key at every run's end): the
	// verifier requires each event's inclusion in one.
	go func() { _ = (&checkpoint.Service{Bus: p.Bus, Interval: time.Minute}).Run(p.Ctx) }()
	ctx, cancel := context.WithTimeout(p.Ctx, 3*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, npm, "run", "build").CombinedOutput(); err != nil {
		t.Fatalf("npm run build: %v\n%s", err, out)
	}
	runs := filepath.Join(dir, "runs.json")
	cfg, _ := json.Marshal(map[string]string{"team_key": files["team."+team], "team": team, "client_key": files["client.tester"], "tool": tool, "out": runs})
	nodeTest(t, ctx, []string{"TOOLBUS_TEST_NATS_URL=" + p.Srv.URL, "TOOLBUS_TEST_AUDIT=" + string(cfg)}, "node", "--test", filepath.Join("dist", "test", "audit-sign.test.js"))
	var ran struct{ Signed, Unsigned string }
	raw, err := os.ReadFile(runs)
	if err != nil || json.Unmarshal(raw, &ran) != nil {
		t.Fatalf("the runs: %v %s", err, raw)
	}

	signed, err := trail.Collect(ctx, p.Bus, ran.Signed)
	if err != nil {
		t.Fatal(err)
	}
	res, err := trail.Verify(signed)
	if err != nil {
		t.Fatalf("the run served with the team's key: %v", err)
	}
	if !slices.Contains(res.Signers, "team."+team) || !slices.Contains(res.Signers, "client.tester") {
		t.Fatalf("signers %v: want the team's and the client's among them", res.Signers)
	}
	unsigned, err := trail.Collect(ctx, p.Bus, ran.Unsigned)
	if err != nil {
		t.Fatal(err)
	}
	_, err = trail.Verify(unsigned)
	var f *trail.Failure
	if !errors.As(err, &f) || f.Check != "signature" || !strings.HasPrefix(f.Reason, "unsigned toolbus.tool.") {
		t.Fatalf("the run served without the key: %v; want its first tool event unsigned", err)
	}
	t.Logf("served without the key: %v", f)

	bundle := filepath.Join(dir, "bundle.json")
	if *update {
		bundle = filepath.Join("test", "fixtures", "audit-bundle.json")
	}
	if err := signed.WriteFile(bundle); err != nil {
		t.Fatal(err)
	}
	nodeTest(t, ctx, []string{"TOOLBUS_TEST_AUDIT_BUNDLE=" + bundle}, "node", "--test", filepath.Join("dist", "test", "audit-verify.test.js"))
}

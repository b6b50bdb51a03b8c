package faults_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit/trail"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/seal"
)

// TestFaultAuditTrail: the signed, chained audit trail on a deployment toolbus admin
// made (the accounts layout, separate processes): every process runs with the signing
// key admin issued beside its credentials (TOOLBUS_SIGNING_KEY), team alpha's executor
// serving append_a from its own account through the write service, and the keys'
// public halves published with `toolbus admin publish-keys`. A run started by the
// client verifies with `toolbus replay --verify` and, exported with `toolbus audit
// export`, with `toolbus audit verify` (CONTROL). The bundle with one result's data
// altered fails naming that event; a result the administrator inserts into the stream
// signed with team beta's key (admin holds the deployment's files) fails replay --verify
// naming it, as not beta's tool. After `toolbus admin rotate executor-alpha` and
// publish-keys, the run signed before still verifies from a new export.
func TestFaultAuditTrail(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	a := newAccounts(t)
	e, node, gen := a.env, a.nodes[0], a.genDir
	user := func(u string) []string {
		return []string{"TOOLBUS_NATS_CREDS=" + filepath.Join(gen, u+".creds"), "TOOLBUS_SIGNING_KEY=" + filepath.Join(gen, u+".sign")}
	}
	cli := func(want int, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(e.ctx, e.toolbus, args...)
		cmd.Env = childEnv(append([]string{"TOOLBUS_NATS_URL=" + node.url(), "TOOLBUS_LOG_LEVEL=warn"}, user("admin")...))
		out, err := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != want {
			t.Fatalf("toolbus %s: exit %d (%v), want %d:\n%s", strings.Join(args, " "), code, err, want, out)
		}
		return string(out)
	}
	admin := a.admin
	admin("init", "-listen", "127.0.0.1:"+strconv.Itoa(node.port), "-store", node.store, "-core-wide")
	admin("add-team", "alpha", "append_a")
	admin("add-team", "beta", "append_b")
	a.up("append_a,append_b")
	admin("publish-keys")
	e.faultbusRole("planner", "planner-1", append(user("planner"), "TOOLBUS_MODEL=append_a:2x1")...)
	e.toolbusRole("injector", "injector-1", user("injector")...)
	e.faultbusRole("executor", "alpha-1", append(user("executor-alpha"), "TOOLBUS_TEAM=alpha", "TOOLBUS_NATS_API_PREFIX=JS.core.API",
		"TOOLBUS_EXECUTOR_TOOLS=append_a", "TOOLBUS_FAULT_APPEND_TOOLS=append_a", "TOOLBUS_FAULT_APPEND_FILE="+filepath.Join(e.dir, "side-effects"))...)
	e.waitReady([]string{"append_a"}, "planner", "injector", "executor")

	// The client: its own connection and key (client.creds, client.sign).
	nc, err := nats.Connect(node.url(), nats.UserCredentials(filepath.Join(gen, "client.creds")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	client := mustDo(events.Open(e.ctx, nc, events.Config{SigningKey: filepath.Join(gen, "client.sign")}))
	const run = "audited-1"
	if err := client.StartRun(e.ctx, events.Source("client", "faults"), toolbus.RunStarted{RunID: run, Model: "faultbus",
		Principal: toolbus.Principal{ID: "auditor"}, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "run " + run}}}); err != nil {
		t.Fatal(err)
	}
	e.waitCompleted([]string{run}, 2*time.Minute)

	t.Log(cli(0, "replay", run, "--verify"))
	bundle := filepath.Join(e.dir, run+".json")
	cli(0, "audit", "export", run, "-o", bundle)
	t.Log(cli(0, "audit", "verify", bundle))

	// Offline: one result's data altered in the bundle.
	b := mustDo(trail.ReadFile(bundle))
	i := indexOf(t, b, events.TypeToolFinished)
	var data map[string]any
	if err := json.Unmarshal(b.Events[i].Data, &data); err != nil {
		t.Fatal(err)
	}
	data["content"] = "tampered"
	b.Events[i].Data = mustDo(json.Marshal(data))
	altered := filepath.Join(e.dir, "altered.json")
	if err := b.WriteFile(altered); err != nil {
		t.Fatal(err)
	}
	out := cli(1, "audit", "verify", altered)
	if want := "event " + strconv.Itoa(i+1) + " "; !strings.Contains(out, want) || !strings.Contains(out, "signature") {
		t.Fatalf("altered bundle: %s; want %q and the signature named", out, want)
	}

	// Live: the administrator stores, signed with beta's key, a result for alpha's tool of a
	// call the core never requested: no reader counts it, so the verifier reports it as
	// foreign (the run's own events still verify) and replay flags the orphan result.
	orig := mustDo(trail.ReadFile(bundle))
	req := orig.Events[indexOf(t, orig, events.TypeToolRequested)]
	forger := mustDo(events.Open(e.ctx, e.nc, events.Config{SigningKey: filepath.Join(gen, "executor-beta.sign")}))
	forged := toolbus.ToolFinished{RunID: run, Step: 0, CallIndex: 0, CallCount: 1,
		ToolResult: toolbus.ToolResult{CallID: "forged", Tool: "append_a", Status: toolbus.StatusSucceeded, Content: "forged"}}
	if _, err := forger.PublishEvent(seal.WithParentDigest(e.ctx, seal.Digest(req.Header, req.Data)), events.ToolFinishedEvent("/toolbus/executor/beta", forged)); err != nil {
		t.Fatal(err)
	}
	out = cli(1, "replay", run, "--verify")
	if want := "event " + strconv.Itoa(len(orig.Events)+1) + " "; !strings.Contains(out, want) || !strings.Contains(out, "foreign: ignored") || !strings.Contains(out, "orphan_result") {
		t.Fatalf("forged result: %s; want %q reported foreign and the orphan result flagged", out, want)
	}

	// A rotation keeps the run signed before verifiable.
	admin("rotate", "executor-alpha")
	admin("publish-keys")
	rotated := filepath.Join(e.dir, "rotated.json")
	cli(0, "audit", "export", run, "-o", rotated)
	rb := mustDo(trail.ReadFile(rotated))
	rb.Events = rb.Events[:len(orig.Events)] // without the forged result
	if _, err := trail.Verify(rb); err != nil {
		t.Fatalf("after the rotation: %v", err)
	}
	if n := len(rb.Keys.Keys); n <= len(orig.Keys.Keys) {
		t.Fatalf("after the rotation the keyring has %d keys, before %d: no new key", n, len(orig.Keys.Keys))
	}
	if _, err := os.Stat(filepath.Join(gen, "executor-alpha.sign")); err != nil {
		t.Fatal(err)
	}
}

// indexOf is the position of the first event of type typ in b.
func indexOf(t *testing.T, b trail.Bundle, typ string) int {
	t.Helper()
	for i, r := range b.Events {
		if len(r.Header["ce-type"]) > 0 && r.Header["ce-type"][0] == typ {
			return i
		}
	}
	t.Fatalf("no %s in the trail", typ)
	return -1
}

func mustDo[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

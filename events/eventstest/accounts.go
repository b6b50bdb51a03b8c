package eventstest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// TeamAPIPrefix is the subject prefix under which a team account of AccountsConf
// imports the core account's JetStream API (TOOLBUS_NATS_API_PREFIX of its executors).
const TeamAPIPrefix = "JS.core.API"

// TeamImports renders, for one team and its tools, the service and stream exports of
// the core account (to that team only) and the team account's matching imports: what
// the accounts layout lets an executor in its team's account reach (the durables of
// its tools, their result, wait, progress, log and question subjects, their claims,
// outputs and catalog keys, the team's instance records and the last result of a
// tool in a run).
func TeamImports(team string, tools []string) (exports, imports []string) {
	svc := func(subject, local string, stream bool) {
		rt := ""
		if stream {
			rt = ", response_type: stream"
		}
		exports = append(exports, fmt.Sprintf(`{service: %q, accounts: [%s]%s}`, subject, team, rt))
		to := ""
		if local != "" {
			to = fmt.Sprintf(", to: %q", local)
		}
		imports = append(imports, fmt.Sprintf(`{service: {account: CORE, subject: %q}%s}`, subject, to))
	}
	api := func(rest string, stream bool) { svc("$JS.API."+rest, TeamAPIPrefix+"."+rest, stream) }
	for _, tool := range tools {
		d := events.ToolConsumer(tool)
		api("CONSUMER.INFO.TOOLBUS."+d, false)
		api("CONSUMER.MSG.NEXT.TOOLBUS."+d, true)
		svc("$JS.ACK.TOOLBUS."+d+".>", "", false)
		svc("$JS.ACK.*.*.TOOLBUS."+d+".>", "", false)
		for _, s := range []string{events.SubjectToolFinished("*", tool), events.SubjectToolWaiting("*", tool),
			events.SubjectToolProgress("*", tool), events.SubjectToolLog("*", tool), events.SubjectToolQuestion("*", tool)} {
			svc(s, "", false)
		}
		tok := events.ToolToken(tool)
		for _, b := range []string{store.BucketClaims, store.BucketOutputs} {
			svc("$KV."+b+"."+tok+".>", "", false)
		}
		svc("$KV."+store.BucketTools+"."+tok, "", false)
		api("DIRECT.GET.KV_"+store.BucketClaims+".$KV."+store.BucketClaims+"."+tok+".>", false)
		api("DIRECT.GET.KV_"+store.BucketTools+".$KV."+store.BucketTools+"."+tok, false)
		api("DIRECT.GET.TOOLBUS."+events.SubjectToolFinished("*", tool), false)
		req := events.SubjectToolRequested("*", tool)
		exports = append(exports, fmt.Sprintf(`{stream: %q, accounts: [%s]}`, req, team))
		imports = append(imports, fmt.Sprintf(`{stream: {account: CORE, subject: %q}}`, req))
	}
	svc("$KV."+store.BucketInstances+"."+team+".>", "", false)
	api("DIRECT.GET.KV_"+store.BucketInstances+".$KV."+store.BucketInstances+"."+team+".>", false)
	return exports, imports
}

// AccountsConf renders a server configuration of two accounts on a random loopback
// port, with JetStream stored under storeDir: CORE (JetStream, user core, password
// core), where the pipeline's roles connect, and team (user and password the team's
// name, no JetStream of its own), which reaches the core only through
// TeamImports(team, tools).
func AccountsConf(storeDir, team string, tools []string) string {
	exports, imports := TeamImports(team, tools)
	return fmt.Sprintf(`listen: 127.0.0.1:-1
jetstream { store_dir: %q }
accounts {
  CORE { jetstream: enabled, users: [{user: core, password: core}], exports: [
    %s
  ] }
  %s { users: [{user: %s, password: %s}], imports: [
    %s
  ] }
}
`, storeDir, strings.Join(exports, "\n    "), team, team, team, strings.Join(imports, "\n    "))
}

// AccountsOptions writes AccountsConf(team, tools) into dir (its JetStream store under
// dir too) and returns the server options it describes, for a process that runs the
// server itself (sdk/typescript/testbus); tests call StartAccounts.
func AccountsOptions(dir, team string, tools []string) (*server.Options, error) {
	path := filepath.Join(dir, "accounts.conf")
	if err := os.WriteFile(path, []byte(AccountsConf(filepath.Join(dir, "js"), team, tools)), 0o600); err != nil {
		return nil, fmt.Errorf("eventstest: %w", err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		return nil, fmt.Errorf("eventstest: %w", err)
	}
	return opts, nil
}

// StartAccounts starts a server of AccountsConf(team, tools) for the test (stopped
// when it ends); users core/core and team/team connect to its ClientURL.
func StartAccounts(t testing.TB, team string, tools []string) *server.Server {
	t.Helper()
	opts, err := AccountsOptions(t.TempDir(), team, tools)
	if err != nil {
		t.Fatal(err)
	}
	return StartServer(t, opts)
}

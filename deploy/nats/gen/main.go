// Command gen issues the NATS credentials of toolbus: one user per role and, from an
// administrator's grants, one executor user per team that may serve only the team's
// tools (see package natsjwt). It writes every kind NATS offers:
//
//	go run ./deploy/nats/gen [-perms deploy/nats/permissions.conf] [-grants grants.json] [-out deploy/nats/jwt]
//	                         [-listen 127.0.0.1:4222] [-store DIR]
//
// grants.json:
//
//	{"teams": {"payments": ["refund", "ledger_lookup"], "search": ["web_search"]},
//	 "clients": {"alice": ["alice"], "helpdesk": ["alice", "bob"]}}
//
// A team gets executor credentials that serve only its tools; a client entry gets client
// credentials that start runs only for, and approve, deny and cancel only as, the
// identities listed (the principal id of run.started, the who of decisions and cancels).
//
// Then run a server with one of the configs written into -out (the toolbus binary runs
// one: toolbus server -c deploy/nats/jwt/auth-jwt.conf -sd ./nats-data). They listen on
// -listen (loopback unless told otherwise) and store in -store, or where -sd says:
//
//	auth-jwt.conf     operator/JWT: give each process its <user>.creds (TOOLBUS_NATS_CREDS)
//	auth-users.conf   users and passwords (bcrypt): TOOLBUS_NATS_USER=<user>, TOOLBUS_NATS_PASSWORD=$(cat <user>.password)
//	auth-nkeys.conf   nkeys: TOOLBUS_NATS_NKEY=<user>.nk
//	k8s-secrets.yaml  one Kubernetes Secret per user (toolbus-nats-<user>: user, password, bcrypt) for deploy/k8s
//
// where <user> is a role (admin, planner, executor, injector, client),
// executor-<team> or client-<name>. The output directory holds secrets: keep it out of git.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
)

func main() {
	perms := flag.String("perms", "deploy/nats/permissions.conf", "role permissions")
	grants := flag.String("grants", "", "grants file: the tools of each team and the identities of each bound client (JSON, {\"teams\": {\"<team>\": [\"<tool>\", ...]}, \"clients\": {\"<name>\": [\"<identity>\", ...]}})")
	out := flag.String("out", "deploy/nats/jwt", "output directory (holds secrets: keep it out of git)")
	listen := flag.String("listen", natsjwt.DefaultListen, "client address (host:port) the server configs listen on; 0.0.0.0:4222 for every interface")
	storeDir := flag.String("store", "", "JetStream store directory written into the server configs (default: none, give it to the server: toolbus server -sd DIR)")
	flag.Parse()
	var g natsjwt.Grants
	if *grants != "" {
		var err error
		if g, err = natsjwt.ReadGrants(*grants); err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
	}
	res, err := natsjwt.GenerateGrants(*perms, *out, g, natsjwt.WithListen(*listen), natsjwt.WithStoreDir(*storeDir))
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
	fmt.Println("server configs:", res.Config, res.UsersConfig, res.NkeysConfig)
	fmt.Println("kubernetes secrets:", res.K8sSecrets)
	for _, u := range natsjwt.Users(nil, g) {
		fmt.Printf("%-20s %s  %s  %s\n", u.Name, res.Creds[u.Name], res.Passwords[u.Name], res.Seeds[u.Name])
	}
	// What this run changed, and whom to hand what: a directory that held a
	// deployment's keys keeps them and every credential whose permissions did not change.
	for _, c := range res.Changes {
		fmt.Printf("%-9s %s%s\n", c.What, c.User, handOut[c.What])
	}
}

var handOut = map[string]string{
	"new":     ": hand out its files; operator mode needs nothing on the server, users and nkeys a reload (nats-server --signal reload)",
	"changed": ": hand out its new files (same password and nkey); reload the server (the old JWT is revoked once it loads the new account)",
	"removed": ": its files are deleted; reload the server (users, nkeys; in operator mode its JWT is revoked)",
}

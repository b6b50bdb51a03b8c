// Command gen writes the operator/JWT setup of toolbus (see package natsjwt):
//
//	go run ./deploy/nats/gen [-perms deploy/nats/permissions.conf] [-out deploy/nats/jwt]
//
// then run nats-server -c deploy/nats/jwt/auth-jwt.conf and give each toolbus process
// its deploy/nats/jwt/<role>.creds as TOOLBUS_NATS_CREDS.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
)

func main() {
	perms := flag.String("perms", "deploy/nats/permissions.conf", "role permissions")
	out := flag.String("out", "deploy/nats/jwt", "output directory (holds secrets: keep it out of git)")
	flag.Parse()
	res, err := natsjwt.Generate(*perms, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
	fmt.Println("server config:", res.Config)
	for _, role := range natsjwt.Roles {
		fmt.Printf("%-8s %s\n", role, res.Creds[role])
	}
}

// Package natsconf carries the NATS files of deploy/nats that the credentials are issued
// from (permissions.conf, team-executor.conf and the server settings of single.conf), so
// that the toolbus binary issues them with no checkout: toolbus admin init copies them
// into a deployment's directory (package cmd/toolbus/internal/admin).
package natsconf

import "embed"

// Files holds permissions.conf, team-executor.conf and single.conf, as natsjwt.GenerateGrants
// reads them (side by side).
//
//go:embed permissions.conf team-executor.conf single.conf
var Files embed.FS

// Names are the files of Files.
var Names = []string{"permissions.conf", "team-executor.conf", "single.conf"}

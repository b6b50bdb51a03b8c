package events

import "strings"

// The team read (package reads): an executor in a team account reads the core's streams
// and buckets by direct gets in their subject form, which an export can scope to its
// own keys (accounts.TeamExports). A replicated stream or bucket serves no direct gets:
// any replica would answer one, a follower from behind the leader (provision turns them
// off), and nats-server subscribes $JS.API.DIRECT.GET.<stream>[.>] only while a stream
// allows them (stream.go, subscribeToDirect), so the team's get finds no responder. The
// core's read service then answers the same get through the leader, on
// TeamReadSubject(team, stream, subject), which the core exports to that team alone, for
// the same subjects as its direct gets; the team asks it on TeamReadLocal(stream,
// subject), which its import maps there.

// TeamReadPrefix is the first token of the team read's subjects.
const TeamReadPrefix = "toolbus_teamread"

// TeamReadSubject is toolbus_teamread.<team>.<stream>.<subject> in the core account: the
// last message of subject in stream, asked by team.
func TeamReadSubject(team, stream, subject string) string {
	return TeamReadPrefix + "." + team + "." + stream + "." + subject
}

// TeamReadLocal is toolbus_teamread.<stream>.<subject>, the subject a team's executor
// asks TeamReadSubject on in its own account (the import names the team).
func TeamReadLocal(stream, subject string) string {
	return TeamReadPrefix + "." + stream + "." + subject
}

// ParseTeamRead splits a TeamReadSubject into its team, stream and subject; ok is false
// for anything else (a stream name holds no dot).
func ParseTeamRead(s string) (team, stream, subject string, ok bool) {
	toks := strings.SplitN(s, ".", 4)
	if len(toks) != 4 || toks[0] != TeamReadPrefix || toks[1] == "" || toks[2] == "" || toks[3] == "" {
		return "", "", "", false
	}
	return toks[1], toks[2], toks[3], true
}

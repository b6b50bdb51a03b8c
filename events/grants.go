package events

import (
	"fmt"
	"strings"
)

// grantsHowTo is how an administrator changes what a team's or client's credentials may
// do today (deploy/nats/gen; see docs/deployment-and-security.md).
const grantsHowTo = "an administrator adds it to the grants file and issues these credentials again (go run ./deploy/nats/gen -grants grants.json)"

// GrantHint explains a subject the server refused: which grant the credentials lack and
// who gives it. Bus sets it on its connection's permission tracker, so every refusal a
// worker or a command reports names the grant, not only the subject.
func GrantHint(op, subject string) string {
	t := strings.Split(subject, ".")
	switch {
	case op == "publish" && len(t) >= 3 && t[0] == "$KV":
		return kvHint(t[1], t[2:])
	case op == "publish" && len(t) >= 6 && t[0] == "$JS" && t[1] == "API" && t[2] == "CONSUMER" && t[3] == "MSG" && t[4] == "NEXT":
		if q := t[len(t)-1]; IsToolConsumer(q) {
			return fmt.Sprintf("the queue of tool %q is not granted to them: %s", strings.TrimPrefix(q, ToolConsumerPrefix), grantsHowTo)
		}
		return fmt.Sprintf("the durable %q is another role's", t[len(t)-1])
	case op == "publish" && len(t) >= 4 && t[0] == "$JS" && t[1] == "API" && (t[2] == "STREAM" || t[2] == "CONSUMER") && adminOp(t[3]):
		return "only the admin's credentials create or change streams, buckets and consumers: run toolbus init with the admin's TOOLBUS_NATS_* credentials"
	case len(t) >= 4 && t[0] == SubjectPrefix:
		return eventHint(op, t[2:])
	}
	return "add it to the role's permissions"
}

// adminOp reports whether a JetStream API verb changes the bus (the admin's alone).
func adminOp(verb string) bool {
	switch verb {
	case "CREATE", "UPDATE", "DELETE", "PURGE", "DURABLE":
		return true
	}
	return false
}

// kvHint explains a refused write to bucket's key tokens.
func kvHint(bucket string, key []string) string {
	switch {
	case strings.HasSuffix(bucket, "_instances") && len(key) == 3:
		return fmt.Sprintf("instance records of team %q are not these credentials' (set TOOLBUS_TEAM to the team the credentials were issued for)", key[0])
	case strings.HasSuffix(bucket, "_instances"):
		return "these are a team's credentials: set TOOLBUS_TEAM to the team they were issued for"
	case strings.HasSuffix(bucket, "_tools"), strings.HasSuffix(bucket, "_claims"), strings.HasSuffix(bucket, "_outputs"):
		return fmt.Sprintf("tool %q is not granted to them (another team's, or not yet granted): %s", key[0], grantsHowTo)
	}
	return fmt.Sprintf("the bucket %s is written by other roles only", bucket)
}

// eventHint explains a refused event subject (its tokens after toolbus.<run>).
func eventHint(op string, t []string) string {
	if op != "publish" {
		return "add it to the role's permissions"
	}
	last := t[len(t)-1]
	switch strings.Join(t[:len(t)-1], ".") {
	case "run.started":
		return fmt.Sprintf("they may not start runs for principal %q: they are bound to other identities (%s)", last, grantsHowTo)
	case "approval.granted", "approval.denied":
		return fmt.Sprintf("they may not decide as %q: they are bound to other identities (%s)", last, grantsHowTo)
	case "run.cancel":
		return fmt.Sprintf("they may not cancel as %q: they are bound to other identities (%s)", last, grantsHowTo)
	case "tool.answer":
		return fmt.Sprintf("they may not answer as %q: they are bound to other identities (%s)", last, grantsHowTo)
	case "tool.finished", "tool.waiting", "tool.progress", "tool.log", "tool.question":
		return fmt.Sprintf("tool %q is not granted to them: %s", last, grantsHowTo)
	}
	return "this event is another role's to publish"
}

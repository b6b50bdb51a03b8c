package eventstest

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/accounts"
)

// The check that exports are exact (issue 54): a tenant's publish on a service it
// imports from the core account reaches every subscription of the core account that the
// subject matches, the server's own included (each consumer's ack and next-message
// subscriptions, the streams' direct gets, the JetStream API). So every service crossing
// must match only the subscriptions of the owner it is meant for (accounts.Crossing.For).

// Subscriptions are the subjects of every subscription the server holds in account: the
// clients' and the server's internal ones (JetStream's consumers and streams, the
// account's imports of the system account, the system's), as Subsz lists them.
func Subscriptions(t testing.TB, srv *server.Server, account string) []string {
	t.Helper()
	sz, err := srv.Subsz(&server.SubszOptions{Subscriptions: true, Account: account, Limit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range sz.Subs {
		out = append(out, s.Subject)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ServiceCrossings are the service subjects of the core account as the running server
// holds them, in the form the credential kind renders them: the core account's exports
// and every other account's imports from it (the JWT kind's core exports are wildcards,
// accounts.CoreExports; its teams import their own subjects), each with the crossing of
// layout (accounts.CoreExports, and every tenant's) it is: what it is meant for. An
// export or import that is no crossing of layout, or an invalid import, fails t.
func ServiceCrossings(t testing.TB, srv *server.Server, core string, layout []accounts.Crossing) []accounts.Crossing {
	t.Helper()
	az, err := srv.Accountz(&server.AccountzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	known := func(subject, where string) accounts.Crossing {
		i := slices.IndexFunc(layout, func(c accounts.Crossing) bool { return c.Subject == subject && !c.Stream })
		if i < 0 {
			t.Errorf("%s: %s is no service crossing of the layout", where, subject)
			return accounts.Crossing{Subject: subject}
		}
		return layout[i]
	}
	var out []accounts.Crossing
	for _, name := range az.Accounts {
		info, err := srv.Accountz(&server.AccountzOptions{Account: name})
		if err != nil {
			t.Fatal(err)
		}
		if name == core {
			for _, e := range info.Account.Exports {
				if e.Type == jwt.Service {
					out = append(out, known(string(e.Subject), "export of the core"))
				}
			}
			continue
		}
		for _, im := range info.Account.Imports {
			if im.Account != core || im.Type != jwt.Service {
				continue
			}
			if im.Invalid {
				t.Errorf("account %s: its import of %s is invalid", name, im.Subject)
			}
			out = append(out, known(string(im.Subject), "import of "+name))
		}
	}
	return out
}

// jsAPIEndpoints are the endpoints of the JetStream API that nats-server 2.15 answers
// behind an account's $JS.API.> (setJetStreamExportSubs in jetstream_api.go: its pairs
// and infopairs; the direct gets, pulls and resets are the streams' and consumers' own
// subscriptions in the account).
var jsAPIEndpoints = []string{
	server.JSApiAccountInfo, server.JSApiStreams, server.JSApiStreamList, server.JSApiStreamInfo,
	server.JSApiConsumers, server.JSApiConsumerList, server.JSApiConsumerInfo,
	server.JSApiStreamCreate, server.JSApiStreamUpdate, server.JSApiStreamDelete, server.JSApiStreamPurge,
	server.JSApiStreamSnapshot, server.JSApiStreamRestore, server.JSApiStreamRemovePeer,
	server.JSApiStreamEvacuatePeer, server.JSApiStreamCancelMove, server.JSApiStreamLeaderStepDown,
	server.JSApiConsumerLeaderStepDown, server.JSApiConsumerRemovePeer, server.JSApiConsumerEvacuatePeer,
	server.JSApiMsgDelete, server.JSApiMsgGet, server.JSApiConsumerCreateEx, server.JSApiConsumerCreate,
	server.JSApiDurableCreate, server.JSApiConsumerDelete, server.JSApiConsumerPause, server.JSApiConsumerUnpin,
}

// Owners of the server's subscriptions no crossing may be meant for.
const (
	ownerReset       accounts.TargetKind = "consumer reset"
	ownerFlowControl accounts.TargetKind = "flow control"
)

// SubscriptionOwner is the owner of a subscription of account (its name: CORE, or the
// account's public key in the JWT kind) on a server with JetStream domain ("" for none),
// known by the shapes nats-server 2.15 subscribes (consumer.go: each acknowledging
// consumer's v1 and v2 ack subjects, its next-message and reset requests, flow control;
// stream.go: direct gets) and the core's services; ok is false for any other.
func SubscriptionOwner(subject, account, domain string) (_ accounts.Target, ok bool) {
	if domain == "" {
		domain = "_"
	}
	t := strings.Split(subject, ".")
	all := func(toks []string, tok string) bool {
		return !slices.ContainsFunc(toks, func(s string) bool { return s != tok })
	}
	consumer := func(kind accounts.TargetKind, stream, name string) (accounts.Target, bool) {
		return accounts.Target{Kind: kind, Name: stream + "." + name}, true
	}
	switch {
	case len(t) == 9 && t[0] == "$JS" && t[1] == "ACK" && all(t[4:], "*"):
		return consumer(accounts.ForConsumer, t[2], t[3])
	case len(t) == 11 && t[0] == "$JS" && t[1] == "ACK" && t[2] == domain && t[3] == AckHash(account) && all(t[6:10], "*") && t[10] == ">":
		return consumer(accounts.ForConsumer, t[4], t[5])
	case len(t) == 7 && strings.HasPrefix(subject, "$JS.API.CONSUMER.MSG.NEXT."):
		return consumer(accounts.ForConsumer, t[5], t[6])
	case len(t) == 6 && strings.HasPrefix(subject, "$JS.API.CONSUMER.RESET."):
		return consumer(ownerReset, t[4], t[5])
	case len(t) == 5 && t[0] == "$JS" && t[1] == "FC" && t[4] == "*":
		return consumer(ownerFlowControl, t[2], t[3])
	case len(t) == 7 && t[0] == "$JS" && t[1] == "FC" && t[2] == domain && t[3] == AckHash(account) && t[6] == "*":
		return consumer(ownerFlowControl, t[4], t[5])
	case (len(t) == 5 || len(t) == 6 && t[5] == ">") && strings.HasPrefix(subject, "$JS.API.DIRECT.GET."):
		return accounts.Target{Kind: accounts.ForDirect, Name: t[4]}, true
	case subject == "$JS.API.>":
		return accounts.Target{Kind: accounts.ForAPI}, true
	case subject == events.WriteServicePrefix+".>":
		return accounts.Target{Kind: accounts.ForWrites}, true
	case subject == events.ReadServicePrefix+".*.>", subject == events.ToolReadPrefix+".*.question", subject == events.FollowServicePrefix+".*.*",
		subject == events.TeamReadPrefix+".*.>":
		return accounts.Target{Kind: accounts.ForReads}, true
	case subject == events.FairHeldPrefix+".*.*":
		return accounts.Target{Kind: accounts.ForFair}, true
	}
	return accounts.Target{}, false
}

// AckHash is the hash of an account's name in nats-server's v2 ack and flow-control
// subjects (getHash in server/events.go: eight characters of the name's SHA-256).
func AckHash(account string) string {
	const digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	sum := sha256.Sum256([]byte(account))
	b := make([]byte, 8)
	for i := range b {
		b[i] = digits[int(sum[i]%62)]
	}
	return string(b)
}

// meant reports whether a subscription of owner is what the crossing is for.
func meant(c accounts.Crossing, owner accounts.Target) bool {
	if c.For.Kind != owner.Kind {
		return false
	}
	return c.For.Name == owner.Name || c.For.Name != "" && owner.Name != "" && server.SubjectsCollide(c.For.Name, owner.Name)
}

// ExportCollisions says, for every service crossing and every subscription of subs (of
// account, on a server with JetStream domain) that its subject can match
// (server.SubjectsCollide), why that subscription is not what the crossing is meant for:
// another owner's, or one of no owner SubscriptionOwner knows. A crossing that reaches
// the account's JetStream API ($JS.API.>) is checked against the API's endpoints too.
// Nothing: every crossing reaches only what it is for.
func ExportCollisions(crossings []accounts.Crossing, subs []string, account, domain string) []string {
	var out []string
	for _, c := range crossings {
		if c.Stream {
			continue
		}
		for _, s := range subs {
			if !server.SubjectsCollide(c.Subject, s) {
				continue
			}
			owner, ok := SubscriptionOwner(s, account, domain)
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("%s (for %s %s) reaches %s, a subscription of no known owner", c.Subject, c.For.Kind, c.For.Name, s))
			case owner.Kind == accounts.ForAPI && owner.Name == "":
				for _, e := range jsAPIEndpoints {
					if server.SubjectsCollide(c.Subject, e) && !meant(c, accounts.Target{Kind: accounts.ForAPI, Name: e}) {
						out = append(out, fmt.Sprintf("%s (for %s %s) reaches the JetStream API's %s", c.Subject, c.For.Kind, c.For.Name, e))
					}
				}
			case !meant(c, owner):
				out = append(out, fmt.Sprintf("%s (for %s %s) reaches %s, of %s %s", c.Subject, c.For.Kind, c.For.Name, s, owner.Kind, owner.Name))
			}
		}
	}
	return out
}

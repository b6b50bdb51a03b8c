// Package accounts is what crosses between the accounts of a shared deployment: the
// core account, which holds the stream, the buckets and the durables, exports to each
// team's account only the subjects of the tools granted to it (TeamExports). The
// credentials generator (deploy/nats/natsjwt) renders it for every kind of
// credentials, and tests that run the layout on a server of their own render it with
// ConfAccounts, so both speak the one list.
package accounts

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// The accounts layout (deploy/nats/gen -accounts, docs/tenancy-design.md): the core account holds the
// stream, the buckets, the durables and every role's user; each team of the grants gets
// an account of its own holding its executor user, which sees of the core only what
// TeamExports lists. A team account has no JetStream: it reaches the core's JetStream API
// only under CoreAPIPrefix.

// CoreAPIPrefix is the prefix under which a team account imports the core account's
// JetStream API: the team's executors open their JetStream with
// jetstream.NewWithAPIPrefix(nc, CoreAPIPrefix) (TOOLBUS_NATS_API_PREFIX).
const CoreAPIPrefix = "JS.core.API"

// jsAPI is the JetStream API prefix of the core account, as the server answers it.
const jsAPI = "$JS.API"

// CoreAccount is the name of the core account in the accounts layout's config kinds
// (the JWT kind names it TOOLBUS, as in the single-account layout).
const CoreAccount = "CORE"

// TeamAccount is the name of a team's account: TEAM_<team> in the config kinds,
// team-<team> as the JWT's name.
func TeamAccount(team string) string { return "TEAM_" + team }

// Crossing is one subject the core account exports to a team account and the team
// imports: a service (the team publishes or requests into the core: pulls, acks, its
// results, its keys; the answer comes back) or a stream (the core's messages flow to the
// team: the doorbell of its queues, its cancels).
type Crossing struct {
	// Subject is the subject in the core account.
	Subject string
	// Local is the subject in the team's account (the import's `to`, JWT LocalSubject);
	// "" when it is Subject.
	Local string
	// Stream: a stream export; else a service export.
	Stream bool
	// Pull marks a service answered by many messages (a pull; JWT response type
	// stream), not one reply.
	Pull bool
	// For is what a service crossing is meant to reach in the core account: the
	// subscriptions of one owner there. A tenant's publish on Subject reaches every
	// subscription of the core account that the subject matches, so Subject must match
	// no one else's (eventstest.ExportCollisions checks it on a running server against
	// every subscription the core holds). A stream crossing reaches nothing (the core
	// publishes, the tenant listens): its For is zero.
	For Target
}

// Target is an owner of subscriptions in the core account.
type Target struct {
	Kind TargetKind
	// Name: for ForAPI the endpoint as nats-server registers it ("$JS.API.CONSUMER.INFO.*.*");
	// for ForConsumer "<stream>.<consumer>"; for ForDirect the stream; "" for the
	// services. In CoreExports a tool's token in it is "*", as in the subject.
	Name string
}

// TargetKind is a kind of owner of subscriptions in the core account.
type TargetKind string

// The owners a crossing may be meant for.
const (
	// ForAPI is one endpoint of the core's JetStream API (the server's own; the
	// account's subscription is $JS.API.>, an import of the system account's).
	ForAPI TargetKind = "JetStream API"
	// ForConsumer is the acknowledgement and next-message subscriptions nats-server
	// holds for one consumer (AckSubjects, $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>).
	ForConsumer TargetKind = "consumer"
	// ForDirect is the direct gets of one stream ($JS.API.DIRECT.GET.<stream>[.>]).
	ForDirect TargetKind = "direct gets"
	// ForWrites is the write service (package intake, events.WriteServicePrefix).
	ForWrites TargetKind = "write service"
	// ForReads is the read service (package reads): a client's reads and follows and a
	// tool's questions (events.ReadServicePrefix, events.FollowServicePrefix,
	// events.ToolReadPrefix).
	ForReads TargetKind = "read service"
	// ForFair is the fair scheduler's answer of what it holds of one identity
	// (events.FairHeldForSubject; package fair).
	ForFair TargetKind = "fair scheduler"
)

// AckSubjects are the subjects on which a tenant acknowledges the messages of consumer
// on stream, exactly in the two shapes nats-server (2.15, consumer.go) subscribes them
// for every consumer that acknowledges, in the account that holds it:
//
//   - v1: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>, nine
//     tokens;
//   - v2: $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<the same five>, eleven
//     tokens or more (the server's subscription ends in ">", for extensions).
//
// A message on an ack subject with the body "+NXT" asks the consumer for its next
// message, delivered to the sender's reply: a free token here reaches other consumers
// (issue 54: "$JS.ACK.*.*.<stream>.<consumer>.>" matched every consumer's v1 subject,
// "$JS.ACK.<theirs>.<consumer>.<stream>.<own>.1.1.1"). These match only this
// consumer's: the v1 subject has exactly nine tokens and names the consumer in the
// third and fourth, and every v2 subscription needs at least eleven; the v2 subject has
// eleven or more and names the consumer in the fifth and sixth, where every v2
// subscription names its own, and no v1 subscription has more than nine. So the two
// tokens v2 leaves free, the JetStream domain ("_" without one: the server's setting,
// not the credentials') and the hash of the account's name (its public key in the JWT
// kind), would pin nothing more, and pinning the domain would break acks silently on a
// server that sets one.
func AckSubjects(stream, consumer string) (v1, v2 string) {
	return "$JS.ACK." + stream + "." + consumer + ".*.*.*.*.*",
		"$JS.ACK.*.*." + stream + "." + consumer + ".*.*.*.*.>"
}

// InTeam is the subject the team's clients use.
func (c Crossing) InTeam() string {
	if c.Local != "" {
		return c.Local
	}
	return c.Subject
}

// TeamExports is everything that crosses from the core account to team's account, for
// the tools granted to it (docs/tenancy-design.md, "The accounts layout"). All three kinds
// of credentials render it: the JWT kind as the team account's imports (with activation
// tokens of the core's token-required exports), the config kinds as `exports` of the
// core and `imports` of the team. Every subject is built with the events package's
// helpers, which make tool names subject-safe.
func TeamExports(team string, tools []string) []Crossing {
	stream, queues := events.DefaultStream, events.QueueStreamName(events.DefaultStream)
	api := func(s string, to Target) Crossing {
		return Crossing{Subject: s, Local: CoreAPIPrefix + strings.TrimPrefix(s, jsAPI), For: to}
	}
	// What the team stores goes through the core's intake (events.TeamWriteSubject):
	// the team publishes on the subject itself, the import maps it.
	write := func(s string) Crossing {
		return Crossing{Subject: events.TeamWriteSubject(team, s), Local: s, For: Target{Kind: ForWrites}}
	}
	direct := func(stream, s string) Crossing {
		return api(jsAPI+".DIRECT.GET."+stream+"."+s, Target{Kind: ForDirect, Name: stream})
	}
	// Each get is also offered through the core's read service, which answers it from
	// the leader where the stream serves no direct gets (replicated: events.TeamReadPrefix).
	teamRead := func(stream, s string) Crossing {
		return Crossing{Subject: events.TeamReadSubject(team, stream, s), Local: events.TeamReadLocal(stream, s), For: Target{Kind: ForReads}}
	}
	directGet := func(bucket, key string) []Crossing {
		return []Crossing{direct(store.BucketStream(bucket), store.KeySubject(bucket, key)), teamRead(store.BucketStream(bucket), store.KeySubject(bucket, key))}
	}
	var out []Crossing
	for _, tool := range tools {
		durable, tok := events.ToolConsumer(tool), events.ToolToken(tool)
		// The tool's queue, on the queue stream.
		queue := Target{Kind: ForConsumer, Name: queues + "." + durable}
		next := api(jsAPI+".CONSUMER.MSG.NEXT."+queues+"."+durable, queue)
		next.Pull = true
		ackV1, ackV2 := AckSubjects(queues, durable)
		// No consumer info (nor any API the server answers from its one info queue, which
		// a team could flood to time out everyone's: events/teamqueue): the pulls and
		// their answers are all a team's executors need of the queue.
		out = append(out,
			next,
			Crossing{Subject: ackV1, For: queue},
			Crossing{Subject: ackV2, For: queue},
			write(events.SubjectToolFinished("*", tool)),
			write(events.SubjectToolWaiting("*", tool)),
			write(events.SubjectToolProgress("*", tool)),
			write(events.SubjectToolLog("*", tool)),
			write(events.SubjectToolQuestion("*", tool)),
			write(store.KeySubject(store.BucketClaims, tok+".>")),
			write(store.KeySubject(store.BucketOutputs, tok+".>")),
			write(store.KeySubject(store.BucketTools, tok)),
		)
		out = append(out, directGet(store.BucketClaims, tok+".>")...)
		out = append(out, directGet(store.BucketTools, tok)...)
		out = append(out,
			// The last result of the tool in a run (subject form only): a take-over
			// checks that the call it takes is not done; on the read mirror too, which
			// serves the direct gets when there is one (the stream then serves none).
			direct(stream, events.SubjectToolFinished("*", tool)),
			direct(events.ReadMirrorName(stream), events.SubjectToolFinished("*", tool)),
			teamRead(stream, events.SubjectToolFinished("*", tool)),
			Crossing{Subject: events.FilterToolRequestedFor(tool), Stream: true},
		)
		// The tool's events as the core stores them (a service of the team's follows
		// its own tools' calls live): only the core and the team itself publish on
		// them (the write service checks that the tool is the writer's), and nothing
		// on them is another's: answers and decisions are on the run's subjects, which
		// name no tool. Each type is listed: "tool.*.<tool>" would match the answers of
		// an identity of the tool's name (tool.answer.<who>).
		for _, s := range []string{events.SubjectToolFinished("*", tool), events.SubjectToolWaiting("*", tool),
			events.SubjectToolProgress("*", tool), events.SubjectToolLog("*", tool), events.SubjectToolQuestion("*", tool)} {
			out = append(out, Crossing{Subject: s, Stream: true})
		}
		out = append(out,
			// The core's notice that a run ended while a call of the tool may run.
			Crossing{Subject: events.FilterRunEndedFor(tool), Stream: true},
			// The state of a question of a call of the tool (the read service).
			Crossing{Subject: events.ToolQuestionSubject(tool), For: Target{Kind: ForReads}},
		)
	}
	out = append(out, write(store.KeySubject(store.BucketInstances, team+".>")))
	out = append(out, directGet(store.BucketInstances, team+".>")...)
	return append(out,
		// The team's shared secrets (OAuth tokens of its MCP servers, store.SecretKey).
		write(store.KeySubject(store.BucketSecrets, team+".>")),
		direct(store.BucketStream(store.BucketSecrets), store.KeySubject(store.BucketSecrets, team+".>")))
}

// ClientAccount is the name of a client's account: CLIENT_<client> in the config kinds,
// client-<client> as the JWT's name.
func ClientAccount(client string) string { return "CLIENT_" + client }

// ClientExports is everything that crosses from the core account to the account of a
// client bound to ids: per identity, the events it publishes in that identity's name
// (starts, cancels, decisions, answers), through the core's intake
// (events.ClientWriteSubject: the stream's acknowledgement or the intake's refusal
// comes back), and the
// read service's subjects of that identity (events.ReadSubject), which answer only of the
// runs the identity may see. No JetStream API of the core, no stream: a run id names no
// tenant, so every read goes through the read service, which checks it.
func ClientExports(ids []string) []Crossing {
	var out []Crossing
	for _, id := range ids {
		tok := events.IdentityToken(id)
		write := func(s string) Crossing {
			return Crossing{Subject: events.ClientWriteSubject(id, s), Local: s, For: Target{Kind: ForWrites}}
		}
		out = append(out,
			write(events.SubjectRunStarted("*", id)),
			write(events.SubjectRunCancel("*", id)),
			write(events.SubjectApproval("*", true, id)),
			write(events.SubjectApproval("*", false, id)),
			write(events.SubjectToolAnswer("*", id)),
			Crossing{Subject: events.ReadSubject(tok) + ".>", For: Target{Kind: ForReads}},
			// The read service's live follow of the identity's runs, answered by many
			// messages (a stream response).
			Crossing{Subject: events.FollowSubject(tok, "*"), Pull: true, For: Target{Kind: ForReads}},
			// What the fair scheduler holds of the identity's calls of a tool.
			Crossing{Subject: events.FairHeldPrefix + ".*." + tok, For: Target{Kind: ForFair}},
		)
	}
	return out
}

// Placeholders of a tool and a team, each one token, that CoreExports turns into "*".
const (
	anyTool = "any-tool"
	anyTeam = "any-team"
	anyID   = "any-id"
)

// CoreExports is what the core account's JWT exports, token-required: TeamExports for
// any team and any tool and ClientExports for any identity, each tool's, team's or
// identity's token a "*". A team account imports a
// part of one of them with an activation token the core account signs for that team
// alone, so granting a tool changes the team's JWT and nothing of the core's.
func CoreExports() []Crossing {
	out := append(TeamExports(anyTeam, []string{anyTool}), ClientExports([]string{anyID})...)
	for i, c := range out {
		c.For.Name = anyToken(c.For.Name)
		out[i] = Crossing{Subject: anyToken(c.Subject), Stream: c.Stream, Pull: c.Pull, For: c.For}
	}
	return out
}

// anyToken is subject with each placeholder token a "*".
func anyToken(subject string) string {
	toks := strings.Split(subject, ".")
	for j, t := range toks {
		if t == anyTool || t == anyTeam || t == anyID || t == events.ToolConsumer(anyTool) {
			toks[j] = "*"
		}
	}
	return strings.Join(toks, ".")
}

// WriteForwards are the subjects the core's write service (package intake) publishes
// on when it forwards tenants' writes, as wildcards: the subjects of CoreExports' write
// crossings. In the accounts layout the injector's user may publish them (the
// one-account layout's injector may not: no tenant writes through it there).
func WriteForwards() []string {
	var out []string
	for _, c := range CoreExports() {
		// toolbus_write.<kind>.<name>.<subject>, with wildcards (not a write itself).
		if toks := strings.SplitN(c.Subject, ".", 4); c.For.Kind == ForWrites && len(toks) == 4 && !slices.Contains(out, toks[3]) {
			out = append(out, toks[3])
		}
	}
	return out
}

// ResponseThreshold is how long the core account keeps the way back of an answer to a
// tenant's request through one of its service exports (the export's response_threshold,
// JWT ResponseThreshold) while nothing goes through it: 2 x events.TenantAnswerGap. For
// each request with a reply that crosses into the core, nats-server 2.15 keeps a
// response entry in the core account (accounts.go addRespServiceImport, about 330 bytes
// with the tenant's reverse entry). A singleton export drops it at the first answer; a
// stream export (a pull, a follow) only at an empty message, an answer that reaches no
// one, the tenant dropping its reply's subscription, or once silent for the threshold
// (client.go processServiceImport renews it at every answer delivered; the export's
// timer, checkExpiredResponses, drops those silent longer, every threshold). A pull
// answered at once (no_wait: one 404) leaves its entry silent: a team's flood of them
// held 200,000 entries, 66 MB of the core, for the default's 2 to 4 minutes. Nothing of
// the tenant's limits counts them: entries one tenant holds are at most its live pulls
// and follows (heartbeats keep those) plus its rate of requests x 2 x the threshold. A
// legitimate stream answers at least every TenantAnswerGap, so it is never dropped;
// singleton answers come within seconds (the services' own timeouts are 10 s). A
// consumer's MaxRequestExpires would bound nothing here: a pull without an expiry passes
// it (consumer.go processNextMsgRequest), and a no_wait one is answered at once.
const ResponseThreshold = 2 * events.TenantAnswerGap

// ConfAccounts renders the accounts block of a config kind for teams only: Layout.Conf
// with no clients.
func ConfAccounts(teamTools map[string][]string, coreUsers string, teamUsers map[string]string) string {
	return Layout{Teams: teamTools, CoreUsers: coreUsers, TeamUsers: teamUsers}.Conf()
}

// Layout is a deployment's accounts, as a config kind renders them.
type Layout struct {
	// Teams maps each team to its tools; Clients each client to its identities.
	Teams, Clients map[string][]string
	// CoreUsers are the core account's users: config lines, one per user, such as
	// "      {user: core, password: core}\n".
	CoreUsers string
	// TeamUsers and ClientUsers are the users of each team's and client's account.
	TeamUsers, ClientUsers map[string]string
	// Limits caps every team's and client's account (not the core's); its zero value
	// is DefaultTenantLimits.
	Limits TenantLimits
	// ResponseThreshold is every service export's response threshold; 0 is
	// ResponseThreshold.
	ResponseThreshold time.Duration
}

// Threshold is l's response threshold (Layout.ResponseThreshold).
func (l Layout) Threshold() time.Duration {
	if l.ResponseThreshold > 0 {
		return l.ResponseThreshold
	}
	return ResponseThreshold
}

// TenantLimits are the NATS limits of each tenant's (team's and client's) account, so
// that one tenant cannot take the server's memory from the others with connections or
// subscriptions its credentials may open. The core account has none. The server refuses
// a connection beyond Conns ("maximum account active connections exceeded": the client
// does not connect) and a subscription beyond Subs ("maximum subscriptions exceeded":
// the connection stays, the subscription is dropped). Every kind of credentials renders
// the same values: the config kinds as the account's limits block (Layout.Conf), the JWT
// kind as its account claims' limits (deploy/nats/natsjwt).
//
// A field of 0 takes DefaultTenantLimits' value; -1 is no limit.
type TenantLimits struct {
	// Conns is the most connections the account may hold at once (max_connections).
	Conns int `json:"conns,omitempty"`
	// Subs is the most subscriptions of one connection of the account
	// (max_subscriptions): nats-server counts them per connection, so the account
	// holds at most Conns x Subs.
	Subs int `json:"subs,omitempty"`
	// Leafnodes is the most leaf node connections of the account (max_leafnodes).
	Leafnodes int `json:"leafnodes,omitempty"`
	// Payload is the largest message, in bytes, a connection of the account may publish
	// (max_payload): the server closes one that publishes a larger one.
	Payload int `json:"payload,omitempty"`
}

// NoLimit, as a field of TenantLimits, lifts that limit (jwt.NoLimit, the server's too).
const NoLimit = -1

// DefaultTenantLimits are a tenant account's limits unless the administrator sets
// others (toolbus admin init -tenant-conns ..., deploy/nats/gen): 100 connections, 2,000
// subscriptions per connection, no leaf node and messages of at most 1 MiB (the
// server's own default). A tenant at its caps holds 200,000 subscriptions, at one to
// three kilobytes of the server's memory each (measured in process, server and client):
// 200 to 600 MB, so ten tenants at their caps fit a server of 8 GB beside the core. A
// team's executor process holds about two subscriptions per tool it serves (its
// queue's pull inbox, its run-ended notices), one per question waiting for an answer
// and a few of its own: a process serving 500 tools stays under 1,500. A client opens a
// handful. A fleet of dozens of processes per tenant fits the connections.
var DefaultTenantLimits = TenantLimits{Conns: 100, Subs: 2000, Leafnodes: 0, Payload: 1 << 20}

// Resolved is l with each 0 replaced by DefaultTenantLimits' value: what the accounts
// get. A Leafnodes of 0 stays 0 (none), the default.
func (l TenantLimits) Resolved() TenantLimits {
	d := DefaultTenantLimits
	if l.Conns != 0 {
		d.Conns = l.Conns
	}
	if l.Subs != 0 {
		d.Subs = l.Subs
	}
	if l.Leafnodes != 0 {
		d.Leafnodes = l.Leafnodes
	}
	if l.Payload != 0 {
		d.Payload = l.Payload
	}
	return d
}

// Validate refuses a limit below NoLimit.
func (l TenantLimits) Validate() error {
	names := []string{"connections", "subscriptions", "leaf nodes", "payload"}
	for i, v := range []int{l.Conns, l.Subs, l.Leafnodes, l.Payload} {
		if v < NoLimit {
			return fmt.Errorf("accounts: tenant %s limit %d: give a number, 0 for the default or -1 for none", names[i], v)
		}
	}
	return nil
}

// Conf is the limits block of a tenant's account in a config kind (Resolved).
func (l TenantLimits) Conf() string {
	r := l.Resolved()
	return fmt.Sprintf("    limits {max_connections: %d, max_subscriptions: %d, max_leafnodes: %d, max_payload: %d}\n", r.Conns, r.Subs, r.Leafnodes, r.Payload)
}

// tenant is one account of the layout beside the core: its name and what it imports.
type tenant struct {
	account   string
	users     string
	crossings []Crossing
}

func (l Layout) tenants() []tenant {
	var out []tenant
	for _, team := range slices.Sorted(maps.Keys(l.Teams)) {
		out = append(out, tenant{TeamAccount(team), l.TeamUsers[team], TeamExports(team, l.Teams[team])})
	}
	for _, c := range slices.Sorted(maps.Keys(l.Clients)) {
		out = append(out, tenant{ClientAccount(c), l.ClientUsers[c], ClientExports(l.Clients[c])})
	}
	return out
}

// Conf renders the accounts block of a config kind: the core account with JetStream,
// its users and an export per crossing of every tenant, restricted to that tenant's
// account (each service's with l's response threshold), and one account per team and
// client with its users, its limits (l.Limits) and its imports. Tests that run the
// layout on a server of their own render it with this too.
func (l Layout) Conf() string {
	var b strings.Builder
	b.WriteString("accounts {\n  " + CoreAccount + " {\n    jetstream: enabled\n    users = [\n" + l.CoreUsers + "    ]\n    exports = [\n")
	tenants := l.tenants()
	for _, t := range tenants {
		for _, c := range t.crossings {
			acc := "accounts: [" + strconv.Quote(t.account) + "]"
			switch {
			case c.Stream:
				fmt.Fprintf(&b, "      {stream: %q, %s}\n", c.Subject, acc)
			case c.Pull:
				fmt.Fprintf(&b, "      {service: %q, %s, response_type: stream, response_threshold: %q}\n", c.Subject, acc, l.Threshold())
			default:
				fmt.Fprintf(&b, "      {service: %q, %s, response_threshold: %q}\n", c.Subject, acc, l.Threshold())
			}
		}
	}
	b.WriteString("    ]\n  }\n")
	for _, t := range tenants {
		fmt.Fprintf(&b, "  %q {\n    users = [\n%s    ]\n%s    imports = [\n", t.account, t.users, l.Limits.Conf())
		for _, c := range t.crossings {
			kind := "service"
			if c.Stream {
				kind = "stream"
			}
			fmt.Fprintf(&b, "      {%s: {account: %q, subject: %q}", kind, CoreAccount, c.Subject)
			if c.Local != "" {
				fmt.Fprintf(&b, ", to: %q", c.Local)
			}
			b.WriteString("}\n")
		}
		b.WriteString("    ]\n  }\n")
	}
	b.WriteString("}\n")
	return b.String()
}

package events

import "time"

// TenantAnswerGap is the longest a stream of answers to a tenant's request stays
// silent while it lasts: a team's pull of its queue hears the server's heartbeat this
// often (events/teamqueue; the TypeScript SDK's pulls of at most 30 s hear one every
// half of theirs), a client's follow the read service's (FollowIdleEvery). In the
// accounts layout the core keeps the way back of each such answer (a response entry of
// its service export) only while it is not silent for accounts.ResponseThreshold,
// twice this: the way back of a pull or a request a tenant leaves unanswered, or of a
// flood of pulls answered at once, is forgotten then, instead of after nats-server's
// default of two minutes (issue 54).
const TenantAnswerGap = 15 * time.Second

package events

// The read service (package reads, docs/tenancy-design.md "Clients and front doors"): a
// client in an account of its own reaches nothing of the core account's JetStream; it
// reads the runs its identities may see through a service of the core, which answers a
// checked subset of the JetStream API under ReadAPIPrefix(id). The identity is a token
// of the subject because the core exports ReadSubject(id) only to the accounts bound to
// id: a request there comes from such an account.

// ReadServicePrefix is the first token of the read service's subjects.
const ReadServicePrefix = "toolbus_read"

// ReadQueue is the queue group the read service's instances share.
const ReadQueue = "toolbus_read"

// ReadSubject is toolbus_read.<id>: the read service's subjects of identity id (its
// IdentityToken) are under it.
func ReadSubject(id string) string { return ReadServicePrefix + "." + IdentityToken(id) }

// ReadAPIPrefix is the JetStream API prefix of the read service for id: a client opens
// its JetStream with jetstream.NewWithAPIPrefix(nc, ReadAPIPrefix(id))
// (Config.ReadPrefix, TOOLBUS_NATS_READ_PREFIX).
func ReadAPIPrefix(id string) string { return ReadSubject(id) + ".API" }

// ReadRunsSubject is the read service's list of the runs id may see (a JSON array of
// store.RunState).
func ReadRunsSubject(id string) string { return ReadSubject(id) + ".runs" }

package events

import (
	"errors"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding/spec"
)

// ErrNotCloudEvent is wrapped by Decode errors for messages that are not CloudEvents (in
// binary or structured mode), or whose data does not decode. Consumers terminate such
// messages: redelivering them cannot help.
var ErrNotCloudEvent = errors.New("events: not a toolbus CloudEvent")

// Header names used on NATS messages.
const (
	HeaderMsgID       = "Nats-Msg-Id"
	HeaderContentType = "Content-Type"
	ContentTypeJSON   = "application/json"
	headerPrefix      = "ce-"
)

// Extension attribute names (lower-case alphanumeric, as CloudEvents requires).
const (
	ExtRunID       = "runid"
	ExtStep        = "step"
	ExtCallID      = "callid"
	ExtCallIndex   = "callindex"
	ExtCallCount   = "callcount"
	ExtTraceParent = "traceparent"
)

// SchemaBaseURI is the base of every dataschema URI. The URIs are stable identifiers
// (the $id of each schema), not a service to fetch from: the schema of type T is the file
// schemas/T.v1.json of this repository (SchemaFile), so a subscriber maps the base to
// that directory.
const SchemaBaseURI = "https://toolbus.dev/schemas/"

// SchemaVersion is the version of the data schemas; a changed field is a new version,
// never a silent rename.
const SchemaVersion = "v1"

// SchemaFile returns the file name of the JSON Schema of the data of events of type typ,
// e.g. toolbus.tool.finished.v1.json.
func SchemaFile(typ string) string { return typ + "." + SchemaVersion + ".json" }

// DataSchema returns the dataschema URI of events of type typ, e.g.
// https://toolbus.dev/schemas/toolbus.tool.finished.v1.json.
func DataSchema(typ string) string { return SchemaBaseURI + SchemaFile(typ) }

// Meta holds the CloudEvents attributes of a toolbus event.
type Meta struct {
	ID          string
	Type        string
	Source      string
	Subject     string
	Time        time.Time
	DataSchema  string
	RunID       string
	Step        int
	CallID      string
	CallIndex   int
	CallCount   int
	TraceParent string
	// HasCall is true when the call extensions (callid, callindex, callcount) are present.
	HasCall bool
}

var ceSpecs = spec.WithPrefix(headerPrefix)

package toolbus

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Status is the outcome of one tool call (ToolResult.Status).
type Status string

// Tool call statuses. See CONTRACT.md.
const (
	// StatusSucceeded: the tool ran and returned a result (an empty result is a success).
	StatusSucceeded Status = "succeeded"
	// StatusFailed: the tool ran and failed (its own error, a panic, a bad output).
	StatusFailed Status = "failed"
	// StatusRejected: stopped before any side effect (unknown tool, invalid arguments,
	// not authorized, approval denied).
	StatusRejected Status = "rejected"
	// StatusTimedOut: the tool's timeout or the call deadline expired.
	StatusTimedOut Status = "timed_out"
	// StatusCancelled: the call's context was cancelled (run cancelled, worker shutdown).
	StatusCancelled Status = "cancelled"
)

// Valid reports whether s is one of the five contract statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusSucceeded, StatusFailed, StatusRejected, StatusTimedOut, StatusCancelled:
		return true
	}
	return false
}

// Stable error codes carried in ToolError.Code. A tool may use its own code in place of
// CodeToolError (for example "incident_not_found").
const (
	CodeUnknownTool       = "unknown_tool"
	CodeInvalidArguments  = "invalid_arguments"
	CodeNotAuthorized     = "not_authorized"
	CodeApprovalDenied    = "approval_denied"
	CodeTimeout           = "timeout"
	CodeCancelled         = "cancelled"
	CodeToolError         = "tool_error"
	CodeToolInternalError = "tool_internal_error"
	CodeInvalidToolOutput = "invalid_tool_output"
	// CodePermissionDenied: the server refused an operation the executor needs for the
	// call to its credentials, or the core's write service refused a write of the call
	// for good (400); the message names the subject (the missing permission) or the
	// refusal.
	// It fails the run by default: no retry can fix a deployment's permissions.
	CodePermissionDenied = "permission_denied"
	// CodeRunEnded: the call was taken after its run had ended; it did not run
	// (status cancelled).
	CodeRunEnded = "run_ended"
	// CodeTooManyCalls rejects the calls of a step beyond the per-step cap; the planner
	// publishes these results itself and the model reads them.
	CodeTooManyCalls = "too_many_calls"
)

// Run outcome codes (RunEnded.Code) of runs that failed for infrastructure reasons.
const (
	// CodeStoreError: a store or publish kept failing on the last delivery of an event,
	// so the run ends instead of being redelivered forever.
	CodeStoreError = "store_error"
	// CodeModelError: the model API refused the request or kept failing.
	CodeModelError = "model_error"
	// CodeModelAnswerTooLarge: the model's answer is larger than the bus can store
	// (planner.Config.MaxAnswerBytes): the run ends at once and the model, which was
	// paid for that answer, is not asked again.
	CodeModelAnswerTooLarge = "model_answer_too_large"
	// CodeQuotaExceeded: the run's principal is at one of its bounds (runs in flight,
	// starts per second, size of its run.started: injector.Quota) when the run started;
	// nothing of it ran, and the reason names the bound.
	CodeQuotaExceeded = "quota_exceeded"
)

// ToolCall is one call proposed by the model: the raw arguments exactly as the model sent
// them (they may be malformed JSON; the executor decides).
type ToolCall struct {
	CallID    string `json:"call_id"`
	Tool      string `json:"tool"`
	Arguments string `json:"arguments"`
}

// ToolError classifies a non-succeeded result.
type ToolError struct {
	Code      string          `json:"code"`
	Message   string          `json:"message"`
	Retryable bool            `json:"retryable"`
	Details   json.RawMessage `json:"details,omitempty"`
}

// Truncation says that Content holds only part of the output.
type Truncation struct {
	OriginalBytes int `json:"original_bytes"`
	KeptBytes     int `json:"kept_bytes"`
	// Ref names where the whole output is kept (for example kv://toolbus_outputs/<key>);
	// empty when the whole output is in ToolResult.Output, or, with no Output, when it
	// was not kept because the outputs bucket was full.
	Ref string `json:"ref,omitempty"`
}

// ToolResult is the data of a tool.finished event: the fact of one call.
type ToolResult struct {
	CallID string          `json:"call_id"`
	Tool   string          `json:"tool"`
	Status Status          `json:"status"`
	Output json.RawMessage `json:"output,omitempty"`
	Error  *ToolError      `json:"error,omitempty"`
	// Content is what the model reads: bounded, redacted, deterministic text.
	Content    string      `json:"content"`
	Truncated  *Truncation `json:"truncated,omitempty"`
	Redactions int         `json:"redactions,omitempty"`
	Attempt    int         `json:"attempt,omitempty"`
	DurationMS int64       `json:"duration_ms"`
	Executor   string      `json:"executor,omitempty"`
	// LeaseUntil is the fencing deadline of the attempt that produced the result, by
	// the NATS server's clock: until then no other attempt could take the call over. A
	// result the stream stored before it is the call's; one stored later (an executor
	// cut off from the bus whose publication arrived late) is joined only if no later
	// attempt owns the call. Absent on results that no executor attempt produced.
	LeaseUntil *time.Time `json:"lease_until,omitempty"`
	// Human names the person's decision on a call that needed approval (Approval): the
	// call ran as approved or with arguments a person edited, or was rejected, or a
	// person answered in the tool's place. It is the decision that stood (the first one
	// the decision policy accepted), which an auditor cannot tell from the approval
	// events alone once some were refused.
	Human *HumanDecision `json:"human,omitempty"`
	// Retries are the failed attempts retried by the tool's retry policy before this
	// result, oldest first (ToolContract.Retry); the model reads only this result.
	Retries []FailedAttempt `json:"retries,omitempty"`
	// Attachments are the images, sounds and files a succeeded call returned beside
	// Content, in the tool's order (see Attachment).
	Attachments []Attachment `json:"attachments,omitempty"`
}

// Attachment is an image, a sound or a file that a tool returns beside its text: bytes
// with a media type. Small ones travel in the event (Data, base64 in JSON); one that
// would make the event too large is kept in the outputs bucket like a large output
// (Ref, kv://toolbus_outputs/<key>) and Data is empty. Size is the length of the bytes
// either way. What reads the result passes them on as its reader accepts them: the MCP
// door as image, audio or resource content, a model adapter as the provider's image or
// file input (or a line that describes it, where the provider takes none).
type Attachment struct {
	// MediaType is the bytes' media type (image/png, audio/wav, application/pdf, ...).
	MediaType string `json:"media_type"`
	// Name is a file name for people and for providers that want one (optional).
	Name string `json:"name,omitempty"`
	// URI names the resource the bytes are, for MCP hosts (optional; MCP embedded
	// resources carry it).
	URI  string `json:"uri,omitempty"`
	Size int    `json:"size"`
	Data []byte `json:"data,omitempty"`
	Ref  string `json:"ref,omitempty"`
}

// Kind is the attachment's kind by its media type: "image", "audio", "text" (text/*,
// JSON, XML, YAML) or "file".
func (a Attachment) Kind() string {
	mt := strings.ToLower(a.MediaType)
	switch {
	case strings.HasPrefix(mt, "image/"):
		return "image"
	case strings.HasPrefix(mt, "audio/"):
		return "audio"
	case strings.HasPrefix(mt, "text/"), mt == "application/json", strings.HasSuffix(mt, "+json"),
		mt == "application/xml", strings.HasSuffix(mt, "+xml"), mt == "application/yaml":
		return "text"
	}
	return "file"
}

// Describe is a line that stands for the attachment where its bytes cannot go.
func (a Attachment) Describe() string {
	name := a.Name
	if name == "" {
		name = a.URI
	}
	if name != "" {
		name = " " + strconv.Quote(name)
	}
	return fmt.Sprintf("[%s attachment%s: %s, %d bytes, not shown]", a.Kind(), name, a.MediaType, a.Size)
}

// FailedAttempt is one attempt of a call that failed and was retried by the tool's
// retry policy.
type FailedAttempt struct {
	Attempt    int       `json:"attempt"`
	Status     Status    `json:"status"`
	Error      ToolError `json:"error"`
	DurationMS int64     `json:"duration_ms"`
	Executor   string    `json:"executor,omitempty"`
	At         time.Time `json:"at"`
	// RetryAfterMS is the backoff before the next attempt.
	RetryAfterMS int64 `json:"retry_after_ms"`
}

// Code returns the error code of r, or "" when r has no error.
func (r ToolResult) Code() string {
	if r.Error == nil {
		return ""
	}
	return r.Error.Code
}

// Role is a message role in the model history.
type Role string

// Message roles.
const (
	RoleSystem    Role = "system"
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
	RoleTool      Role = "tool"
)

// Message is one entry of the history a model reads. Assistant messages are kept whole:
// text, reasoning (with provider signatures and opaque blocks in Raw), every tool call.
type Message struct {
	Role    Role   `json:"role"`
	Content string `json:"content,omitempty"`
	// Reasoning is the model's visible reasoning or thinking text, if any.
	Reasoning string `json:"reasoning,omitempty"`
	// ReasoningSignature is the provider's signature of the reasoning block (Anthropic).
	ReasoningSignature string `json:"reasoning_signature,omitempty"`
	// Raw keeps provider-specific parts that must be sent back as they came (e.g. redacted
	// thinking blocks, Responses reasoning items). Opaque to toolbus.
	Raw json.RawMessage `json:"raw,omitempty"`
	// ToolCalls are the calls of an assistant message, in call order.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID and Name identify the call a tool message answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	Name       string `json:"name,omitempty"`
	// IsError marks a tool message whose result did not succeed (Anthropic is_error).
	IsError bool `json:"is_error,omitempty"`
	// Attachments are the images and files of a tool message's result
	// (ToolResult.Attachments), with their bytes when the adapter reads them.
	Attachments []Attachment `json:"attachments,omitempty"`
}

// ToolMessage builds the tool-role message that answers r.CallID.
func ToolMessage(r ToolResult) Message {
	return Message{
		Role:        RoleTool,
		Content:     r.Content,
		ToolCallID:  r.CallID,
		Name:        r.Tool,
		IsError:     r.Status != StatusSucceeded,
		Attachments: r.Attachments,
	}
}

// Usage counts model tokens.
type Usage struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// Total is input plus output tokens.
func (u Usage) Total() int64 { return u.InputTokens + u.OutputTokens }

// Add returns u plus o.
func (u Usage) Add(o Usage) Usage {
	return Usage{InputTokens: u.InputTokens + o.InputTokens, OutputTokens: u.OutputTokens + o.OutputTokens}
}

// Principal is who a run acts for; it reaches the executor's authorization hook.
type Principal struct {
	ID    string            `json:"id"`
	Roles []string          `json:"roles,omitempty"`
	Attrs map[string]string `json:"attrs,omitempty"`
}

// Limits bound a run. Zero values mean "use the worker's default".
type Limits struct {
	MaxSteps    int           `json:"max_steps,omitempty"`
	Deadline    time.Time     `json:"deadline,omitzero"`
	TokenBudget int64         `json:"token_budget,omitempty"`
	CallTimeout time.Duration `json:"call_timeout,omitempty"`
}

// RunStarted is the data of run.started: everything a run needs, published once.
type RunStarted struct {
	RunID    string    `json:"run_id"`
	Messages []Message `json:"messages"`
	// AllowedTools limits the tools of this run; empty means every tool in the catalog.
	AllowedTools []string  `json:"allowed_tools,omitempty"`
	Limits       Limits    `json:"limits"`
	Model        string    `json:"model,omitempty"`
	Principal    Principal `json:"principal"`
	// Approvers are the identities who may decide on this run's calls and cancel it
	// besides its principal (and the injector's TOOLBUS_DECIDERS): the decision policy a
	// shared bus enforces where decisions are applied.
	Approvers []string  `json:"approvers,omitempty"`
	StartedAt time.Time `json:"started_at"`
	// Calls, when set, pre-plan the run: they are the assistant message of step 0, which
	// the planner records instead of calling the model, and the run ends completed after
	// that step without a model call (`toolbus mcp` runs one MCP tools/call this way).
	Calls []ToolCall `json:"calls,omitempty"`
}

// NamesDecider reports whether who is the run's principal or one of its approvers: the
// identities the decision policy accepts for every run, whatever the injector's
// TOOLBUS_DECIDERS add.
func (r RunStarted) NamesDecider(who string) bool {
	who = strings.TrimSpace(who)
	return who != "" && (who == r.Principal.ID || slices.Contains(r.Approvers, who))
}

// AnyoneDecides, as an entry of the injector's deciders (TOOLBUS_DECIDERS), lets every
// identity decide on and cancel every run, as nil deciders do: one party on its own bus.
const AnyoneDecides = "*"

// NotDeciderError is the refusal of a decision or cancel by an identity the decision
// policy does not name for the run. A shared bus needs it: a client's credentials bind
// the actor of its decisions to its identity, and without a policy any client could
// approve, deny, answer in the tool's place or cancel any other client's run, and the
// first decision stands.
type NotDeciderError struct {
	Who, RunID, Principal string
}

func (e *NotDeciderError) Error() string {
	who := e.Who
	if who == "" {
		who = "a decision naming no one"
	}
	return fmt.Sprintf("%s may not decide on or cancel run %s: its principal %q, the approvers its start lists and the injector's TOOLBUS_DECIDERS may", who, e.RunID, e.Principal)
}

// CheckDecider applies the decision policy with the injector's deciders (nil or an
// entry AnyoneDecides lets anyone): who must be named by the run (NamesDecider) or by
// deciders, else a *NotDeciderError. The injector enforces it where decisions are
// applied; the console and the CLI explain it before publishing.
func (r RunStarted) CheckDecider(deciders []string, who string) error {
	who = strings.TrimSpace(who)
	if deciders == nil || slices.Contains(deciders, AnyoneDecides) || r.NamesDecider(who) ||
		(who != "" && slices.Contains(deciders, who)) {
		return nil
	}
	return &NotDeciderError{Who: who, RunID: r.RunID, Principal: r.Principal.ID}
}

// Allows reports whether the run may use tool.
func (r RunStarted) Allows(tool string) bool {
	if len(r.AllowedTools) == 0 {
		return true
	}
	for _, t := range r.AllowedTools {
		if t == tool {
			return true
		}
	}
	return false
}

// ModelRequested is the data of model.requested: the step to plan. The history is kept
// in the history store and not re-sent; only the results of the step before may ride
// along (PrevResults), so that the planner need not read them back.
type ModelRequested struct {
	RunID string `json:"run_id"`
	Step  int    `json:"step"`
	// PrevResults are the joined results of step-1, one per call in call order, as the
	// step's join state holds them (without Output), when their encoding fits the
	// injector's budget (the history store's inline budget, 32 KiB by default); absent
	// for step 0 and for larger results, which the planner reads from the history store.
	// The planner uses them only for the calls it recorded itself, matched one to one
	// (call id and tool, in order); otherwise it reads the store.
	PrevResults []ToolResult `json:"prev_results,omitempty"`
}

// ModelResponded is the data of model.responded: the whole assistant message of a step.
type ModelResponded struct {
	RunID     string  `json:"run_id"`
	Step      int     `json:"step"`
	Message   Message `json:"message"`
	Usage     Usage   `json:"usage"`
	Model     string  `json:"model,omitempty"`
	LatencyMS int64   `json:"latency_ms"`
}

// ToolRequested is the data of tool.requested: one call of a step.
type ToolRequested struct {
	RunID     string    `json:"run_id"`
	Step      int       `json:"step"`
	CallIndex int       `json:"call_index"`
	CallCount int       `json:"call_count"`
	Call      ToolCall  `json:"call"`
	Deadline  time.Time `json:"deadline,omitzero"`
	Principal Principal `json:"principal"`
	// AllowedTools is the run's allowlist (empty: every tool); the executor rejects other
	// tools as not_authorized.
	AllowedTools []string `json:"allowed_tools,omitempty"`
	// Approved is set when the call is re-issued after an approval decision; the executor
	// still checks the decision in the approval store.
	Approved bool `json:"approved,omitempty"`
	// Decision is the decision a re-issued call (Approved) carries. An executor in a team
	// account reads no approval store (accounts layout: only the core account may publish
	// tool.requested) and applies it as is; one in the core account reads the store.
	Decision *CallDecision `json:"decision,omitempty"`
}

// CallDecision is a person's decision on a call as a re-issued tool.requested carries
// it: the approval.granted (Granted) or approval.denied that stood.
type CallDecision struct {
	Approval
	Granted bool `json:"granted"`
}

// ToolFinished is the data of tool.finished: one ToolResult, its fields at the top level
// of the data (the embedded struct is flattened by encoding/json), with the call's
// position in the step beside them. A subscriber in any language reads data.status.
type ToolFinished struct {
	RunID     string `json:"run_id"`
	Step      int    `json:"step"`
	CallIndex int    `json:"call_index"`
	CallCount int    `json:"call_count"`
	ToolResult
}

// UnmarshalJSON reads the flat data of tool.finished and, for events already in streams
// written before the contract was made flat, the old nested shape {"result":{...}}.
func (tf *ToolFinished) UnmarshalJSON(b []byte) error {
	// flat has ToolFinished's fields but not this method, so decoding it does not recurse.
	type flat ToolFinished
	var v struct {
		flat
		// Result is the nested result of the old shape.
		Result *ToolResult `json:"result"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*tf = ToolFinished(v.flat)
	if v.Result != nil && tf.CallID == "" && tf.Status == "" {
		tf.ToolResult = *v.Result
	}
	return nil
}

// ToolWaiting is the data of tool.waiting: a call that needs approval and did not run.
type ToolWaiting struct {
	RunID     string   `json:"run_id"`
	Step      int      `json:"step"`
	CallIndex int      `json:"call_index"`
	CallCount int      `json:"call_count"`
	Call      ToolCall `json:"call"`
}

// ToolProgress is the data of tool.progress: how far a running call has come, as its
// tool reports it. A report renews the call's liveness (a long-running tool that stops
// reporting is timed out after its heartbeat timeout); it never changes the call's
// result, and a report for a call that is not running is not published (readers ignore
// one that has no running call).
type ToolProgress struct {
	RunID  string `json:"run_id"`
	Step   int    `json:"step"`
	CallID string `json:"call_id"`
	Tool   string `json:"tool"`
	// Attempt is the execution of the call that reports (ToolResult.Attempt).
	Attempt int `json:"attempt"`
	// Seq numbers the reports of one attempt from 1; a reader keeps the highest.
	Seq int `json:"seq"`
	// Done is the work done so far, in the tool's unit; Total the whole work, 0 when
	// unknown.
	Done  float64 `json:"done"`
	Total float64 `json:"total,omitempty"`
	// Message says what the tool is doing, for people.
	Message string `json:"message,omitempty"`
}

// ToolLog is the data of tool.log: one line a running call's tool logged (the executor
// SDK's logger, executor.Logger), for people and for the MCP host that called the tool
// (notifications/message at the level it set). A log line never changes the call's
// result or its liveness; it is redacted like every text of a result, and an executor
// publishes a bounded number per call (then one line that counts the rest, Dropped).
type ToolLog struct {
	RunID  string `json:"run_id"`
	Step   int    `json:"step"`
	CallID string `json:"call_id"`
	Tool   string `json:"tool"`
	// Attempt is the execution of the call that logs (ToolResult.Attempt).
	Attempt int `json:"attempt"`
	// Seq numbers the lines of one attempt from 1.
	Seq int `json:"seq"`
	// Level is the MCP (syslog) level: debug, info, notice, warning, error, critical,
	// alert or emergency.
	Level   string `json:"level"`
	Message string `json:"message"`
	// Attrs are the line's attributes as a JSON object (optional).
	Attrs json.RawMessage `json:"attrs,omitempty"`
	// Dropped, on the last line of an attempt that logged more than the executor
	// publishes, counts the lines that were not published.
	Dropped int `json:"dropped,omitempty"`
}

// ToolQuestion is the data of tool.question: a running call's tool asks the run's caller
// a question (executor.Ask) and waits for the answer (tool.answer) within its own
// timeout. The MCP door asks the host that called the tool (an elicitation form).
type ToolQuestion struct {
	RunID  string `json:"run_id"`
	Step   int    `json:"step"`
	CallID string `json:"call_id"`
	Tool   string `json:"tool"`
	// Attempt is the execution of the call that asked first (ToolResult.Attempt): a
	// re-run of the tool that asks the question again finds it and does not publish it
	// again.
	Attempt int `json:"attempt"`
	// Seq numbers the tool's questions from 1 in the order it asks them, on every run of
	// it: step, call and seq name the question, whichever attempt asks it.
	Seq     int    `json:"seq"`
	Message string `json:"message"`
	// Schema is the JSON Schema of the answer's content: an object of primitive
	// properties, as MCP elicitation requests take.
	Schema json.RawMessage `json:"schema"`
	// Key, when set, is the tool's name for the question (executor.AskNamed): `toolbus
	// mcp` keys the input request with it, and takes an answer a host sent under it.
	Key string `json:"key,omitempty"`
	// Method is what the tool asks of the caller's host (MCP's input request methods):
	// empty or elicitation/create (the caller's user answers Message against Schema),
	// sampling/createMessage (the host's model answers Params, an MCP CreateMessageParams)
	// or roots/list (the host names its roots). The answer's Content is the host's
	// result (an ElicitResult's content, a CreateMessageResult, a ListRootsResult).
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	// Batch and BatchSize: the question is one of BatchSize asked together
	// (executor.AskAll), numbered Batch to Batch+BatchSize-1; the door asks them in one
	// input_required result. Zero: asked alone.
	Batch     int `json:"batch,omitempty"`
	BatchSize int `json:"batch_size,omitempty"`
}

// The methods of a ToolQuestion (MCP's input requests).
const (
	AskElicit = "elicitation/create"
	AskSample = "sampling/createMessage"
	AskRoots  = "roots/list"
)

// ToolAnswer is the data of tool.answer: the caller's answer to a ToolQuestion, by its
// step, call and seq (Attempt is the question's, for its event id).
type ToolAnswer struct {
	RunID   string `json:"run_id"`
	Step    int    `json:"step"`
	CallID  string `json:"call_id"`
	Tool    string `json:"tool"`
	Attempt int    `json:"attempt"`
	Seq     int    `json:"seq"`
	// Action is accept (Content holds the answer), decline or cancel (MCP elicitation's).
	Action  string          `json:"action"`
	Content json.RawMessage `json:"content,omitempty"`
	// Reason says why there is no answer (a caller that cannot be asked), for the tool.
	Reason string `json:"reason,omitempty"`
	// Who answered (the subject's last token is its identity token).
	Who string `json:"who"`
}

// Approval is the data of approval.granted and approval.denied: a person's decision on
// a call that waits. Four decisions travel on the two types:
//
//   - approve: approval.granted; the call runs with the model's arguments;
//   - edit: approval.granted with Arguments; the call runs with the person's arguments
//     (a JSON object valid against the tool's input schema, else the decision is
//     refused and the call still waits);
//   - reject: approval.denied; the model reads Why (result rejected / approval_denied);
//   - respond: approval.denied with Response; the tool does not run and Response
//     becomes the call's result (succeeded, marked ToolResult.Human "responded").
type Approval struct {
	RunID  string `json:"run_id"`
	CallID string `json:"call_id"`
	Who    string `json:"who"`
	Why    string `json:"why,omitempty"`
	// Arguments (approval.granted only) are the person's edit of the call's arguments,
	// one JSON object; empty keeps the model's.
	Arguments string `json:"arguments,omitempty"`
	// Response (approval.denied only) answers in the tool's place: the call's result.
	Response string `json:"response,omitempty"`
}

// Decision kinds of a person (Approval, HumanDecision.Kind).
const (
	DecisionApproved  = "approved"
	DecisionEdited    = "edited"
	DecisionRejected  = "rejected"
	DecisionResponded = "responded"
)

// Kind returns the decision a of kind granted (approval.granted) or not stands for:
// DecisionApproved, DecisionEdited, DecisionRejected or DecisionResponded.
func (a Approval) Kind(granted bool) string {
	switch {
	case granted && a.Arguments != "":
		return DecisionEdited
	case granted:
		return DecisionApproved
	case a.Response != "":
		return DecisionResponded
	}
	return DecisionRejected
}

// HumanDecision marks a result that a person decided: the call ran as approved or with
// arguments a person edited, was rejected, or a person answered in the tool's place.
type HumanDecision struct {
	// Kind is DecisionApproved, DecisionEdited, DecisionRejected or DecisionResponded.
	Kind string `json:"kind"`
	// Who decided.
	Who string `json:"who"`
	// Arguments are the ones the call ran with, for an edit (the model's are the call's,
	// in tool.requested and model.responded).
	Arguments string `json:"arguments,omitempty"`
}

// Cancel is the data of run.cancel.
type Cancel struct {
	RunID  string `json:"run_id"`
	Reason string `json:"reason,omitempty"`
	Who    string `json:"who,omitempty"`
}

// RunStatus is the state of a run; every value but StatusRunning is terminal except
// RunWaitingForApproval, which resumes on a decision.
type RunStatus string

// Run statuses.
const (
	RunRunning            RunStatus = "running"
	RunCompleted          RunStatus = "completed"
	RunWaitingForApproval RunStatus = "waiting_for_approval"
	RunFailed             RunStatus = "failed"
	RunLimitReached       RunStatus = "limit_reached"
	RunCancelled          RunStatus = "cancelled"
)

// RunStatuses are every run status, in the order a person reads them (the filters of
// `toolbus runs --status` and of the console).
var RunStatuses = []RunStatus{RunRunning, RunWaitingForApproval, RunCompleted, RunFailed, RunLimitReached, RunCancelled}

// Terminal reports whether no further step may follow s.
func (s RunStatus) Terminal() bool {
	switch s {
	case RunCompleted, RunFailed, RunLimitReached, RunCancelled:
		return true
	}
	return false
}

// RunEnded is the data of run.<status> events (completed, failed, waiting_for_approval,
// limit_reached, cancelled).
type RunEnded struct {
	RunID  string    `json:"run_id"`
	Status RunStatus `json:"status"`
	// Answer is the final assistant text (completed).
	Answer string `json:"answer,omitempty"`
	// Reason explains failed, limit_reached and cancelled.
	Reason string `json:"reason,omitempty"`
	// Code is a stable machine-readable reason: the error code that failed the run, or
	// the limit reached (max_steps, deadline, token_budget).
	Code string `json:"code,omitempty"`
	// Pending lists the calls waiting for approval.
	Pending []ToolCall `json:"pending,omitempty"`
	// Unanswered lists the calls of the current step that had no result when the run's
	// deadline passed (limit_reached / deadline ended by the deadline timer).
	Unanswered []ToolCall `json:"unanswered,omitempty"`
	StepsUsed  int        `json:"steps_used"`
	Usage      Usage      `json:"usage"`
}

// Limit codes carried in RunEnded.Code for limit_reached.
const (
	LimitMaxSteps    = "max_steps"
	LimitDeadline    = "deadline"
	LimitTokenBudget = "token_budget"
)

// DefaultLimits are the limits a worker applies to runs that set none (TOOLBUS_MAX_STEPS,
// TOOLBUS_RUN_TIMEOUT, TOOLBUS_TOKEN_BUDGET); a zero field sets no default.
type DefaultLimits struct {
	MaxSteps int
	// RunTimeout gives a run with no deadline the deadline StartedAt + RunTimeout.
	RunTimeout  time.Duration
	TokenBudget int64
	// MaxRunTimeout caps every run's deadline, its own included, at StartedAt +
	// MaxRunTimeout (TOOLBUS_MAX_RUN_TIMEOUT; 0: no cap): the client chooses the
	// deadline, and a run holds its deadline timer until the run ends.
	MaxRunTimeout time.Duration
}

// WithDefaults returns rs with its zero limits filled from d (rs itself is not changed:
// it may be shared through the run cache).
func (rs *RunStarted) WithDefaults(d DefaultLimits) *RunStarted {
	l := rs.Limits
	capped := d.MaxRunTimeout > 0 && !rs.StartedAt.IsZero() && (l.Deadline.IsZero() || l.Deadline.After(rs.StartedAt.Add(d.MaxRunTimeout)))
	if (l.MaxSteps > 0 || d.MaxSteps <= 0) && (!l.Deadline.IsZero() || d.RunTimeout <= 0 || rs.StartedAt.IsZero()) &&
		(l.TokenBudget > 0 || d.TokenBudget <= 0) && !capped {
		return rs
	}
	cp := *rs
	if l.MaxSteps <= 0 && d.MaxSteps > 0 {
		cp.Limits.MaxSteps = d.MaxSteps
	}
	if l.Deadline.IsZero() && d.RunTimeout > 0 && !rs.StartedAt.IsZero() {
		cp.Limits.Deadline = rs.StartedAt.Add(d.RunTimeout)
	}
	if l.TokenBudget <= 0 && d.TokenBudget > 0 {
		cp.Limits.TokenBudget = d.TokenBudget
	}
	if d.MaxRunTimeout > 0 && !rs.StartedAt.IsZero() {
		if limit := rs.StartedAt.Add(d.MaxRunTimeout); cp.Limits.Deadline.IsZero() || cp.Limits.Deadline.After(limit) {
			cp.Limits.Deadline = limit
		}
	}
	return &cp
}

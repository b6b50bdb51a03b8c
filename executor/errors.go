package executor

import (
	"errors"
)

// ErrInvalidTool is wrapped by the errors of Register and RegisterFunc when a tool
// definition is unusable: a bad name, a nil Func, a missing input schema, a schema that
// does not compile, a negative limit or an input type a schema cannot be derived from.
var ErrInvalidTool = errors.New("executor: invalid tool")

// ErrDuplicateTool is wrapped by the error of Register and RegisterFunc when a tool of the
// same name is already registered.
var ErrDuplicateTool = errors.New("executor: duplicate tool")

// Error is the typed error a tool returns to choose the error of its result. A tool that
// returns an *Error (directly or wrapped) gets a failed result with Code, Message,
// Retryable and Details copied into ToolResult.Error; any other error becomes
// tool_error with the error's text as message.
//
// Message is shown to the model (after redaction) and should say what went wrong and
// what the model can do about it. Details is structured data for programs (it goes to
// ToolResult.Error.Details after field and pattern redaction) and is not shown to the
// model, so put whatever the model needs into Message.
type Error struct {
	// Code is a stable snake_case code such as "incident_not_found"; empty means
	// events.CodeToolError.
	Code string
	// Message is the human and model readable explanation.
	Message string
	// Retryable says whether the same call may succeed later.
	Retryable bool
	// Details is any JSON-marshalable value for programs; nil for none.
	Details any
}

// Error returns "code: message" (or just the message when Code is empty).
func (e *Error) Error() string {
	if e == nil {
		return "<nil>"
	}
	if e.Code == "" {
		return e.Message
	}
	return e.Code + ": " + e.Message
}

// NewError returns a non-retryable *Error with the given code and message.
func NewError(code, message string) *Error {
	return &Error{Code: code, Message: message}
}

// NewRetryableError returns a retryable *Error with the given code and message.
func NewRetryableError(code, message string) *Error {
	return &Error{Code: code, Message: message, Retryable: true}
}

// Violation is one reason why arguments (or a tool output) were refused. Invalid-argument
// results carry a []Violation as ToolResult.Error.Details, so programs can decode it.
type Violation struct {
	// Path is the JSON pointer (RFC 6901) of the offending value; "" is the whole
	// arguments object.
	Path string `json:"path"`
	// Message says what is wrong at Path.
	Message string `json:"message"`
	// Offset is the byte offset of a JSON syntax error in the raw arguments, when known.
	Offset *int64 `json:"offset,omitempty"`
}

// decodeError is returned by the Func that RegisterFunc builds when the validated
// arguments still do not decode into the input type; Execute turns it into a rejected
// invalid_arguments result (the typed function did not run).
type decodeError struct{ err error }

func (e *decodeError) Error() string { return "executor: decode arguments: " + e.err.Error() }
func (e *decodeError) Unwrap() error { return e.err }

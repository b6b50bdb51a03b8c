package mcpserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// taskNames checks the Mcp-Name header of a 2026-07-28 tasks/* request against the
// taskId of its body (SEP-2243, SEP-2663), as go-sdk checks it for tools/call: a header
// that names another task is refused with 400 and HeaderMismatch (-32020), so a proxy
// routing on the header and the door reading the body never act on different tasks.
func taskNames(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.Header.Get("Mcp-Name")
		if r.Method != http.MethodPost || name == "" || !strings.HasPrefix(r.Header.Get("Mcp-Method"), "tasks/") {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxTaskRequest))
		if err != nil {
			http.Error(w, "request too large", http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Params struct {
				TaskID string `json:"taskId"`
			} `json:"params"`
		}
		if json.Unmarshal(body, &msg) == nil && msg.Params.TaskID != name {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			id := msg.ID
			if len(id) == 0 {
				id = json.RawMessage("null")
			}
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32020,"message":%q}}`, id,
				fmt.Sprintf("header mismatch: Mcp-Name header value %q does not match body taskId %q", name, msg.Params.TaskID))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// maxTaskRequest bounds the body of a tasks/* request the door reads before go-sdk does.
const maxTaskRequest = 4 << 20

package mcptools

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolbus/toolbus"
)

// MCP content as a result: the attachments taken out of it, and the rest rendered as
// what the model reads, nothing dropped.

// Attachments takes the images, audio and binary embedded resources out of content as
// attachments, which pass through to the model and to MCP hosts (toolbus.Attachment),
// and returns the rest, which Text renders.
func Attachments(content []mcp.Content) ([]mcp.Content, []toolbus.Attachment) {
	var (
		rest  []mcp.Content
		files []toolbus.Attachment
	)
	for _, c := range content {
		switch x := c.(type) {
		case *mcp.ImageContent:
			files = append(files, toolbus.Attachment{MediaType: x.MIMEType, Data: x.Data})
		case *mcp.AudioContent:
			files = append(files, toolbus.Attachment{MediaType: x.MIMEType, Data: x.Data})
		case *mcp.EmbeddedResource:
			if r := x.Resource; r != nil && r.Text == "" && len(r.Blob) > 0 {
				files = append(files, toolbus.Attachment{MediaType: r.MIMEType, URI: r.URI, Data: r.Blob})
				continue
			}
			rest = append(rest, c)
		default:
			rest = append(rest, c)
		}
	}
	return rest, files
}

// Text renders MCP content blocks as what the model reads: text as is, other blocks
// described on a line of their own (kind, MIME type, size, URI), never dropped.
func Text(content []mcp.Content) string {
	parts := make([]string, 0, len(content))
	for _, c := range content {
		switch x := c.(type) {
		case *mcp.TextContent:
			parts = append(parts, x.Text)
		case *mcp.ImageContent:
			parts = append(parts, fmt.Sprintf("[image: %s, %d bytes]", orUnknown(x.MIMEType), len(x.Data)))
		case *mcp.AudioContent:
			parts = append(parts, fmt.Sprintf("[audio: %s, %d bytes]", orUnknown(x.MIMEType), len(x.Data)))
		case *mcp.ResourceLink:
			d := fmt.Sprintf("[resource link: %s <%s>", x.Name, x.URI)
			if x.MIMEType != "" {
				d += ", " + x.MIMEType
			}
			if x.Description != "" {
				d += ": " + x.Description
			}
			parts = append(parts, d+"]")
		case *mcp.EmbeddedResource:
			r := x.Resource
			if r == nil {
				parts = append(parts, "[resource]")
			} else if r.Text != "" {
				parts = append(parts, fmt.Sprintf("[resource %s]\n%s", r.URI, r.Text))
			} else {
				parts = append(parts, fmt.Sprintf("[resource %s: %s, %d bytes]", r.URI, orUnknown(r.MIMEType), len(r.Blob)))
			}
		default:
			b, _ := json.Marshal(c)
			parts = append(parts, fmt.Sprintf("[content: %s]", b))
		}
	}
	return strings.Join(parts, "\n")
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown type"
	}
	return s
}

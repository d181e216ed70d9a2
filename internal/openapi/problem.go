package openapi

// The problem+json body every refusal and failure is answered with
// (internal/failure.ProblemBody; a test keeps the two in step).

const (
	problemMedia = "application/problem+json"
	// defaultProblem is the response component for any other status.
	defaultProblem = "Problem"
	// streamErrorSchema is the error chunk of a server-streaming route.
	streamErrorSchema = "StreamError"
)

// problemStatuses are the statuses Mandate answers refusals with
// (failure.HTTPStatus), each a response component.
var problemStatuses = []struct{ status, name, desc string }{
	{"400", "BadRequest", "The request breaks its schema (`schema.invalid`, with `errors`) or is malformed (`request.*`)."},
	{"401", "Unauthorized", "No bearer token (`authentication.missing_credentials`) or not a valid one (`authentication.invalid_token`)."},
	{"403", "Forbidden", "The caller may not do this: `authorization.permission_denied`, `entitlement.missing`, `scope.denied`, `sod.conflict`, `confirmation.refused`, …"},
	{"404", "NotFound", "No such command, record or route (`command.not_found`, `request.route_not_found`)."},
	{"409", "Conflict", "The same call is still running (`idempotency.in_flight`): wait and retry."},
	{"422", "UnprocessableEntity", "A human must confirm first (`confirmation.required`, with `challenge_id` and `approval_url`), the idempotency key was used for other input (`idempotency.key_reused`), or the business state refuses the call (stages `state_check`, `pre_invariant`)."},
	{"429", "TooManyRequests", "A limit was reached; retry later."},
	{"503", "ServiceUnavailable", "A dependency is unavailable (`audit.unavailable`: nothing was dispatched). Retry later."},
}

func problemResponses() map[string]Response {
	content := map[string]MediaType{problemMedia: {Schema: Schema{"$ref": SchemaRef(ProblemSchema)}}}
	rs := map[string]Response{
		defaultProblem: {Description: "An RFC 9457 problem: the refusal's stage and stable code.", Content: content},
	}
	for _, p := range problemStatuses {
		r := Response{Description: p.desc, Content: content}
		if p.status == "401" {
			r.Headers = map[string]Header{"WWW-Authenticate": {
				Description: "`Bearer error=\"invalid_token\"` (RFC 6750).",
				Schema:      Schema{"type": "string"},
			}}
		}
		rs[p.name] = r
	}
	return rs
}

// problemSchema is the RFC 9457 problem document with Mandate's members
// (the mandate.v1.CommandError fields).
func problemSchema() Schema {
	str := func(desc string) Schema { return Schema{"type": "string", "description": desc} }
	return Schema{
		"type":        "object",
		"description": "An RFC 9457 problem document. `code` and `stage` are the same strings as in the gRPC status (`google.rpc.ErrorInfo.reason`, `mandate.v1.CommandError`) and in MCP tool results.",
		"properties": Schema{
			"type":          Schema{"type": "string", "format": "uri-reference", "description": "Always `about:blank`: `code` identifies the problem."},
			"title":         str("The HTTP status text."),
			"status":        Schema{"type": "integer", "minimum": 100, "maximum": 599, "description": "The HTTP status code."},
			"detail":        str("What went wrong. Never contains sensitive field values."),
			"instance":      str("The request path."),
			"code":          str("The stable, dotted refusal code, e.g. `authorization.permission_denied`."),
			"stage":         str("The pipeline stage that refused or failed, e.g. `permission_check`."),
			"retriable":     Schema{"type": "boolean", "description": "Whether the same call may succeed if retried later unchanged."},
			"remedy":        str("What the caller should do next, in one sentence."),
			"retry_after":   Schema{"type": "integer", "minimum": 1, "description": "For a retriable refusal such as `rate.limited`: whole seconds to wait before calling again (also the `Retry-After` header)."},
			"invocation_id": str("The invocation the refusal belongs to; it is in the audit trail."),
			"challenge_id":  str("For `confirmation.required`: the challenge a human must decide."),
			"approval_url":  Schema{"type": "string", "format": "uri", "description": "For `confirmation.required`: where a human can decide the challenge."},
			"grant_in": Schema{"type": "string", "enum": []any{"mcp_meta", "http_header", "grpc_metadata", "request_field"},
				"description": "For `confirmation.required`: where the same call, made again once approved, carries the challenge id."},
			"grant_name":          str("For `confirmation.required`: the name to put the challenge id under, e.g. the header `X-Mandate-Approval-Grant`."),
			"approver_permission": str("For `confirmation.required` under four eyes: the permission the approving user must hold; the caller's user may not approve."),
			"errors": Schema{
				"type":        "array",
				"description": "For `schema.invalid`: every violated rule.",
				"items": Schema{
					"type": "object",
					"properties": Schema{
						"pointer": str("RFC 6901 JSON pointer into the request, with proto field names; empty for the whole request."),
						"rule":    str("The rule id, e.g. `string.pattern` or `schema.unknown_field`."),
						"detail":  str("What is wrong, without echoing the value."),
					},
					"required":             []string{"pointer", "rule", "detail"},
					"additionalProperties": false,
				},
			},
		},
		"required":             []string{"type", "title", "status", "code", "retriable"},
		"additionalProperties": false,
	}
}

// streamError is the gateway's error chunk of a stream: a google.rpc.Status.
func streamError() Schema {
	return Schema{
		"type":        "object",
		"description": "A google.rpc.Status in protojson: the gRPC code, its message and details (a `mandate.v1.CommandError` among them).",
		"properties": Schema{
			"code":    Schema{"type": "integer", "format": "int32", "description": "The gRPC status code."},
			"message": Schema{"type": "string"},
			"details": Schema{"type": "array", "items": Schema{
				"type":       "object",
				"properties": Schema{"@type": Schema{"type": "string"}},
				"required":   []string{"@type"},
			}},
		},
	}
}

package mcpbridge

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/callattr"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
)

// ProtocolStateless is the first MCP revision without sessions: no
// initialize, per-request `_meta` capabilities, and multi round-trip
// requests (MRTR) in place of server-initiated elicitation. The bridge
// serves it on a stateless transport when Config.StateKey is set.
const ProtocolStateless = "2026-07-28"

// InputConfirm is the key of the confirmation form in an input_required
// result's inputRequests, and of its answer in the retry's inputResponses.
const InputConfirm = "confirm"

// MinStateKeyBytes is the shortest Config.StateKey accepted.
const MinStateKeyBytes = 32

// DefaultStateTTL is how long a sealed requestState stays valid (capped by
// the challenge's own expiry).
const DefaultStateTTL = 10 * time.Minute

// stateLabel separates the requestState MAC from any other use of the key.
const stateLabel = "mandate.dev/mcp-request-state/v1\x00"

// protocolVersionHeader is the Streamable HTTP header naming the revision.
const protocolVersionHeader = "Mcp-Protocol-Version"

// requestState is the sealed payload of an input_required result: what the
// retry must match before the answer it carries is recorded.
type requestState struct {
	// Principal is the SHA-256 of the principal key (principalKey).
	Principal string `json:"p"`
	Tool      string `json:"t"`
	// Args is the SHA-256 of the arguments in canonical form.
	Args      string `json:"a"`
	Challenge string `json:"c"`
	// Expires is a Unix time in seconds.
	Expires int64 `json:"e"`
}

// statelessRequest reports whether a request follows the sessionless
// revision (its Mcp-Protocol-Version header is 2026-07-28 or later).
func statelessRequest(r *http.Request) bool {
	v := r.Header.Get(protocolVersionHeader)
	return v != "" && v >= ProtocolStateless
}

// modern reports whether a tools/call follows the sessionless revision.
func modern(req *mcp.CallToolRequest) bool {
	return req.ProtocolVersion() >= ProtocolStateless
}

// privateCache marks every cacheable result private: tools/list and the
// resources differ per principal, so no shared cache may serve them.
func privateCache(_ context.Context, _ mcp.Request, c *mcp.Cacheable) {
	c.CacheScope = "private"
}

// seal signs st with the state key: base64url(JSON) "." base64url(HMAC).
func (b *Bridge) seal(st requestState) (string, error) {
	body, err := json.Marshal(st)
	if err != nil {
		return "", err
	}
	enc := base64.RawURLEncoding
	return enc.EncodeToString(body) + "." + enc.EncodeToString(b.mac(body)), nil
}

// open verifies a sealed state and decodes it. It checks the MAC only;
// the caller checks the binding and the expiry.
func (b *Bridge) open(s string) (requestState, error) {
	var st requestState
	body64, mac64, ok := strings.Cut(s, ".")
	if !ok {
		return st, errors.New("requestState is not one the bridge issued")
	}
	enc := base64.RawURLEncoding
	body, err1 := enc.DecodeString(body64)
	mac, err2 := enc.DecodeString(mac64)
	if err1 != nil || err2 != nil || !hmac.Equal(mac, b.mac(body)) {
		return st, errors.New("requestState is not one the bridge issued")
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, errors.New("requestState is not one the bridge issued")
	}
	return st, nil
}

func (b *Bridge) mac(body []byte) []byte {
	h := hmac.New(sha256.New, b.cfg.StateKey)
	h.Write([]byte(stateLabel))
	h.Write(body)
	return h.Sum(nil)
}

// principalDigest is the SHA-256 of a principal's key, so that the state
// a client holds does not spell out identities.
func principalDigest(p identity.Principal) string {
	sum := sha256.Sum256([]byte(principalKey(p)))
	return hex.EncodeToString(sum[:])
}

// argsDigest is the SHA-256 of the arguments in canonical JSON (object
// keys sorted, no insignificant whitespace, numbers kept verbatim), so a
// client that re-encodes the same arguments on the retry still matches.
func argsDigest(input []byte) (string, error) {
	d := json.NewDecoder(bytes.NewReader(input))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return "", err
	}
	canon, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:]), nil
}

// askInput answers a confirmation.required call of a sessionless client
// that declared form elicitation with an input_required result: the
// confirm service's prompt as a form under InputConfirm, and a sealed
// requestState binding the principal, tool, arguments, challenge and an
// expiry. The client asks its user and calls again, with a new request id,
// carrying the answer and the state (resume).
func (b *Bridge) askInput(ctx context.Context, p identity.Principal, call toolCall, c *mandatev1.Challenge, refused error) (*mcp.CallToolResult, error) {
	digest, err := argsDigest(call.Input)
	if err != nil {
		return b.refusal(ctx, call.Code, refused)
	}
	exp := b.now().Add(DefaultStateTTL)
	if c.GetExpiresAt() != nil && c.GetExpiresAt().AsTime().Before(exp) {
		exp = c.GetExpiresAt().AsTime()
	}
	id := c.GetChallengeId()
	state, err := b.seal(requestState{
		Principal: principalDigest(p), Tool: call.Code, Args: digest, Challenge: id, Expires: exp.Unix(),
	})
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "sealing requestState"}
	}
	b.log.InfoContext(ctx, "mcpbridge: confirmation asked through an input_required result",
		"tool", call.Code, "challenge_id", id)
	return &mcp.CallToolResult{
		InputRequests: mcp.InputRequestMap{InputConfirm: &mcp.ElicitParams{
			Meta: mcp.Meta{MetaChallenge: id},
			Mode: "form", Message: FormMessage(c.GetPrompt()), RequestedSchema: approvalSchema,
		}},
		RequestState: state,
	}, nil
}

// resume handles the retry of an input_required result: it checks the
// requestState's seal, that it was issued to this principal for this tool
// and these arguments, and that it has not expired; then it records the
// answer (decideElicited, single use: a challenge is decided once) and
// runs the call with the grant, which the executor redeems once. Any
// failed check refuses with failure.CodeConfirmationInvalidState and decides nothing.
func (b *Bridge) resume(ctx context.Context, req *mcp.CallToolRequest, p identity.Principal, call toolCall) (*mcp.CallToolResult, error) {
	if b.cfg.Confirm == nil || len(b.cfg.StateKey) == 0 {
		return b.invalidState(ctx, call, "this bridge issues no requestState")
	}
	st, err := b.open(req.Params.RequestState)
	if err != nil {
		return b.invalidState(ctx, call, err.Error())
	}
	digest, err := argsDigest(call.Input)
	switch {
	case st.Principal != principalDigest(p):
		return b.invalidState(ctx, call, "requestState was issued to another principal")
	case st.Tool != call.Code:
		return b.invalidState(ctx, call, "requestState was issued for another tool")
	case err != nil || st.Args != digest:
		return b.invalidState(ctx, call, "requestState was issued for other arguments")
	case b.now().Unix() >= st.Expires:
		return b.invalidState(ctx, call, "requestState has expired; call the tool again without it")
	}
	ans, ok := req.Params.InputResponses[InputConfirm].(*mcp.ElicitResult)
	if !ok || ans == nil {
		return b.invalidState(ctx, call, fmt.Sprintf("the retry carries no elicitation answer under inputResponses[%q]", InputConfirm))
	}
	if ans.Action == "cancel" {
		// Nothing is decided: the call runs with the grant, which the
		// executor refuses as still pending (audited), unless someone
		// approved it on the page meanwhile.
		call.GrantID = st.Challenge
		out, err := b.execute(ctx, call)
		if err != nil {
			return b.cancelled(ctx, call, st.Challenge, err)
		}
		return b.result(ctx, req, call, out), nil
	}
	approve := ans.Action == "accept"
	if err := b.decideElicited(ctx, st.Challenge, approve); err != nil {
		if isCode(err, failure.CodeConfirmationAlreadyDecided) {
			return b.invalidState(ctx, call, "requestState was used before; call the tool again without it")
		}
		b.log.WarnContext(ctx, "mcpbridge: recording the MRTR answer failed",
			"tool", call.Code, "challenge_id", st.Challenge, "action", ans.Action, "error", err)
		if fe, ok := refusalOf(err); ok && fe.Stage == stageConfirmation {
			// Nothing was recorded; say why in the confirm service's words.
			return b.stateRefusal(ctx, call, fe.Code, fe.Message)
		}
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "recording the confirmation failed"}
	}
	b.log.InfoContext(ctx, "mcpbridge: confirmation answered through MRTR",
		"tool", call.Code, "challenge_id", st.Challenge, "action", ans.Action, "approved", approve)
	return b.runWithGrant(ctx, req, call, st.Challenge)
}

// invalidState refuses an MRTR retry whose requestState is not one the
// bridge sealed for this principal, tool and arguments, has expired, or was
// used before, with failure.CodeConfirmationInvalidState. Nothing is
// decided or run.
func (b *Bridge) invalidState(ctx context.Context, call toolCall, why string) (*mcp.CallToolResult, error) {
	b.log.WarnContext(ctx, "mcpbridge: refusing an MRTR retry", "tool", call.Code, "reason", why)
	return b.stateRefusal(ctx, call, failure.CodeConfirmationInvalidState, why)
}

// stateRefusal refuses an MRTR retry whose requestState or answer the
// bridge cannot accept. The refusal is the executor's: the call goes to it
// with the problem attached, so that it is refused at confirmation_check
// with code and message — and audited like every other attempt, forged or
// replayed states included.
func (b *Bridge) stateRefusal(ctx context.Context, call toolCall, code, why string) (*mcp.CallToolResult, error) {
	call.Invalid = append(call.Invalid, callattr.Invalid{
		Name: callattr.RequestState, Rule: code, Reason: why,
	})
	_, err := b.execute(ctx, call)
	if err == nil {
		// An executor that ran the call anyway is a bug; never report it
		// as the answer to a refused retry.
		b.log.ErrorContext(ctx, "mcpbridge: the executor ran an MRTR retry the bridge refused", "tool", call.Code)
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "refusing the retry failed"}
	}
	return b.refusal(ctx, call.Code, err)
}

// encodedResult is a tools/call result as the bridge has the SDK send it:
// with its resultType for a sessionless request (the SDK sets it only on
// results of its own tools/call handler, which the bridge's interception
// bypasses), and encoded in one pass when it is the result of a call that
// ran (encodeRan).
type encodedResult struct {
	mcp.ResultBase
	res   *mcp.CallToolResult
	typed bool // with resultType
}

// encoded wraps res for the SDK to send, typed for a sessionless client.
// An untyped result that asks for input is left as it is: the SDK fulfils
// those requests itself for such clients, which needs the result's own
// type.
func encoded(res *mcp.CallToolResult, typed bool) mcp.Result {
	if !typed {
		if res.InputRequests != nil {
			return res
		}
		return &encodedResult{res: res}
	}
	if res.Content == nil && res.InputRequests == nil {
		res.Content = []mcp.Content{}
	}
	return &encodedResult{res: res, typed: true}
}

// GetMeta implements mcp.Result over the wrapped result.
func (t *encodedResult) GetMeta() map[string]any { return t.res.GetMeta() }

// SetMeta implements mcp.Result over the wrapped result.
func (t *encodedResult) SetMeta(m map[string]any) { t.res.SetMeta(m) }

// MarshalJSON is the wrapped result's JSON, when typed with resultType
// spliced in as its first member (the result's own encoding never has
// one) rather than decoded and encoded again. The result of a call that
// ran, as result() builds it, is encoded in one pass (encodeRan).
func (t *encodedResult) MarshalJSON() ([]byte, error) {
	if body, ok := encodeRan(t.res, t.typed); ok {
		return body, nil
	}
	if !t.typed {
		return t.res.MarshalJSON()
	}
	return spliceResultType(t.res)
}

// spliceResultType encodes any result with resultType spliced in.
func spliceResultType(res *mcp.CallToolResult) ([]byte, error) {
	body, err := res.MarshalJSON() // what json.Marshal(t.res) returns, without a second copy
	if err != nil {
		return nil, err
	}
	rt := `{"resultType":"complete"`
	if res.InputRequests != nil {
		rt = `{"resultType":"input_required"`
	}
	if len(body) < 2 || body[0] != '{' {
		return nil, errors.New("mcpbridge: a tool result did not encode as a JSON object")
	}
	out := make([]byte, 0, len(rt)+len(body)+1)
	out = append(out, rt...)
	if rest := body[1:]; len(rest) > 1 { // more than the closing brace
		out = append(out, ',')
		out = append(out, rest...)
	} else {
		out = append(out, '}')
	}
	return out, nil
}

// ranWire is the JSON of a complete result with one text block, an
// invocation id in _meta (and the server's info, which the SDK adds for a
// sessionless client), and structuredContent: the members in the order
// CallToolResult encodes them, after resultType when typed, and _meta's
// in the order of their keys, as a map's.
type ranWire struct {
	ResultType string `json:"resultType,omitempty"`
	Meta       struct {
		ServerInfo   *mcp.Implementation `json:"io.modelcontextprotocol/serverInfo,omitempty"`
		InvocationID string              `json:"mandate.dev/invocation_id"`
	} `json:"_meta"`
	Content [1]struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	// A pointer: encoding a RawMessage value would box it.
	StructuredContent *json.RawMessage `json:"structuredContent"`
}

// encodeRan encodes res in one json.Marshal, without the SDK's nested
// encoders, when res has exactly ranWire's shape; the bytes are those of
// the general path. ok is false for any other result, and for one whose
// encoding fails, which the general path then reports in its words.
func encodeRan(res *mcp.CallToolResult, typed bool) (body []byte, ok bool) {
	if res.IsError || res.InputRequests != nil || res.RequestState != "" || len(res.Content) != 1 {
		return nil, false
	}
	id, isString := res.Meta[MetaInvocation].(string)
	info, hasInfo := res.Meta[mcp.MetaKeyServerInfo].(*mcp.Implementation)
	if len(res.Meta) != 1 && (len(res.Meta) != 2 || !hasInfo || info == nil) {
		return nil, false
	}
	text, isText := res.Content[0].(*mcp.TextContent)
	structured, isRaw := res.StructuredContent.(*json.RawMessage)
	if !isString || !isText || text.Meta != nil || text.Annotations != nil || !isRaw || structured == nil {
		return nil, false
	}
	var w ranWire
	if typed {
		w.ResultType = "complete"
	}
	w.Meta.ServerInfo, w.Meta.InvocationID = info, id
	w.Content[0].Type, w.Content[0].Text = "text", text.Text
	w.StructuredContent = structured
	body, err := json.Marshal(&w)
	return body, err == nil
}

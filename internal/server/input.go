package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/edgelimit"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/schema"
	"github.com/mandate-dev/mandate/internal/strictjson"
)

// Hostile REST input.
//
// Before the gateway reads anything of a REST request it authenticates the
// bearer token (401 without the body being read). Then it checks what the
// caller controls: path parameters and query parameters must be valid
// percent-encoding of valid UTF-8, and a body must pass strictjson.Check
// (one value, valid UTF-8, nesting at most strictjson.DefaultMaxDepth, no
// duplicate member names) and decode as the route's request message.
//
// A request that fails is never answered 5xx and never run with a repaired
// input. Its faults travel, as violations, to the RPC the route names:
//
//   - A service that implements GatewayInputRefuser (the executor: its
//     Execute RPC and the governed proxy of every command's own RPC) refuses
//     the call itself, through its pipeline, so the attempt is audited like
//     any other: 400 `schema.invalid` at stage `schema_validate`, after
//     authorisation.
//   - Any other RPC is refused by the server before its handler runs, with
//     the same 400 `schema.invalid` at `schema_validate`.
//
// Either way the problem body's `errors` list one violation per fault, with
// the rule ids of internal/schema: `schema.utf8` (a path or query parameter,
// pointer `/<field>`, or the body), `schema.syntax` (not JSON, data after
// the value, a query string that is not percent-encoding),
// `schema.too_deep`, `schema.duplicate_key` (pointer to the member), and
// `schema.decode` (JSON that is not the route's request message). Body
// pointers are relative to the HTTP body. Messages never echo the input.
//
// To carry the faults to the RPC, the gateway sends the call with the
// offending parts replaced by harmless ones (an empty message, no query, path
// parameters with U+FFFD for invalid bytes) and the violations in the
// gatewayInputHeader metadata, which the server trusts only on calls that
// also carry its gateway nonce.

// gatewayInputHeader carries the violations (JSON) from the gateway to the
// gRPC side.
const gatewayInputHeader = "x-mandate-gateway-input-bin"

// GatewayInputRefuser is implemented by a gRPC service that refuses, in its
// own pipeline, a REST call whose path, query or body the gateway could not
// read, reading the faults with GatewayInputError. The handler of unknown
// services (the executor's governed proxy) is assumed to do so as well.
// Calls to other services are refused by the server.
type GatewayInputRefuser interface {
	RefusesGatewayInput() bool
}

type inputKey struct{}

// GatewayInputError returns what the REST gateway found wrong with the
// path, query or body of the request a call relays, or nil. The call's
// request message is then a placeholder and must not be acted on.
func GatewayInputError(ctx context.Context) *schema.InvalidError {
	ie, _ := ctx.Value(inputKey{}).(*schema.InvalidError)
	return ie
}

// inputRefusal is the server's own refusal of a call carrying faults.
func inputRefusal(ie *schema.InvalidError) error {
	e := failure.New(failure.StageSchema, failure.CodeSchemaInvalid, "the request breaks its schema")
	e.Remedy = "fix the fields listed in violations"
	for _, v := range ie.Violations {
		e.Violations = append(e.Violations, failure.Violation{Pointer: v.Pointer, Rule: v.Rule, Message: v.Message})
	}
	return e
}

// inputUnary refuses calls carrying gateway faults to services that do not
// refuse them themselves. It runs after authentication.
func (s *Server) inputUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if ie := GatewayInputError(ctx); ie != nil && !refuses(info.Server) {
		return nil, inputRefusal(ie)
	}
	return handler(ctx, req)
}

func (s *Server) inputStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	// srv is nil for the unknown-service handler: the governed proxy.
	if ie := GatewayInputError(ss.Context()); ie != nil && srv != nil && !refuses(srv) {
		return inputRefusal(ie)
	}
	return handler(srv, ss)
}

func refuses(srv any) bool {
	r, ok := srv.(GatewayInputRefuser)
	return ok && r.RefusesGatewayInput()
}

// readGatewayInput reads the faults a trusted gateway call carries.
func readGatewayInput(vals []string) *schema.InvalidError {
	if len(vals) == 0 {
		return nil
	}
	var vs []schema.Violation
	if len(vals) != 1 || json.Unmarshal([]byte(vals[0]), &vs) != nil || len(vs) == 0 {
		vs = []schema.Violation{{Rule: "schema.decode", Message: "the request could not be read"}}
	}
	return &schema.InvalidError{Violations: vs}
}

// inputSlot collects the faults of one REST request, from the middleware
// (path, query) and the body decoder, for the client interceptor.
type inputSlot struct {
	mu         sync.Mutex
	violations []schema.Violation
	// redispatched is set once the gateway's own refusal of a parameter
	// was turned into a violation and the request routed again.
	redispatched bool
}

func (s *inputSlot) add(vs ...schema.Violation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.violations = append(s.violations, vs...)
}

func (s *inputSlot) get() []schema.Violation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]schema.Violation(nil), s.violations...)
}

type slotKey struct{}

// checkedBody is a request body whose decoder reports faults to a slot
// rather than failing the request.
type checkedBody struct {
	io.ReadCloser
	slot *inputSlot
}

// checkRequest is the gateway middleware: authenticate, then check the
// path and query parameters and arrange for the body's check.
func (s *Server) checkRequest(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
		routeGateway(r)
		authed, err := s.cfg.Auth.Authenticate(r.Context(), r.Header.Values("Authorization"), r.Header.Values(identity.OnBehalfOfHeader))
		if err != nil {
			if s.edgeRefused(w, r, identity.Principal{}, edgelimit.AnonymousKey(r.RemoteAddr)) {
				return
			}
			if identity.ErrorCode(err) == failure.CodeAuthenticationMissingCredentials {
				w.Header().Set("WWW-Authenticate", "Bearer")
			}
			WriteProblem(w, failure.Problem(failure.ToStatus(err), safePath(r)))
			return
		}
		if p, _ := identity.FromContext(authed); s.edgeRefused(w, r, p, edgelimit.Key(p)) {
			return
		}
		if r.ContentLength > int64(s.cfg.MaxRecvBytes) {
			WriteProblem(w, failure.ProblemBody{Type: "about:blank", Title: http.StatusText(http.StatusRequestEntityTooLarge),
				Status: http.StatusRequestEntityTooLarge, Instance: safePath(r), Code: failure.CodeRequestTooLarge,
				Detail: "the request body is larger than " + strconv.Itoa(s.cfg.MaxRecvBytes) + " bytes"})
			return
		}
		slot, again := r.Context().Value(slotKey{}).(*inputSlot)
		if !again {
			slot = &inputSlot{}
			r = r.Clone(context.WithValue(r.Context(), slotKey{}, slot))
		}
		if !utf8.ValidString(r.URL.Path) {
			r.URL.Path, r.URL.RawPath = strings.ToValidUTF8(r.URL.Path, "\uFFFD"), ""
		}
		names := make([]string, 0, len(params))
		for name := range params {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			if v := params[name]; !utf8.ValidString(v) {
				slot.add(schema.Violation{Pointer: fieldPointer(name), Rule: strictjson.RuleUTF8, Message: "path parameter " + name + " is not valid UTF-8"})
				params[name] = strings.ToValidUTF8(v, "\uFFFD")
			}
		}
		if vs := queryViolations(r.URL.RawQuery); len(vs) > 0 {
			slot.add(vs...)
			r.URL.RawQuery = ""
		}
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = &checkedBody{ReadCloser: r.Body, slot: slot}
		}
		next(w, r, params)
	}
}

// edgeRefused takes a token from key's bucket (Config.EdgeLimit) and, when
// there is none, answers 429 rate.limited with Retry-After, has the
// refusal recorded (Config.EdgeRecorder; p names no tenant for a request
// that did not authenticate, which leaves no row), and reports true.
func (s *Server) edgeRefused(w http.ResponseWriter, r *http.Request, p identity.Principal, key string) bool {
	ok, retry := s.cfg.EdgeLimit.Allow(key)
	if ok {
		return false
	}
	e := edgelimit.RateLimited(retry)
	s.cfg.EdgeRecorder.Record(edgelimit.Refusal{Principal: p, Channel: contract.ChannelREST, Code: e.Code, Message: e.Message})
	w.Header().Set("Retry-After", strconv.Itoa(failure.RetryAfterSeconds(retry)))
	WriteProblem(w, failure.Problem(e.GRPCStatus(), safePath(r)))
	return true
}

// redispatch handles the gateway's own refusal of a bodyless request whose
// query parameter does not parse as its field's type (e.g. page_size=many):
// the request is routed once more without its query and with the fault as
// a violation, so that the RPC refuses it — and, for a command, audits the
// attempt — like every other bad input. It reports whether it did.
func redispatch(mux *runtime.ServeMux, w http.ResponseWriter, r *http.Request) bool {
	slot, ok := r.Context().Value(slotKey{}).(*inputSlot)
	if !ok || r.URL.RawQuery == "" || (r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0) {
		return false
	}
	slot.mu.Lock()
	done := slot.redispatched
	slot.redispatched = true
	slot.mu.Unlock()
	if done {
		return false
	}
	slot.add(schema.Violation{Rule: "schema.decode", Message: "a query parameter does not hold a value of its field's type"})
	r2 := r.Clone(r.Context())
	r2.URL.RawQuery, r2.Form = "", nil
	mux.ServeHTTP(w, r2)
	return true
}

// safePath is the request path for a problem's instance member.
func safePath(r *http.Request) string { return strings.ToValidUTF8(r.URL.Path, "\uFFFD") }

// queryViolations checks a raw query string. Names are not echoed unless
// they are valid UTF-8.
func queryViolations(raw string) []schema.Violation {
	if raw == "" {
		return nil
	}
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return []schema.Violation{{Rule: strictjson.RuleSyntax, Message: "the query string is not valid percent-encoding"}}
	}
	var out []schema.Violation
	names := make([]string, 0, len(vals))
	for name := range vals {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !utf8.ValidString(name) {
			out = append(out, schema.Violation{Rule: strictjson.RuleUTF8, Message: "a query parameter name is not valid UTF-8"})
			continue
		}
		for _, v := range vals[name] {
			if !utf8.ValidString(v) {
				out = append(out, schema.Violation{Pointer: fieldPointer(name), Rule: strictjson.RuleUTF8, Message: "query parameter " + name + " is not valid UTF-8"})
				break
			}
		}
	}
	return out
}

// fieldPointer turns a gateway field path (a.b) into a JSON pointer.
func fieldPointer(path string) string {
	var b strings.Builder
	for seg := range strings.SplitSeq(path, ".") {
		b.WriteString("/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(seg))
	}
	return b.String()
}

// strictMarshaler is the gateway's JSON marshaler with a strict decoder:
// strictjson.Check before protojson. A fault of a checked body is reported
// to the request's slot and the message left empty, so the call still
// reaches its RPC, which refuses it (see GatewayInputRefuser).
type strictMarshaler struct {
	*runtime.JSONPb
}

// NewDecoder implements runtime.Marshaler.
func (m *strictMarshaler) NewDecoder(r io.Reader) runtime.Decoder {
	return runtime.DecoderFunc(func(v any) error {
		vio, err := m.decode(r, v)
		if vio == nil {
			return err
		}
		body, ok := r.(*checkedBody)
		if !ok {
			return errors.New(vio.Message)
		}
		body.slot.add(*vio)
		if msg, ok := v.(proto.Message); ok {
			proto.Reset(msg)
		}
		return nil
	})
}

// decode returns a violation for a body the caller got wrong, or an error
// for one that could not be read (too large, connection failure).
func (m *strictMarshaler) decode(r io.Reader, v any) (*schema.Violation, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if err := strictjson.Check(data, 0); err != nil {
		if errors.Is(err, strictjson.ErrEmpty) {
			return nil, io.EOF // no body, as the gateway expects
		}
		var se *strictjson.Error
		if !errors.As(err, &se) {
			return nil, err
		}
		return &schema.Violation{Pointer: se.Pointer, Rule: se.Rule, Message: se.Message}, nil
	}
	if err := m.Unmarshal(bytes.TrimSpace(data), v); err != nil {
		what := "the request message"
		if msg, ok := v.(proto.Message); ok {
			what = "a valid " + string(msg.ProtoReflect().Descriptor().FullName())
		}
		return &schema.Violation{Rule: "schema.decode", Message: "the body is not " + what}, nil
	}
	return nil, nil
}

// withGatewayInput puts the faults of the REST request behind ctx (if
// any) in the outgoing metadata, replacing whatever a caller may have
// smuggled in under the same name.
func withGatewayInput(ctx context.Context) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Delete(gatewayInputHeader)
	if slot, ok := ctx.Value(slotKey{}).(*inputSlot); ok {
		if vs := slot.get(); len(vs) > 0 {
			b, _ := json.Marshal(vs)
			md.Set(gatewayInputHeader, string(b))
		}
	}
	return metadata.NewOutgoingContext(ctx, md)
}

func gatewayInputUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(withGatewayInput(ctx), method, req, reply, cc, opts...)
}

func gatewayInputStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return streamer(withGatewayInput(ctx), desc, cc, method, opts...)
}

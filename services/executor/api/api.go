// Package api exposes the executor over gRPC and REST: the
// mandate.v1.ExecutorService/Execute RPC, and a governed proxy that accepts
// any published command's own RPC (e.g.
// examples.helpdesk.v1.HelpdeskService/IssueRefund) on the same port. Both
// hand the call to the one pipeline; RPCs that are not published commands
// are refused, never forwarded.
package api

import (
	"context"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/callattr"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/manifestcheck"
	"github.com/mandate-dev/mandate/internal/schema"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/services/executor"
)

// Metadata a caller may send with a call.
const (
	MetadataIdempotencyKey = "idempotency-key"
	MetadataGrant          = contract.GrantMetadata
	MetadataConversation   = "x-mandate-conversation"
	MetadataTenant         = "x-mandate-tenant"
	// MCPBridgeService is the service identity of the MCP bridge; calls it
	// makes on behalf of a user are recorded with channel "mcp".
	MCPBridgeService = identity.MCPBridgeService
)

// Service implements mandate.v1.ExecutorService and the governed proxy.
type Service struct {
	mandatev1.UnimplementedExecutorServiceServer
	exec     *executor.Executor
	manifest *manifest.Set
}

// New returns the API over an executor.
func New(exec *executor.Executor, set *manifest.Set) *Service {
	return &Service{exec: exec, manifest: set}
}

// ServerOptions are the gRPC server options the proxy needs: a codec that
// passes command payloads through as bytes (and everything else through the
// proto codec) and the handler for RPCs no registered service serves.
func (s *Service) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(rawCodec{fallback: encoding.GetCodecV2("proto")}),
		grpc.UnknownServiceHandler(s.proxy),
	}
}

// Register adds ExecutorService to a gRPC server.
func (s *Service) Register(g grpc.ServiceRegistrar) { mandatev1.RegisterExecutorServiceServer(g, s) }

// Execute runs one command.
func (s *Service) Execute(ctx context.Context, req *mandatev1.ExecuteRequest) (*mandatev1.ExecuteResponse, error) {
	res, err := s.exec.Execute(ctx, s.requestCall(ctx, req))
	if err != nil {
		return nil, err
	}
	resp := &mandatev1.ExecuteResponse{InvocationId: res.InvocationID, AuditId: res.AuditID, Replayed: res.Replayed}
	if req.GetResultAsJson() {
		resp.ResultJson = res.Output
		return resp, nil
	}
	resp.Result = &structpb.Struct{}
	if err := protojson.Unmarshal(res.Output, resp.Result); err != nil {
		return nil, failure.Internal(executor.StageDispatch, err)
	}
	return resp, nil
}

// Resolve records an operator's verdict on an unknown outcome
// (Executor.Resolve): the caller is the operator.
func (s *Service) Resolve(ctx context.Context, req *mandatev1.ResolveRequest) (*mandatev1.ResolveResponse, error) {
	p, _ := identity.FromContext(ctx)
	res, err := s.exec.Resolve(ctx, p, executor.Resolution{
		InvocationID: req.GetInvocationId(), Verdict: req.GetVerdict(), Reason: req.GetReason(), OverrideReceipt: req.GetOverrideReceipt(),
	})
	if err != nil {
		return nil, err
	}
	return &mandatev1.ResolveResponse{Record: res.Row, Receipt: res.Receipt, Key: res.Key}, nil
}

// Plan answers "what may I do now?" for the caller (Executor.Plan).
func (s *Service) Plan(ctx context.Context, _ *mandatev1.PlanRequest) (*mandatev1.PlanResponse, error) {
	p, _ := identity.FromContext(ctx)
	entries, err := s.exec.Plan(ctx, p)
	if err != nil {
		return nil, err
	}
	return &mandatev1.PlanResponse{Commands: entries}, nil
}

// ListDeadLetters lists the caller's tenant's dead-lettered audit rows
// (Executor.DeadLetters): the caller is the operator.
func (s *Service) ListDeadLetters(ctx context.Context, req *mandatev1.ListDeadLettersRequest) (*mandatev1.ListDeadLettersResponse, error) {
	p, _ := identity.FromContext(ctx)
	rows, err := s.exec.DeadLetters(ctx, p, int(req.GetLimit()))
	if err != nil {
		return nil, err
	}
	return &mandatev1.ListDeadLettersResponse{DeadLetters: rows}, nil
}

// RedriveDeadLetters puts dead-lettered rows back in the spool
// (Executor.Redrive): the caller is the operator.
func (s *Service) RedriveDeadLetters(ctx context.Context, req *mandatev1.RedriveDeadLettersRequest) (*mandatev1.RedriveDeadLettersResponse, error) {
	p, _ := identity.FromContext(ctx)
	n, err := s.exec.Redrive(ctx, p, req.GetIds(), req.GetAll(), req.GetReason())
	if err != nil {
		return nil, err
	}
	return &mandatev1.RedriveDeadLettersResponse{Redriven: int32(n)}, nil //nolint:gosec // G115: at most maxDeadLetters ids or the tenant's dead letter
}

// Check answers whether the call would pass, running nothing. A refusal
// is the verdict, not an error: the RPC fails only when no verdict could
// be reached.
func (s *Service) Check(ctx context.Context, req *mandatev1.ExecuteRequest) (*mandatev1.CheckResponse, error) {
	v, err := s.exec.Check(ctx, s.requestCall(ctx, req))
	if err != nil {
		return nil, err
	}
	resp := &mandatev1.CheckResponse{CheckId: v.CheckID, Verdict: v.Verdict, Limits: limitStates(v.Limits)}
	if v.Reason != nil {
		resp.Reason = v.Reason.Proto()
	}
	return resp, nil
}

// limitStates are a command's limits on the wire.
func limitStates(in []executor.LimitBalance) []*mandatev1.LimitState {
	if len(in) == 0 {
		return nil
	}
	out := make([]*mandatev1.LimitState, len(in))
	for i, b := range in {
		out[i] = &mandatev1.LimitState{Id: b.ID, Description: b.Description, Max: b.Max, Used: b.Used, Needs: b.Needs,
			Fits: b.Fits, Escalates: b.Escalates}
		if !b.Fits && b.RetryAfter > 0 {
			out[i].RetryAfter = durationpb.New(b.RetryAfter)
		}
	}
	return out
}

// requestCall is the call an ExecuteRequest makes, with what its metadata
// adds.
func (s *Service) requestCall(ctx context.Context, req *mandatev1.ExecuteRequest) executor.Call {
	input := []byte("{}")
	var inputErr *schema.InvalidError
	switch {
	case len(req.GetInputJson()) > 0 && req.GetInput() != nil:
		inputErr = &schema.InvalidError{Violations: []schema.Violation{{Rule: "schema.decode", Message: "set one of input and input_json"}}}
	case len(req.GetInputJson()) > 0:
		input = req.GetInputJson() // checked by the pipeline's strict decoder
	case req.GetInput() != nil:
		b, err := protojson.Marshal(req.GetInput())
		if err != nil {
			inputErr = &schema.InvalidError{Violations: []schema.Violation{{Rule: "schema.decode", Message: "input is not a JSON object"}}}
		}
		input = b
	}
	call := s.call(ctx, req.GetCode(), input, req)
	if inputErr != nil && call.InputError == nil {
		call.InputError = inputErr
	}
	if k := req.GetIdempotencyKey(); k != "" {
		call.IdempotencyKey = k
	}
	if g := req.GetApprovalGrantId(); g != "" {
		call.GrantID = g
	}
	if c := req.GetConversationId(); c != "" {
		call.ConversationID = c
	}
	return call
}

// call reads the channel and the optional metadata of a call, and what
// the MCP bridge relayed with it (req, nil for a command's own RPC).
func (s *Service) call(ctx context.Context, code string, input []byte, req *mandatev1.ExecuteRequest) executor.Call {
	first := func(k string) string {
		if v := metadata.ValueFromIncomingContext(ctx, k); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	call := executor.Call{
		Code: code, Input: input, Channel: "grpc",
		IdempotencyKey: first(MetadataIdempotencyKey),
		GrantID:        first(MetadataGrant),
		ConversationID: first(MetadataConversation),
		Tenant:         first(MetadataTenant),
		ManifestDigest: first(manifestcheck.Header),
	}
	p, _ := identity.FromContext(ctx)
	if p.Via == MCPBridgeService && !server.FromGateway(ctx) {
		// The bridge's own trace context parents the call; what the MCP
		// client sent in `_meta` the bridge checked (and relays if invalid).
		call.Channel = "mcp"
		relayed(&call, req.GetRelayed())
		return call
	}
	if server.FromGateway(ctx) {
		call.Channel = "rest"
		// A REST request the gateway could not read is refused at
		// schema_validate, after authorisation, and audited.
		call.InputError = server.GatewayInputError(ctx)
	}
	call.TraceParent, call.TraceState = first("traceparent"), first("tracestate")
	return call
}

// Bounds on what the bridge relays: a relayed call carries at most these
// many violations and invalid attributes (ExecuteRequest.relayed).
const (
	maxRelayedViolations = 64
	maxRelayedAttributes = 16
)

// relayed adds to call what the MCP bridge found before the executor saw
// it: the session, the violations that made the input unreadable
// (schema_validate refuses with them), and the attributes it could not read
// (request_check refuses naming them). Only calls the bridge relays come
// here; values are bounded and marked as from any caller.
func relayed(call *executor.Call, r *mandatev1.Relayed) {
	if r == nil {
		return
	}
	call.MCPSessionID = callattr.Safe(r.GetMcpSessionId(), 255)
	if vs := r.GetInputViolations(); len(vs) > 0 {
		out := make([]schema.Violation, 0, min(len(vs), maxRelayedViolations))
		for _, v := range vs[:min(len(vs), maxRelayedViolations)] {
			out = append(out, schema.Violation{Pointer: v.GetPointer(), Rule: v.GetRule(), Message: v.GetMessage()})
		}
		call.InputError = &schema.InvalidError{Violations: out}
	}
	for _, a := range r.GetInvalidAttributes()[:min(len(r.GetInvalidAttributes()), maxRelayedAttributes)] {
		inv := callattr.Invalid{Name: a.GetName(), Rule: a.GetRule(), Reason: a.GetReason(), Value: callattr.Safe(a.GetValue(), callattr.MaxMarked)}
		if inv.Name == "" {
			inv = callattr.Invalid{Name: "metadata", Rule: callattr.RuleFormat, Reason: "was relayed unreadably", Value: callattr.Mark(a.GetValue())}
		}
		call.Invalid = append(call.Invalid, inv)
	}
}

// ValidatesOwnRequests tells the server not to refuse an ExecuteRequest
// that breaks its field rules before the pipeline sees it: the executor
// checks those fields itself (request_check, idempotency_check), so that a
// malformed call is refused and audited like any other attempt.
func (s *Service) ValidatesOwnRequests() bool { return true }

// RefusesGatewayInput tells the server to pass REST calls whose path,
// query or body the gateway could not read to the pipeline, which refuses
// them and audits the attempt (server.GatewayInputError).
func (s *Service) RefusesGatewayInput() bool { return true }

// proxy serves a command's own RPC: decode the binary request, run the
// pipeline, encode the result.
func (s *Service) proxy(_ any, ss grpc.ServerStream) error {
	ctx := ss.Context()
	method, _ := grpc.MethodFromServerStream(ss)
	var in frame
	if err := ss.RecvMsg(&in); err != nil {
		return err
	}
	cmd, ok := s.manifest.ByMethod(method)
	if !ok {
		// Not a command: refused through the pipeline (so the attempt is
		// audited), never forwarded.
		_, err := s.exec.Execute(ctx, s.call(ctx, "", []byte("{}"), nil))
		return err
	}
	md, _ := s.manifest.Method(cmd.Code)
	req := dynamicpb.NewMessage(md.Input())
	call := s.call(ctx, cmd.Code, nil, nil)
	call.Proxy = true
	// AllowPartial only skips a required-field check that cannot fail.
	if err := schema.Unmarshal(proto.UnmarshalOptions{Resolver: s.manifest.Types(), AllowPartial: !schema.CanLackRequired(md.Input())}, in.payload, req); err != nil {
		call.InputError = &schema.InvalidError{Violations: []schema.Violation{{Rule: "schema.decode", Message: "the request is not a valid " + string(md.Input().FullName())}}}
	} else if ptr := unknownFields(req, ""); ptr != "" {
		call.InputError = &schema.InvalidError{Violations: []schema.Violation{{Pointer: ptr, Rule: "schema.unknown_field", Message: "the request carries fields this command does not declare"}}}
	} else {
		b, err := (protojson.MarshalOptions{UseProtoNames: true, AllowPartial: !schema.CanLackRequired(md.Input())}).Marshal(req)
		if err != nil {
			return failure.Internal(executor.StageSchema, err)
		}
		call.Input = b
	}
	res, err := s.exec.Execute(ctx, call)
	if err != nil {
		return err
	}
	out := res.Message
	switch {
	case out == nil && res.Wire != nil: // never decoded: the backend's bytes
		m := dynamicpb.NewMessage(md.Output())
		if err := schema.Unmarshal(proto.UnmarshalOptions{AllowPartial: !schema.CanLackRequired(md.Output())}, res.Wire, m); err != nil {
			return failure.Internal(executor.StageDispatch, err)
		}
		out = m
	case out == nil: // a replay: the saved JSON
		m := dynamicpb.NewMessage(md.Output())
		if err := (protojson.UnmarshalOptions{Resolver: s.manifest.Types()}).Unmarshal(res.Output, m); err != nil {
			return failure.Internal(executor.StageDispatch, err)
		}
		out = m
	}
	b, err := proto.MarshalOptions{Deterministic: true, AllowPartial: !schema.CanLackRequired(out.ProtoReflect().Descriptor())}.Marshal(out)
	if err != nil {
		return failure.Internal(executor.StageDispatch, err)
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs("x-mandate-invocation-id", res.InvocationID))
	return ss.SendMsg(&frame{payload: b})
}

// unknownFields returns the JSON pointer of the first message carrying
// fields the descriptor does not declare, or "".
func unknownFields(m protoreflect.Message, ptr string) string {
	if len(m.GetUnknown()) > 0 {
		if ptr == "" {
			return "/"
		}
		return ptr
	}
	found := ""
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := ptr + "/" + string(fd.Name())
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := range l.Len() {
				if found = unknownFields(l.Get(i).Message(), p+"/"+strconv.Itoa(i)); found != "" {
					return false
				}
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				found = unknownFields(mv.Message(), p+"/"+k.String())
				return found == ""
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			found = unknownFields(v.Message(), p)
		}
		return found == ""
	})
	return found
}

// frame is a raw gRPC message payload.
type frame struct{ payload []byte }

// rawCodec passes frames through untouched and everything else to the
// proto codec (the codec applies to every service of the server).
type rawCodec struct{ fallback encoding.CodecV2 }

func (rawCodec) Name() string { return "proto" }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		return mem.BufferSlice{mem.SliceBuffer(f.payload)}, nil
	}
	return c.fallback.Marshal(v)
}

func (c rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*frame); ok {
		f.payload = data.Materialize()
		return nil
	}
	return c.fallback.Unmarshal(data, v)
}

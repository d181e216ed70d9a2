package server

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"buf.build/go/protovalidate"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/schema"
)

// validator checks every request message against its buf.validate rules
// before a handler sees it, so handlers can trust their input's shape. It
// uses the process's one protovalidate validator (schema.Validator).
type validator struct{ v protovalidate.Validator }

func newValidator() (*validator, error) {
	v, err := schema.Validator()
	if err != nil {
		return nil, err
	}
	return &validator{v: v}, nil
}

func (v *validator) check(req any) error {
	msg, ok := req.(proto.Message)
	if !ok {
		return nil
	}
	err := v.v.Validate(msg)
	if err == nil {
		return nil
	}
	var verr *protovalidate.ValidationError
	if !errors.As(err, &verr) {
		return failure.Internal(failure.StageSchema, err)
	}
	e := failure.New(failure.StageSchema, failure.CodeSchemaInvalid, "the request breaks its schema")
	e.Remedy = "fix the fields listed in violations"
	for _, viol := range verr.Violations {
		var ptr strings.Builder
		for _, el := range viol.Proto.GetField().GetElements() {
			ptr.WriteString("/" + el.GetFieldName())
			if el.HasIndex() {
				ptr.WriteString("/" + strconv.FormatUint(el.GetIndex(), 10))
			}
			if el.HasStringKey() {
				ptr.WriteString("/" + el.GetStringKey())
			}
		}
		e.Violations = append(e.Violations, failure.Violation{Pointer: ptr.String(), Rule: viol.Proto.GetRuleId(), Message: viol.Proto.GetMessage()})
	}
	return e
}

// SelfValidating is implemented by a service whose handlers validate their
// requests themselves, so that a malformed request is refused (and audited)
// by the service rather than by the server: the executor's API is one.
type SelfValidating interface{ ValidatesOwnRequests() bool }

func (v *validator) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if sv, ok := info.Server.(SelfValidating); ok && sv.ValidatesOwnRequests() {
		return handler(ctx, req)
	}
	if err := v.check(req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (v *validator) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &validatingStream{ServerStream: ss, v: v})
}

type validatingStream struct {
	grpc.ServerStream
	v *validator
}

func (s *validatingStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.v.check(m)
}

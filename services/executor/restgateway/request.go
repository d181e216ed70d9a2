package restgateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// handler is what the generated RegisterXHandlerClient registers for one
// binding, step for step.
func (rt *route) handler(mux *runtime.ServeMux, cc grpc.ClientConnInterface) runtime.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request, pathParams map[string]string) {
		ctx, cancel := context.WithCancel(req.Context())
		defer cancel()
		inbound, outbound := runtime.MarshalerForRequest(mux, req)
		annotated, err := runtime.AnnotateContext(ctx, mux, req, rt.fullMethod, runtime.WithHTTPPathPattern(rt.template))
		if err != nil {
			runtime.HTTPError(ctx, mux, outbound, w, req, err)
			return
		}
		resp, md, err := rt.call(annotated, inbound, cc, req, pathParams)
		annotated = runtime.NewServerMetadataContext(annotated, md)
		if err != nil {
			runtime.HTTPError(annotated, mux, outbound, w, req, err)
			return
		}
		if rt.responseBody != nil {
			resp = responseField{Message: resp, path: rt.responseBody}
		}
		runtime.ForwardResponseMessage(annotated, mux, outbound, w, req, resp, mux.GetForwardResponseOptions()...)
	}
}

// call builds the request message from the body, the path and the query,
// in the generated code's order (so a path variable overrides the body),
// and calls the method.
func (rt *route) call(ctx context.Context, marshaler runtime.Marshaler, cc grpc.ClientConnInterface, req *http.Request, pathParams map[string]string) (proto.Message, runtime.ServerMetadata, error) {
	var md runtime.ServerMetadata
	msg := dynamicpb.NewMessage(rt.method.Input())
	if rt.body != nil {
		if err := rt.decodeBody(marshaler, req, msg); err != nil {
			return nil, md, err
		}
	}
	for _, p := range rt.params {
		val, ok := pathParams[p.name]
		if !ok {
			return nil, md, status.Errorf(codes.InvalidArgument, "missing parameter %s", p.name)
		}
		if err := setParam(msg, p, val); err != nil {
			return nil, md, status.Errorf(codes.InvalidArgument, "type mismatch, parameter: %s, error: %v", p.name, err)
		}
	}
	if rt.query != nil {
		if err := req.ParseForm(); err != nil {
			return nil, md, status.Errorf(codes.InvalidArgument, "%v", err)
		}
		if err := runtime.PopulateQueryParameters(msg, req.Form, rt.query); err != nil {
			return nil, md, status.Errorf(codes.InvalidArgument, "%v", err)
		}
	}
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
	}
	out := dynamicpb.NewMessage(rt.method.Output())
	err := cc.Invoke(ctx, rt.fullMethod, msg, out, grpc.Header(&md.HeaderMD), grpc.Trailer(&md.TrailerMD))
	return out, md, err
}

// decodeBody reads the body into msg (`body: "*"`) or into its body field.
func (rt *route) decodeBody(marshaler runtime.Marshaler, req *http.Request, msg *dynamicpb.Message) error {
	body := func() io.Reader { return req.Body }
	if rt.fieldMask != nil {
		newReader, err := utilities.IOReaderFactory(req.Body)
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "%v", err)
		}
		body = newReader
	}
	if len(rt.body) == 0 {
		if err := marshaler.NewDecoder(body()).Decode(msg); err != nil && !errors.Is(err, io.EOF) {
			return status.Errorf(codes.InvalidArgument, "%v", err)
		}
		return nil
	}
	parent := mutableParent(msg, rt.body)
	fd := rt.body[len(rt.body)-1]
	if fd.Message() != nil && !fd.IsList() && !fd.IsMap() {
		field := dynamicpb.NewMessage(fd.Message())
		err := marshaler.NewDecoder(body()).Decode(field)
		if err != nil && !errors.Is(err, io.EOF) {
			return status.Errorf(codes.InvalidArgument, "%v", err)
		}
		if err == nil {
			parent.Set(fd, protoreflect.ValueOfMessage(field))
		}
	} else {
		// A scalar, repeated or map field: its JSON value, decoded as
		// protojson decodes that field inside its message.
		var raw rawJSON
		err := marshaler.NewDecoder(body()).Decode(&raw)
		if err != nil && !errors.Is(err, io.EOF) {
			return status.Errorf(codes.InvalidArgument, "%v", err)
		}
		if err == nil && raw.b != nil {
			if err := setFromJSON(parent, fd, raw.b); err != nil {
				return status.Errorf(codes.InvalidArgument, "%v", err)
			}
		}
	}
	if rt.fieldMask != nil {
		mask := msg.Get(rt.fieldMask).Message()
		if !mask.IsValid() || mask.Get(mask.Descriptor().Fields().ByName("paths")).List().Len() == 0 {
			fm, err := runtime.FieldMaskFromRequestBody(body(), parent.Get(fd).Message().Interface())
			if err != nil {
				return status.Errorf(codes.InvalidArgument, "%v", err)
			}
			if err := setMessage(msg, rt.fieldMask, fm); err != nil {
				return status.Errorf(codes.InvalidArgument, "%v", err)
			}
		}
	}
	return nil
}

// rawJSON keeps a body value as it came: the gateway's decoder hands a
// struct that is not a proto message to encoding/json, which calls
// UnmarshalJSON.
type rawJSON struct{ b []byte }

// UnmarshalJSON implements json.Unmarshaler.
func (r *rawJSON) UnmarshalJSON(b []byte) error {
	r.b = append(r.b[:0], b...)
	return nil
}

// setFromJSON sets fd of parent from its JSON value, as protojson reads
// the member in the message.
func setFromJSON(parent protoreflect.Message, fd protoreflect.FieldDescriptor, raw []byte) error {
	name, err := json.Marshal(string(fd.Name()))
	if err != nil {
		return err
	}
	obj := bytes.Join([][]byte{[]byte("{"), name, []byte(":"), raw, []byte("}")}, nil)
	tmp := dynamicpb.NewMessage(parent.Descriptor())
	if err := protojson.Unmarshal(obj, tmp); err != nil {
		return err
	}
	if tmp.Has(fd) {
		parent.Set(fd, tmp.Get(fd))
	}
	return nil
}

// mutableParent returns the message holding the last field of path,
// creating the messages on the way.
func mutableParent(msg protoreflect.Message, path []protoreflect.FieldDescriptor) protoreflect.Message {
	for _, fd := range path[:len(path)-1] {
		msg = msg.Mutable(fd).Message()
	}
	return msg
}

// setMessage sets a message field of a dynamic message from a generated
// message of the same type, through the wire format: the descriptor set's
// type and the linked one are not the same Go type.
func setMessage(msg protoreflect.Message, fd protoreflect.FieldDescriptor, v proto.Message) error {
	b, err := proto.Marshal(v)
	if err != nil {
		return err
	}
	m := dynamicpb.NewMessage(fd.Message())
	if err := proto.Unmarshal(b, m); err != nil {
		return err
	}
	msg.Set(fd, protoreflect.ValueOfMessage(m))
	return nil
}

// responseField is a response whose `response_body` field alone is
// written, as the generated response_X wrapper does.
type responseField struct {
	proto.Message
	path []protoreflect.FieldDescriptor
}

// XXX_ResponseBody is the method runtime.ForwardResponseMessage looks for.
func (r responseField) XXX_ResponseBody() any { //nolint:revive // the name grpc-gateway's runtime looks up
	msg := r.ProtoReflect()
	for _, fd := range r.path[:len(r.path)-1] {
		msg = msg.Get(fd).Message()
	}
	fd := r.path[len(r.path)-1]
	if fd.Message() != nil && !fd.IsList() && !fd.IsMap() {
		return msg.Get(fd).Message().Interface()
	}
	// Anything else as protojson writes it inside its message.
	b, err := (protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}).Marshal(msg.Interface())
	if err != nil {
		return nil
	}
	var members map[string]json.RawMessage
	if json.Unmarshal(b, &members) != nil {
		return nil
	}
	return members[string(fd.Name())]
}

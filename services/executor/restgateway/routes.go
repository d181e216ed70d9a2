package restgateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/mandate-dev/mandate/internal/manifest"
)

// Routes are the REST routes of a manifest's commands.
type Routes struct {
	routes []*route
}

// route is one binding (the rule or one of its additional_bindings) of
// one command's method.
type route struct {
	verb       string // HTTP method
	template   string // the path template as declared, e.g. /v1/tickets/{ticket_id}:refund
	fullMethod string // /pkg.Service/Method
	method     protoreflect.MethodDescriptor
	// body is nil without a body, empty for `body: "*"`, else the field
	// path of the body field.
	body   []protoreflect.FieldDescriptor
	params []pathParam
	// query filters the fields bound elsewhere out of the query string; nil
	// when the route reads no query (as the generator decides:
	// hasQueryParam).
	query *utilities.DoubleArray
	// fieldMask is the request's only FieldMask field, filled from the
	// body's members when a PATCH sends none (the generator's
	// allow_patch_feature, on by default).
	fieldMask protoreflect.FieldDescriptor
	// responseBody is the field path of response_body, or nil.
	responseBody []protoreflect.FieldDescriptor
}

// pathParam is one `{field.path}` variable of a template.
type pathParam struct {
	name   string // the field path as written
	fields []protoreflect.FieldDescriptor
}

// New reads the google.api.http rule of every command's method in set. A
// rule the generated gateway would not accept either (a template that does
// not parse, a variable or body naming no field) fails New.
func New(set *manifest.Set) (*Routes, error) {
	var methods []protoreflect.MethodDescriptor
	for _, c := range set.Commands() {
		if md, ok := set.Method(c.Code); ok {
			methods = append(methods, md)
		}
	}
	return fromMethods(methods)
}

// fromMethods reads the rules of methods.
func fromMethods(methods []protoreflect.MethodDescriptor) (*Routes, error) {
	// The order the generated code registers in: file, service, method.
	// The mux tries the routes registered last first, so where two
	// templates match one path the same one wins.
	slices.SortFunc(methods, func(a, b protoreflect.MethodDescriptor) int {
		return cmp.Or(cmp.Compare(a.ParentFile().Path(), b.ParentFile().Path()),
			cmp.Compare(a.Parent().Index(), b.Parent().Index()), cmp.Compare(a.Index(), b.Index()))
	})
	methods = slices.CompactFunc(methods, func(a, b protoreflect.MethodDescriptor) bool { return a.FullName() == b.FullName() })
	r := &Routes{}
	for _, md := range methods {
		rule, err := httpRule(md)
		if err != nil {
			return nil, fmt.Errorf("restgateway: %s: %w", md.FullName(), err)
		}
		if rule == nil {
			continue
		}
		registerEnums(md.Input(), map[protoreflect.FullName]bool{})
		for _, b := range append([]*annotations.HttpRule{rule}, rule.GetAdditionalBindings()...) {
			rt, err := newRoute(md, b)
			if err != nil {
				return nil, fmt.Errorf("restgateway: %s: %w", md.FullName(), err)
			}
			r.routes = append(r.routes, rt)
		}
	}
	return r, nil
}

// Route names one served route.
type Route struct {
	// Method is the HTTP method, Path the template as declared.
	Method, Path string
	// FullMethod is the gRPC method the route calls.
	FullMethod string
}

// List returns the routes in the order they are registered.
func (r *Routes) List() []Route {
	out := make([]Route, 0, len(r.routes))
	for _, rt := range r.routes {
		out = append(out, Route{Method: rt.verb, Path: rt.template, FullMethod: rt.fullMethod})
	}
	return out
}

// Register serves the routes on mux, calling their methods over conn; its
// signature is the one the server's gateway registrars have.
func (r *Routes) Register(_ context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
	return r.RegisterClient(mux, conn)
}

// RegisterClient serves the routes on mux, calling their methods over cc.
func (r *Routes) RegisterClient(mux *runtime.ServeMux, cc grpc.ClientConnInterface) error {
	for _, rt := range r.routes {
		if err := mux.HandlePath(rt.verb, rt.template, rt.handler(mux, cc)); err != nil {
			return fmt.Errorf("restgateway: %s %s: %w", rt.verb, rt.template, err)
		}
	}
	return nil
}

// httpRule reads a method's google.api.http option. Options parsed before
// the annotations were linked keep the rule as unknown fields; they are
// parsed again with it known.
func httpRule(md protoreflect.MethodDescriptor) (*annotations.HttpRule, error) {
	opts, ok := md.Options().(*descriptorpb.MethodOptions)
	if !ok || opts == nil {
		return nil, nil
	}
	if !proto.HasExtension(opts, annotations.E_Http) && len(opts.ProtoReflect().GetUnknown()) > 0 {
		b, err := proto.Marshal(opts)
		if err != nil {
			return nil, err
		}
		fresh := new(descriptorpb.MethodOptions)
		if err := proto.Unmarshal(b, fresh); err != nil {
			return nil, err
		}
		opts = fresh
	}
	if !proto.HasExtension(opts, annotations.E_Http) {
		return nil, nil
	}
	rule, _ := proto.GetExtension(opts, annotations.E_Http).(*annotations.HttpRule)
	return rule, nil
}

func newRoute(md protoreflect.MethodDescriptor, rule *annotations.HttpRule) (*route, error) {
	if md.IsStreamingClient() || md.IsStreamingServer() {
		return nil, errors.New("a streaming method has no REST route here")
	}
	rt := &route{method: md, fullMethod: "/" + string(md.Parent().FullName()) + "/" + string(md.Name())}
	switch p := rule.GetPattern().(type) {
	case *annotations.HttpRule_Get:
		rt.verb, rt.template = http.MethodGet, p.Get
	case *annotations.HttpRule_Put:
		rt.verb, rt.template = http.MethodPut, p.Put
	case *annotations.HttpRule_Post:
		rt.verb, rt.template = http.MethodPost, p.Post
	case *annotations.HttpRule_Delete:
		rt.verb, rt.template = http.MethodDelete, p.Delete
	case *annotations.HttpRule_Patch:
		rt.verb, rt.template = http.MethodPatch, p.Patch
	case *annotations.HttpRule_Custom:
		rt.verb, rt.template = p.Custom.GetKind(), p.Custom.GetPath()
	}
	if rt.verb == "" || rt.template == "" {
		return nil, errors.New("google.api.http names no method and path")
	}
	// The template must parse as the generator parses it.
	if err := runtime.NewServeMux().HandlePath(rt.verb, rt.template, func(http.ResponseWriter, *http.Request, map[string]string) {}); err != nil {
		return nil, fmt.Errorf("path template %q: %w", rt.template, err)
	}
	in := md.Input()
	vars, err := templateVars(rt.template)
	if err != nil {
		return nil, err
	}
	for _, v := range vars {
		fields, err := fieldPath(in, v)
		if err != nil {
			return nil, fmt.Errorf("path variable %q: %w", v, err)
		}
		if err := checkParam(fields); err != nil {
			return nil, fmt.Errorf("path variable %q: %w", v, err)
		}
		rt.params = append(rt.params, pathParam{name: v, fields: fields})
	}
	switch body := rule.GetBody(); body {
	case "":
	case "*":
		rt.body = []protoreflect.FieldDescriptor{}
	default:
		if rt.body, err = fieldPath(in, body); err != nil {
			return nil, fmt.Errorf("body %q: %w", body, err)
		}
	}
	if rb := rule.GetResponseBody(); rb != "" {
		if rt.responseBody, err = fieldPath(md.Output(), rb); err != nil {
			return nil, fmt.Errorf("response_body %q: %w", rb, err)
		}
	}
	if rt.hasQueryParam() {
		var seqs [][]string
		if len(rt.body) > 0 {
			seqs = append(seqs, strings.Split(rule.GetBody(), "."))
		}
		for _, p := range rt.params {
			seqs = append(seqs, strings.Split(p.name, "."))
		}
		rt.query = utilities.NewDoubleArray(seqs)
	}
	if rt.verb == http.MethodPatch && len(rt.body) > 0 {
		rt.fieldMask = onlyFieldMask(in)
	}
	return rt, nil
}

// hasQueryParam is the generator's rule: a route reads the query string
// unless its body is the whole message or every top-level field is bound
// by name to the body or a path variable (a nested path variable leaves
// its top-level field to the query).
func (rt *route) hasQueryParam() bool {
	if rt.body != nil && len(rt.body) == 0 {
		return false
	}
	fields := map[string]bool{}
	in := rt.method.Input().Fields()
	for i := range in.Len() {
		fields[string(in.Get(i).Name())] = true
	}
	if len(rt.body) > 0 {
		delete(fields, pathString(rt.body))
	}
	for _, p := range rt.params {
		delete(fields, p.name)
	}
	return len(fields) > 0
}

func pathString(fields []protoreflect.FieldDescriptor) string {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = string(f.Name())
	}
	return strings.Join(names, ".")
}

// onlyFieldMask returns the request's FieldMask field if it has exactly
// one.
func onlyFieldMask(md protoreflect.MessageDescriptor) protoreflect.FieldDescriptor {
	var found protoreflect.FieldDescriptor
	fields := md.Fields()
	for i := range fields.Len() {
		if f := fields.Get(i); f.Message() != nil && f.Message().FullName() == "google.protobuf.FieldMask" {
			if found != nil {
				return nil
			}
			found = f
		}
	}
	return found
}

// templateVars returns the field paths of a template's variables, in
// order: `{a.b}` and `{a.b=segments/*}` both name a.b.
func templateVars(tmpl string) ([]string, error) {
	var vars []string
	for rest := tmpl; ; {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			return vars, nil
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return nil, fmt.Errorf("path template %q: unclosed variable", tmpl)
		}
		v, _, _ := strings.Cut(rest[i+1:i+j], "=")
		vars = append(vars, v)
		rest = rest[i+j+1:]
	}
}

// fieldPath resolves a dotted field path; every field but the last must
// be a singular message.
func fieldPath(md protoreflect.MessageDescriptor, path string) ([]protoreflect.FieldDescriptor, error) {
	var out []protoreflect.FieldDescriptor
	for i, name := range strings.Split(path, ".") {
		if md == nil {
			return nil, fmt.Errorf("%s is not a message", strings.Join(strings.Split(path, ".")[:i], "."))
		}
		fd := md.Fields().ByName(protoreflect.Name(name))
		if fd == nil {
			return nil, fmt.Errorf("no field %q in %s", name, md.FullName())
		}
		out = append(out, fd)
		md = nil
		if fd.Message() != nil && fd.Cardinality() != protoreflect.Repeated {
			md = fd.Message()
		}
	}
	return out, nil
}

// registerEnums registers, in protoregistry.GlobalTypes, every enum of the
// fields reachable from md that no linked package registered: the
// gateway's query parser (runtime.PopulateQueryParameters, and
// PopulateFieldFromPath for nested path variables) looks enums up there
// alone, where a generated gateway's own package has put them.
func registerEnums(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) {
	if seen[md.FullName()] {
		return
	}
	seen[md.FullName()] = true
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsMap() {
			fd = fd.MapValue()
		}
		if ed := fd.Enum(); ed != nil {
			if _, err := protoregistry.GlobalTypes.FindEnumByName(ed.FullName()); errors.Is(err, protoregistry.NotFound) {
				_ = protoregistry.GlobalTypes.RegisterEnum(dynamicpb.NewEnumType(ed))
			}
		}
		if m := fd.Message(); m != nil {
			registerEnums(m, seen)
		}
	}
}

package restgateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// testFile is a service whose routes use what the helpdesk sample does
// not: a nested path variable, a body field, PATCH with a field mask,
// DELETE with a query, enum, repeated and well-known path variables,
// response_body, a custom verb and an additional binding.
func testFile(t *testing.T) protoreflect.FileDescriptor {
	t.Helper()
	field := func(name string, num int32, typ descriptorpb.FieldDescriptorProto_Type, typeName string, repeated bool) *descriptorpb.FieldDescriptorProto {
		f := &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(num), Type: typ.Enum(),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), JsonName: proto.String(name)}
		if typeName != "" {
			f.TypeName = proto.String(typeName)
		}
		if repeated {
			f.Label = descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
		}
		return f
	}
	const (
		str = descriptorpb.FieldDescriptorProto_TYPE_STRING
		i64 = descriptorpb.FieldDescriptorProto_TYPE_INT64
		i32 = descriptorpb.FieldDescriptorProto_TYPE_INT32
		msg = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE
		enm = descriptorpb.FieldDescriptorProto_TYPE_ENUM
	)
	rpc := func(name, in, out string, rule *annotations.HttpRule) *descriptorpb.MethodDescriptorProto {
		opts := &descriptorpb.MethodOptions{}
		proto.SetExtension(opts, annotations.E_Http, rule)
		// As a descriptor set read without the annotations linked holds
		// it: unknown fields, parsed again by httpRule.
		b, err := proto.Marshal(opts)
		if err != nil {
			t.Fatal(err)
		}
		opts = &descriptorpb.MethodOptions{}
		if err := (proto.UnmarshalOptions{Resolver: new(protoregistry.Types)}).Unmarshal(b, opts); err != nil {
			t.Fatal(err)
		}
		return &descriptorpb.MethodDescriptorProto{Name: proto.String(name), InputType: proto.String(".test.v1." + in),
			OutputType: proto.String(".test.v1." + out), Options: opts}
	}
	fdp := &descriptorpb.FileDescriptorProto{
		Name: proto.String("test/v1/test.proto"), Package: proto.String("test.v1"), Syntax: proto.String("proto3"),
		Dependency: []string{"google/protobuf/field_mask.proto", "google/protobuf/timestamp.proto"},
		EnumType: []*descriptorpb.EnumDescriptorProto{{Name: proto.String("Kind"), Value: []*descriptorpb.EnumValueDescriptorProto{
			{Name: proto.String("KIND_UNSPECIFIED"), Number: proto.Int32(0)},
			{Name: proto.String("KIND_A"), Number: proto.Int32(1)},
			{Name: proto.String("KIND_B"), Number: proto.Int32(2)},
		}}},
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("Report"), Field: []*descriptorpb.FieldDescriptorProto{
				field("id", 1, str, "", false), field("title", 2, str, "", false), field("total", 3, i64, "", false),
				field("kind", 4, enm, ".test.v1.Kind", false),
			}},
			{Name: proto.String("UpdateReportRequest"), Field: []*descriptorpb.FieldDescriptorProto{
				field("report", 1, msg, ".test.v1.Report", false), field("update_mask", 2, msg, ".google.protobuf.FieldMask", false),
				field("note", 3, str, "", false),
			}},
			{Name: proto.String("GetRequest"), Field: []*descriptorpb.FieldDescriptorProto{
				field("id", 1, str, "", false), field("kind", 2, enm, ".test.v1.Kind", false), field("nums", 3, i64, "", true),
				field("at", 4, msg, ".google.protobuf.Timestamp", false), field("page", 5, i32, "", false),
			}},
			{Name: proto.String("TagsRequest"), Field: []*descriptorpb.FieldDescriptorProto{
				field("id", 1, str, "", false), field("tags", 2, str, "", true),
			}},
			{Name: proto.String("ListResponse"), Field: []*descriptorpb.FieldDescriptorProto{
				field("reports", 1, msg, ".test.v1.Report", true), field("next", 2, str, "", false),
			}},
		},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("Svc"), Method: []*descriptorpb.MethodDescriptorProto{
			rpc("Update", "UpdateReportRequest", "Report", &annotations.HttpRule{Pattern: &annotations.HttpRule_Patch{Patch: "/v1/reports/{report.id}"}, Body: "report"}),
			rpc("Get", "GetRequest", "Report", &annotations.HttpRule{Pattern: &annotations.HttpRule_Get{Get: "/v1/things/{id}/{kind}/{nums}/{at}"},
				AdditionalBindings: []*annotations.HttpRule{{Pattern: &annotations.HttpRule_Get{Get: "/v1/things/{id=shelves/*}"}}}}),
			rpc("Delete", "GetRequest", "Report", &annotations.HttpRule{Pattern: &annotations.HttpRule_Delete{Delete: "/v1/things/{id}"}}),
			rpc("SetTags", "TagsRequest", "ListResponse", &annotations.HttpRule{Pattern: &annotations.HttpRule_Post{Post: "/v1/things/{id}:tag"},
				Body: "tags", ResponseBody: "reports"}),
			rpc("Replace", "UpdateReportRequest", "Report", &annotations.HttpRule{Pattern: &annotations.HttpRule_Put{Put: "/v1/reports/{report.id}"}, Body: "*"}),
		}}},
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// recorder is a connection that records the request of each call and
// answers with a canned response.
type recorder struct {
	method  string
	request string
	reply   string
}

func (r *recorder) Invoke(_ context.Context, method string, args, reply any, _ ...grpc.CallOption) error {
	r.method = method
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(args.(proto.Message))
	if err != nil {
		return err
	}
	r.request = string(b)
	return protojson.Unmarshal([]byte(r.reply), reply.(proto.Message))
}

func (r *recorder) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	panic("no streams")
}

func TestBinding(t *testing.T) {
	fd := testFile(t)
	methods := fd.Services().Get(0).Methods()
	var mds []protoreflect.MethodDescriptor
	for i := range methods.Len() {
		mds = append(mds, methods.Get(i))
	}
	routes, err := fromMethods(mds)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(routes.List()); got != 6 {
		t.Fatalf("%d routes, want 6 (five rules, one additional binding): %+v", got, routes.List())
	}
	for _, tc := range []struct {
		name, method, path, body string
		wantMethod, wantRequest  string
		reply                    string
		wantStatus               int
		wantBody                 string
	}{
		{name: "nested path variable and a body field, PATCH fills the field mask from the body",
			method: "PATCH", path: "/v1/reports/R-1?note=hi", body: `{"title":"new","total":"7"}`,
			wantMethod: "/test.v1.Svc/Update", wantRequest: `{"report":{"id":"R-1","title":"new","total":"7"},"update_mask":"title,total","note":"hi"}`,
			reply: `{"id":"R-1"}`, wantStatus: 200, wantBody: `{"id":"R-1","title":"","total":"0","kind":"KIND_UNSPECIFIED"}`},
		{name: "PATCH with a field mask in the query keeps it",
			method: "PATCH", path: "/v1/reports/R-1?update_mask=title", body: `{"title":"new","total":"7"}`,
			wantMethod: "/test.v1.Svc/Update", wantRequest: `{"report":{"id":"R-1","title":"new","total":"7"},"update_mask":"title"}`,
			reply: `{}`, wantStatus: 200},
		{name: "whole body with a nested path variable overriding it",
			method: "PUT", path: "/v1/reports/R-2", body: `{"report":{"id":"R-9","title":"t"},"note":"n"}`,
			wantMethod: "/test.v1.Svc/Replace", wantRequest: `{"report":{"id":"R-2","title":"t"},"note":"n"}`, reply: `{}`, wantStatus: 200},
		{name: "enum by name, repeated, timestamp path variables and a query",
			method: "GET", path: "/v1/things/a/KIND_B/1,2,3/2026-01-05T09:00:00Z?page=4",
			wantMethod: "/test.v1.Svc/Get", wantRequest: `{"id":"a","kind":"KIND_B","nums":["1","2","3"],"at":"2026-01-05T09:00:00Z","page":4}`,
			reply: `{}`, wantStatus: 200},
		{name: "enum by number",
			method: "GET", path: "/v1/things/a/1/5/2026-01-05T09:00:00Z",
			wantMethod: "/test.v1.Svc/Get", wantRequest: `{"id":"a","kind":"KIND_A","nums":["5"],"at":"2026-01-05T09:00:00Z"}`, reply: `{}`, wantStatus: 200},
		{name: "additional binding with a segment pattern",
			method: "GET", path: "/v1/things/shelves/7",
			wantMethod: "/test.v1.Svc/Get", wantRequest: `{"id":"shelves/7"}`, reply: `{}`, wantStatus: 200},
		{name: "DELETE reads the remaining fields from the query",
			method: "DELETE", path: "/v1/things/x?kind=KIND_A&nums=1&nums=2&page=3",
			wantMethod: "/test.v1.Svc/Delete", wantRequest: `{"id":"x","kind":"KIND_A","nums":["1","2"],"page":3}`, reply: `{}`, wantStatus: 200},
		{name: "scalar body field and response_body",
			method: "POST", path: "/v1/things/x:tag", body: `["a","b"]`,
			wantMethod: "/test.v1.Svc/SetTags", wantRequest: `{"id":"x","tags":["a","b"]}`,
			reply: `{"reports":[{"id":"r"}],"next":"n"}`, wantStatus: 200,
			wantBody: `[{"id":"r","title":"","total":"0","kind":"KIND_UNSPECIFIED"}]`},
		{name: "path variable not of its field's type", method: "GET", path: "/v1/things/a/KIND_C/1/2026-01-05T09:00:00Z",
			wantStatus: 400, wantBody: `type mismatch, parameter: kind, error: KIND_C is not valid`},
		{name: "query value not of its field's type", method: "DELETE", path: "/v1/things/x?page=many", wantStatus: 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{reply: tc.reply}
			mux := runtime.NewServeMux(runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
				MarshalOptions: protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
			}))
			if err := routes.RegisterClient(mux, rec); err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, req)
			body, _ := io.ReadAll(w.Body)
			if w.Code != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.wantStatus, body)
			}
			if tc.wantMethod != "" && rec.method != tc.wantMethod {
				t.Fatalf("called %q, want %q", rec.method, tc.wantMethod)
			}
			if tc.wantRequest != "" && !jsonEqual(t, rec.request, tc.wantRequest) {
				t.Fatalf("request %s, want %s", rec.request, tc.wantRequest)
			}
			if tc.wantStatus != 200 && rec.method != "" {
				t.Fatalf("a refused request called %s", rec.method)
			}
			if tc.wantBody != "" {
				if tc.wantStatus == 200 && !jsonEqual(t, string(body), tc.wantBody) {
					t.Fatalf("body %s, want %s", body, tc.wantBody)
				}
				if tc.wantStatus != 200 && !strings.Contains(string(body), tc.wantBody) {
					t.Fatalf("body %s does not say %q", body, tc.wantBody)
				}
			}
		})
	}
}

// TestRoutesRefuseWhatTheGeneratorRefuses: a rule naming no field, or a
// message that is not a scalar well-known type as a path variable, fails
// New as it would fail protoc-gen-grpc-gateway.
func TestRoutesRefuseWhatTheGeneratorRefuses(t *testing.T) {
	fd := testFile(t)
	update := fd.Services().Get(0).Methods().ByName("Update")
	for _, tc := range []struct {
		name string
		rule *annotations.HttpRule
		want string
	}{
		{"unknown path field", &annotations.HttpRule{Pattern: &annotations.HttpRule_Get{Get: "/v1/x/{nope}"}}, `no field "nope"`},
		{"message path variable", &annotations.HttpRule{Pattern: &annotations.HttpRule_Get{Get: "/v1/x/{report}"}}, "cannot be a path variable"},
		{"unknown body field", &annotations.HttpRule{Pattern: &annotations.HttpRule_Post{Post: "/v1/x"}, Body: "nope"}, `body "nope"`},
		{"template that does not parse", &annotations.HttpRule{Pattern: &annotations.HttpRule_Get{Get: "v1/x"}}, "path template"},
		{"no pattern", &annotations.HttpRule{}, "names no method and path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newRoute(update, tc.rule)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("newRoute: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

func jsonEqual(t *testing.T, a, b string) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal([]byte(a), &x); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal([]byte(b), &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return string(xb) == string(yb)
}

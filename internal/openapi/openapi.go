// Package openapi builds the OpenAPI 3.1 document of Mandate's REST
// surface from compiled proto descriptors: every method with a
// google.api.http rule becomes an operation, every message a JSON Schema
// (draft 2020-12) under components. The document describes the wire as the
// gateway speaks it: proto field names (the gateway marshals with
// UseProtoNames), 64-bit integers as strings and enums by name (protojson),
// every unset message field present as null (EmitUnpopulated), errors as
// RFC 9457 application/problem+json bodies carrying the CommandError
// members, and bearer-token authentication.
//
// Build is a pure function of its input: the same descriptors give the
// same bytes (CI regenerates gen/ and diffs it).
package openapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Options describe the document as a whole.
type Options struct {
	// Title and Version fill the info object (defaults: "Mandate API", "v1").
	Title   string
	Version string
	// Description is the info object's description (Markdown).
	Description string
}

// Dialect is the JSON Schema dialect of the document's schemas.
const Dialect = "https://json-schema.org/draft/2020-12/schema"

// ProblemSchema is the component name of the problem+json body.
const ProblemSchema = "Problem"

// SchemaRef returns the JSON pointer, inside the document, of the
// component schema of the message or enum named full.
func SchemaRef(full string) string { return "#/components/schemas/" + full }

// Document is an OpenAPI 3.1 document. Field order is the order of the
// JSON output; maps marshal with sorted keys, so the output is
// deterministic.
type Document struct {
	OpenAPI           string                `json:"openapi"`
	Info              Info                  `json:"info"`
	JSONSchemaDialect string                `json:"jsonSchemaDialect"`
	Servers           []Server              `json:"servers"`
	Security          []map[string][]string `json:"security"`
	Tags              []Tag                 `json:"tags"`
	Paths             map[string]PathItem   `json:"paths"`
	Components        Components            `json:"components"`
}

// Info is the document's info object.
type Info struct {
	Title       string `json:"title"`
	Version     string `json:"version"`
	Summary     string `json:"summary,omitempty"`
	Description string `json:"description,omitempty"`
}

// Server is a server object.
type Server struct {
	URL         string `json:"url"`
	Description string `json:"description,omitempty"`
}

// Tag groups the operations of one gRPC service.
type Tag struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
}

// PathItem maps lower-case HTTP methods to operations.
type PathItem map[string]*Operation

// Operation is one REST route of one RPC.
type Operation struct {
	Tags        []string            `json:"tags"`
	Summary     string              `json:"summary"`
	Description string              `json:"description,omitempty"`
	OperationID string              `json:"operationId"`
	Deprecated  bool                `json:"deprecated,omitempty"`
	Parameters  []Parameter         `json:"parameters,omitempty"`
	RequestBody *RequestBody        `json:"requestBody,omitempty"`
	Responses   map[string]Response `json:"responses"`
	// Extensions carry what OpenAPI has no field for.
	GRPCMethod string `json:"x-grpc-method"`
	Streaming  bool   `json:"x-server-streaming,omitempty"`
}

// Parameter is a path, query or header parameter.
type Parameter struct {
	Name        string `json:"name"`
	In          string `json:"in"`
	Description string `json:"description,omitempty"`
	Required    bool   `json:"required,omitempty"`
	Schema      Schema `json:"schema"`
	Style       string `json:"style,omitempty"`
	Explode     *bool  `json:"explode,omitempty"`
}

// RequestBody is an operation's body.
type RequestBody struct {
	Description string               `json:"description,omitempty"`
	Required    bool                 `json:"required,omitempty"`
	Content     map[string]MediaType `json:"content"`
}

// Response is a response object, or a reference to one.
type Response struct {
	Ref         string               `json:"$ref,omitempty"`
	Description string               `json:"description,omitempty"`
	Headers     map[string]Header    `json:"headers,omitempty"`
	Content     map[string]MediaType `json:"content,omitempty"`
}

// Header is a response header.
type Header struct {
	Description string `json:"description,omitempty"`
	Schema      Schema `json:"schema"`
}

// MediaType is a media type object.
type MediaType struct {
	Schema Schema `json:"schema"`
}

// Components holds the reusable parts.
type Components struct {
	Schemas         map[string]Schema         `json:"schemas"`
	Responses       map[string]Response       `json:"responses"`
	SecuritySchemes map[string]SecurityScheme `json:"securitySchemes"`
}

// SecurityScheme is a security scheme object.
type SecurityScheme struct {
	Type         string `json:"type"`
	Scheme       string `json:"scheme,omitempty"`
	BearerFormat string `json:"bearerFormat,omitempty"`
	Description  string `json:"description,omitempty"`
}

// Schema is a JSON Schema (2020-12) object. Maps marshal with sorted keys.
type Schema = map[string]any

// Build returns the document of every service in files, as indented JSON
// ending in a newline.
func Build(files []protoreflect.FileDescriptor, opts Options) ([]byte, error) {
	doc, err := BuildDocument(files, opts)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("openapi: %w", err)
	}
	return buf.Bytes(), nil
}

// BuildDocument returns the document of every service in files.
func BuildDocument(files []protoreflect.FileDescriptor, opts Options) (*Document, error) {
	if opts.Title == "" {
		opts.Title = "Mandate API"
	}
	if opts.Version == "" {
		opts.Version = "v1"
	}
	b := &builder{schemas: map[string]Schema{}}
	doc := &Document{
		OpenAPI:           "3.1.0",
		Info:              Info{Title: opts.Title, Version: opts.Version, Description: opts.Description},
		JSONSchemaDialect: Dialect,
		Servers:           []Server{{URL: "/", Description: "the server that serves this document"}},
		Security:          []map[string][]string{{"bearer": {}}},
		Tags:              []Tag{},
		Paths:             map[string]PathItem{},
		Components: Components{
			Schemas:   b.schemas,
			Responses: problemResponses(),
			SecuritySchemes: map[string]SecurityScheme{"bearer": {
				Type: "http", Scheme: "bearer", BearerFormat: "JWT",
				Description: "A JWT naming the user (and, for an agent, the RFC 8693 `act` claim). `mandate dev` prints dev tokens; `mandate token` mints them.",
			}},
		},
	}
	b.schemas[ProblemSchema] = problemSchema()
	b.schemas[streamErrorSchema] = streamError()
	sorted := append([]protoreflect.FileDescriptor(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path() < sorted[j].Path() })
	for _, fd := range sorted {
		services := fd.Services()
		for i := range services.Len() {
			sd := services.Get(i)
			n, err := b.service(doc, sd, nil)
			if err != nil {
				return nil, err
			}
			if n > 0 {
				doc.Tags = append(doc.Tags, Tag{Name: string(sd.Name()), Description: comment(sd)})
			}
		}
	}
	sort.Slice(doc.Tags, func(i, j int) bool { return doc.Tags[i].Name < doc.Tags[j].Name })
	return doc, nil
}

type builder struct {
	schemas map[string]Schema
}

// service adds the operations of the methods of sd that include accepts
// (nil: every method) and returns how many it added.
func (b *builder) service(doc *Document, sd protoreflect.ServiceDescriptor, include func(protoreflect.MethodDescriptor) bool) (int, error) {
	n := 0
	methods := sd.Methods()
	for i := range methods.Len() {
		md := methods.Get(i)
		if include != nil && !include(md) {
			continue
		}
		rules := httpRules(md)
		for j, rule := range rules {
			method, tmpl := ruleMethod(rule)
			if method == "" {
				continue
			}
			if md.IsStreamingClient() {
				return n, fmt.Errorf("openapi: %s: client-streaming methods have no REST route", md.FullName())
			}
			op, path, err := b.operation(sd, md, rule, tmpl, j)
			if err != nil {
				return n, fmt.Errorf("openapi: %s: %w", md.FullName(), err)
			}
			item := doc.Paths[path]
			if item == nil {
				item = PathItem{}
				doc.Paths[path] = item
			}
			if _, dup := item[method]; dup {
				return n, fmt.Errorf("openapi: %s: %s %s is bound twice", md.FullName(), strings.ToUpper(method), path)
			}
			item[method] = op
			n++
		}
	}
	return n, nil
}

// httpRules returns a method's rule and its additional bindings.
func httpRules(md protoreflect.MethodDescriptor) []*annotations.HttpRule {
	opts := md.Options()
	if opts == nil || !proto.HasExtension(opts, annotations.E_Http) {
		return nil
	}
	rule, _ := proto.GetExtension(opts, annotations.E_Http).(*annotations.HttpRule)
	if rule == nil {
		return nil
	}
	rules := []*annotations.HttpRule{rule}
	return append(rules, rule.GetAdditionalBindings()...)
}

func ruleMethod(r *annotations.HttpRule) (method, tmpl string) {
	switch p := r.GetPattern().(type) {
	case *annotations.HttpRule_Get:
		return "get", p.Get
	case *annotations.HttpRule_Put:
		return "put", p.Put
	case *annotations.HttpRule_Post:
		return "post", p.Post
	case *annotations.HttpRule_Delete:
		return "delete", p.Delete
	case *annotations.HttpRule_Patch:
		return "patch", p.Patch
	case *annotations.HttpRule_Custom:
		return strings.ToLower(p.Custom.GetKind()), p.Custom.GetPath()
	}
	return "", ""
}

// pathVar is one `{field.path=pattern}` of a path template.
type pathVar struct {
	field string // proto field path, e.g. `ticket_id`
	param string // the OpenAPI parameter name
}

// parseTemplate turns a google.api.http path template into an OpenAPI path
// and its variables. `{name=projects/*}` becomes `{name}`; the pattern is
// not expressible in OpenAPI and is left to the server.
func parseTemplate(tmpl string) (string, []pathVar, error) {
	var out strings.Builder
	var vars []pathVar
	for rest := tmpl; rest != ""; {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			out.WriteString(rest)
			break
		}
		out.WriteString(rest[:i])
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return "", nil, fmt.Errorf("path template %q: unclosed variable", tmpl)
		}
		v := rest[i+1 : i+j]
		if k := strings.IndexByte(v, '='); k >= 0 {
			v = v[:k]
		}
		if v == "" {
			return "", nil, fmt.Errorf("path template %q: empty variable", tmpl)
		}
		vars = append(vars, pathVar{field: v, param: v})
		out.WriteString("{" + v + "}")
		rest = rest[i+j+1:]
	}
	return out.String(), vars, nil
}

func (b *builder) operation(sd protoreflect.ServiceDescriptor, md protoreflect.MethodDescriptor, rule *annotations.HttpRule, tmpl string, binding int) (*Operation, string, error) {
	path, vars, err := parseTemplate(tmpl)
	if err != nil {
		return nil, "", err
	}
	in := md.Input()
	desc := comment(md)
	op := &Operation{
		Tags:        []string{string(sd.Name())},
		Summary:     summary(desc, string(md.Name())),
		OperationID: string(sd.Name()) + "_" + string(md.Name()),
		GRPCMethod:  "/" + string(sd.FullName()) + "/" + string(md.Name()),
		Streaming:   md.IsStreamingServer(),
		Responses:   map[string]Response{},
	}
	if desc != op.Summary {
		op.Description = desc
	}
	if binding > 0 {
		op.OperationID += fmt.Sprintf("%d", binding+1)
	}
	if o, ok := md.Options().(interface{ GetDeprecated() bool }); ok && o.GetDeprecated() {
		op.Deprecated = true
	}
	bound := map[string]bool{}
	for _, v := range vars {
		fd, err := fieldByPath(in, v.field)
		if err != nil {
			return nil, "", err
		}
		bound[v.field] = true
		op.Parameters = append(op.Parameters, Parameter{Name: v.param, In: "path", Required: true, Description: comment(fd), Schema: b.param(fd)})
	}
	switch body := rule.GetBody(); body {
	case "":
		op.Parameters = append(op.Parameters, b.queryParams(in, "", bound, map[protoreflect.FullName]bool{})...)
	case "*":
		var s Schema
		if len(vars) == 0 {
			s = b.ref(in)
			b.message(in)
		} else {
			s = b.messageSchema(in, bound)
		}
		op.RequestBody = &RequestBody{
			Description: comment(in),
			Required:    hasRequired(s, b.schemas[string(in.FullName())]),
			Content:     map[string]MediaType{"application/json": {Schema: s}},
		}
	default:
		fd := in.Fields().ByName(protoreflect.Name(body))
		if fd == nil {
			return nil, "", fmt.Errorf("body field %q is not a field of %s", body, in.FullName())
		}
		bound[body] = true
		op.RequestBody = &RequestBody{
			Description: comment(fd),
			Content:     map[string]MediaType{"application/json": {Schema: b.field(fd)}},
		}
		op.Parameters = append(op.Parameters, b.queryParams(in, "", bound, map[protoreflect.FullName]bool{})...)
	}
	out := md.Output()
	var okSchema Schema
	if rb := rule.GetResponseBody(); rb != "" {
		fd := out.Fields().ByName(protoreflect.Name(rb))
		if fd == nil {
			return nil, "", fmt.Errorf("response_body field %q is not a field of %s", rb, out.FullName())
		}
		okSchema = b.field(fd)
	} else {
		okSchema = b.ref(out)
		b.message(out)
	}
	okDesc := firstLine(comment(out), "OK")
	if md.IsStreamingServer() {
		okDesc = "A stream of newline-delimited JSON objects, each `{\"result\": …}` with one " + string(out.Name()) +
			", or `{\"error\": …}` once if the stream fails after it started."
		okSchema = Schema{
			"type": "object",
			"properties": Schema{
				"result": okSchema,
				"error":  Schema{"$ref": SchemaRef(streamErrorSchema)},
			},
			"additionalProperties": false,
		}
	}
	op.Responses["200"] = Response{Description: okDesc, Content: map[string]MediaType{"application/json": {Schema: okSchema}}}
	for _, code := range problemStatuses {
		op.Responses[code.status] = Response{Ref: "#/components/responses/" + code.name}
	}
	op.Responses["default"] = Response{Ref: "#/components/responses/" + defaultProblem}
	return op, path, nil
}

func hasRequired(body, component Schema) bool {
	if r, ok := body["required"].([]string); ok && len(r) > 0 {
		return true
	}
	if _, isRef := body["$ref"]; isRef {
		r, ok := component["required"].([]string)
		return ok && len(r) > 0
	}
	return false
}

func fieldByPath(md protoreflect.MessageDescriptor, path string) (protoreflect.FieldDescriptor, error) {
	parts := strings.Split(path, ".")
	var fd protoreflect.FieldDescriptor
	for i, p := range parts {
		if md == nil {
			return nil, fmt.Errorf("path variable %q: %s is not a message", path, strings.Join(parts[:i], "."))
		}
		fd = md.Fields().ByName(protoreflect.Name(p))
		if fd == nil {
			return nil, fmt.Errorf("path variable %q: no field %q in %s", path, p, md.FullName())
		}
		md = fd.Message()
	}
	if fd.IsList() || fd.IsMap() || (fd.Message() != nil && !isScalarWKT(fd.Message().FullName())) {
		return nil, fmt.Errorf("path variable %q must be a scalar field", path)
	}
	return fd, nil
}

// queryParams lists the fields of md the gateway reads from the query
// string: scalars, enums, repeated scalars and the leaves of nested
// messages as dotted paths.
func (b *builder) queryParams(md protoreflect.MessageDescriptor, prefix string, bound map[string]bool, seen map[protoreflect.FullName]bool) []Parameter {
	var ps []Parameter
	if seen[md.FullName()] {
		return nil
	}
	seen[md.FullName()] = true
	defer delete(seen, md.FullName())
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		name := prefix + string(fd.Name())
		if bound[name] || fd.IsMap() {
			continue
		}
		if m := fd.Message(); m != nil && !isScalarWKT(m.FullName()) {
			if !fd.IsList() {
				ps = append(ps, b.queryParams(m, name+".", bound, seen)...)
			}
			continue
		}
		p := Parameter{Name: name, In: "query", Description: comment(fd), Schema: b.param(fd)}
		if fd.IsList() {
			t := true
			p.Style, p.Explode = "form", &t
		}
		ps = append(ps, p)
	}
	return ps
}

// param is the schema of a path or query parameter bound to fd.
func (b *builder) param(fd protoreflect.FieldDescriptor) Schema {
	s := b.singular(fd)
	if fd.IsList() {
		s = Schema{"type": "array", "items": s}
	}
	applyRules(s, fd)
	return s
}

// isScalarWKT reports whether a well-known message is a JSON scalar, so
// it can be a path or query parameter.
func isScalarWKT(n protoreflect.FullName) bool {
	switch n {
	case "google.protobuf.Timestamp", "google.protobuf.Duration", "google.protobuf.FieldMask",
		"google.protobuf.DoubleValue", "google.protobuf.FloatValue", "google.protobuf.Int64Value",
		"google.protobuf.UInt64Value", "google.protobuf.Int32Value", "google.protobuf.UInt32Value",
		"google.protobuf.BoolValue", "google.protobuf.StringValue", "google.protobuf.BytesValue":
		return true
	}
	return false
}

// comment is a descriptor's leading comment, trimmed, with its line
// breaks kept (descriptions are Markdown).
func comment(d protoreflect.Descriptor) string {
	loc := d.ParentFile().SourceLocations().ByDescriptor(d)
	lines := strings.Split(strings.TrimSpace(loc.LeadingComments), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return strings.TrimSpace(strings.Join(lines, "\n"))
}

// summary is the first sentence of a description, or fallback.
func summary(desc, fallback string) string {
	s := strings.Join(strings.Fields(desc), " ")
	if s == "" {
		return fallback
	}
	if i := strings.Index(s, ". "); i >= 0 {
		s = s[:i+1]
	}
	return s
}

func firstLine(desc, fallback string) string {
	return summary(desc, fallback)
}

package openapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"

	genopenapi "github.com/mandate-dev/mandate/gen/openapi"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// ExecutePath is the route of ExecutorService.Execute, CheckPath of
// ExecutorService.Check.
const (
	ExecutePath = "/v1/commands/{code}:execute"
	CheckPath   = "/v1/commands/{code}:check"
)

// Headers a caller may send with a command, over its own route or
// Execute (the executor reads them from the call's metadata).
var commandHeaders = []Parameter{
	{Name: "Idempotency-Key", In: "header", Schema: Schema{"type": "string", "maxLength": 255},
		Description: "Makes retries safe: the first response after dispatch is replayed for the same key, command and input; " +
			"the same key with another input is refused (`idempotency.key_reused`). Scoped to tenant, user and command."},
	{Name: "X-Mandate-Approval-Grant", In: "header", Schema: Schema{"type": "string", "maxLength": 128},
		Description: "The challenge id of a `confirmation.required` refusal, once a human approved it: the call is retried " +
			"with exactly the same input and the grant is redeemed once."},
	{Name: "X-Mandate-Conversation", In: "header", Schema: Schema{"type": "string", "maxLength": 255},
		Description: "The conversation the call comes from, recorded in the audit trail."},
}

// Deployment returns the OpenAPI document of what an executor serves for
// set, as indented JSON: the routes of the services named in services
// (ExecutorService, and under `mandate dev` the other services sharing
// its server) as the generated document describes them, every command's
// own google.api.http route read from the set's descriptors, and
// Execute's input and result typed as one of the commands' input and
// output messages. The caller headers of a command are declared on every
// command route and on Execute.
func Deployment(set *manifest.Set, services []string, opts Options) ([]byte, error) {
	var base Document
	if err := json.Unmarshal(genopenapi.Document, &base); err != nil {
		return nil, fmt.Errorf("openapi: the generated document: %w", err)
	}
	if opts.Title != "" {
		base.Info.Title = opts.Title
	}
	if opts.Version != "" {
		base.Info.Version = opts.Version
	}
	if opts.Description != "" {
		base.Info.Description = opts.Description
	}
	commands := map[string]*manifest.Command{}
	for _, c := range set.Commands() {
		commands[c.RPC.FullMethod] = c
	}
	served := map[string]bool{}
	for _, s := range services {
		served[s] = true
	}
	// The generated operations of the services on the server and of the
	// commands it was generated with (the sample's, when it is loaded).
	covered := map[string]bool{}
	for path, item := range base.Paths {
		for verb, op := range item {
			svc, _, _ := strings.Cut(strings.TrimPrefix(op.GRPCMethod, "/"), "/")
			if _, isCommand := commands[op.GRPCMethod]; !served[svc] && !isCommand {
				delete(item, verb)
				continue
			}
			covered[op.GRPCMethod] = true
		}
		if len(item) == 0 {
			delete(base.Paths, path)
		}
	}
	// The routes of the other commands, from the set's descriptors. They
	// carry no comments: a descriptor set holds no source info, so the
	// declaration's own words (display name, description) describe them.
	b := &builder{schemas: base.Components.Schemas}
	var files []protoreflect.FileDescriptor
	set.Files().RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		files = append(files, fd)
		return true
	})
	sort.Slice(files, func(i, j int) bool { return files[i].Path() < files[j].Path() })
	for _, fd := range files {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			if _, err := b.service(&base, sd, func(md protoreflect.MethodDescriptor) bool {
				full := fullMethod(md)
				_, ok := commands[full]
				return ok && !covered[full] && !served[string(sd.FullName())]
			}); err != nil {
				return nil, err
			}
		}
	}
	for _, item := range base.Paths {
		for _, op := range item {
			c, ok := commands[op.GRPCMethod]
			if !ok {
				continue
			}
			if !covered[op.GRPCMethod] {
				op.Summary = orElse(c.DisplayName, op.Summary)
				op.Description = c.Description
			}
			op.Parameters = withHeaders(op.Parameters)
		}
	}
	if err := typeExecute(&base, b, set); err != nil {
		return nil, err
	}
	base.Tags = tagsOf(&base)
	prune(&base)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(&base); err != nil {
		return nil, fmt.Errorf("openapi: %w", err)
	}
	return buf.Bytes(), nil
}

// typeExecute narrows Execute and Check to the set's commands: `code` to
// their codes, `input` to one of their input messages, Execute's `result`
// to one of their output messages, and declares the caller headers.
func typeExecute(doc *Document, b *builder, set *manifest.Set) error {
	var codes []string
	var inputs, outputs []Schema
	seenIn, seenOut := map[string]bool{}, map[string]bool{}
	for _, c := range set.Commands() {
		md, ok := set.Method(c.Code)
		if !ok || !c.Published() {
			continue
		}
		codes = append(codes, c.Code)
		b.message(md.Input())
		b.message(md.Output())
		if in := string(md.Input().FullName()); !seenIn[in] {
			seenIn[in] = true
			inputs = append(inputs, b.ref(md.Input()))
		}
		if out := string(md.Output().FullName()); !seenOut[out] {
			seenOut[out] = true
			outputs = append(outputs, b.ref(md.Output()))
		}
	}
	for _, path := range []string{ExecutePath, CheckPath} {
		item := doc.Paths[path]
		if item == nil || item["post"] == nil {
			continue
		}
		if err := typeCommandCall(item["post"], path, codes, inputs); err != nil {
			return err
		}
	}
	if doc.Paths[ExecutePath] == nil {
		return nil
	}
	resp, ok := b.schemas["mandate.v1.ExecuteResponse"]
	if !ok {
		return nil
	}
	resp = cloneSchema(resp)
	if rp, ok := resp["properties"].(map[string]any); ok {
		rp["result"] = oneOfCommands(rp["result"], outputs, "The command's result as a JSON object (proto field names, unset fields left out): the output message of the command named by `code`.")
	}
	b.schemas["mandate.v1.ExecuteResponse"] = resp
	return nil
}

// typeCommandCall types the request of a route that takes an
// ExecuteRequest: the caller headers, `code` one of codes, `input` one of
// inputs.
func typeCommandCall(op *Operation, path string, codes []string, inputs []Schema) error {
	op.Parameters = withHeaders(op.Parameters)
	for i, p := range op.Parameters {
		if p.In == "path" && p.Name == "code" && len(codes) > 0 {
			s := cloneSchema(p.Schema)
			s["enum"] = codes
			op.Parameters[i].Schema = s
		}
	}
	if op.RequestBody == nil {
		return fmt.Errorf("openapi: %s has no request body", path)
	}
	media := op.RequestBody.Content["application/json"]
	req := cloneSchema(media.Schema)
	props, ok := req["properties"].(map[string]any)
	if !ok {
		return fmt.Errorf("openapi: the request body of %s has no properties", path)
	}
	props["input"] = oneOfCommands(props["input"], inputs, "The command's input as a JSON object (proto field names): one of the input messages of the deployment's commands, that of the command named by `code`.")
	media.Schema = req
	op.RequestBody.Content["application/json"] = media
	return nil
}

// oneOfCommands is a member that holds one of the messages in refs, or
// null; with no commands, any object.
func oneOfCommands(old any, refs []Schema, desc string) Schema {
	if len(refs) == 0 {
		return Schema{"type": []string{"object", "null"}, "additionalProperties": true, "description": desc}
	}
	alts := append(slices.Clone(refs), Schema{"type": "null"})
	s := Schema{"anyOf": alts, "description": desc}
	if o, ok := old.(map[string]any); ok {
		if d, ok := o["description"].(string); ok && d != "" && desc == "" {
			s["description"] = d
		}
	}
	return s
}

// withHeaders adds the caller headers to params, once.
func withHeaders(params []Parameter) []Parameter {
	for _, h := range commandHeaders {
		if !slices.ContainsFunc(params, func(p Parameter) bool { return p.In == "header" && strings.EqualFold(p.Name, h.Name) }) {
			params = append(params, h)
		}
	}
	return params
}

// tagsOf lists the tags the operations use, keeping the descriptions of
// those the document had.
func tagsOf(doc *Document) []Tag {
	had := map[string]string{}
	for _, t := range doc.Tags {
		had[t.Name] = t.Description
	}
	used := map[string]bool{}
	for _, item := range doc.Paths {
		for _, op := range item {
			for _, t := range op.Tags {
				used[t] = true
			}
		}
	}
	tags := []Tag{}
	for name := range used {
		d, ok := had[name]
		if !ok || d == "" {
			d = "The commands of " + name + ", each run through the governed pipeline."
		}
		tags = append(tags, Tag{Name: name, Description: d})
	}
	sort.Slice(tags, func(i, j int) bool { return tags[i].Name < tags[j].Name })
	return tags
}

func fullMethod(md protoreflect.MethodDescriptor) string {
	return "/" + string(md.Parent().FullName()) + "/" + string(md.Name())
}

// cloneSchema copies the top level of s.
func cloneSchema(s Schema) Schema {
	out := make(Schema, len(s))
	for k, v := range s {
		if m, ok := v.(map[string]any); ok {
			mm := make(map[string]any, len(m))
			for mk, mv := range m {
				mm[mk] = mv
			}
			v = mm
		}
		out[k] = v
	}
	return out
}

func orElse(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// prune drops the component schemas no operation reaches: those of the
// services and commands the server does not serve.
func prune(doc *Document) {
	const prefix = "#/components/schemas/"
	reached := map[string]bool{}
	// Through JSON, so that typed members (Parameter, Response, []Schema…)
	// are walked as the maps and lists they marshal to.
	var schemas map[string]any
	raw, _ := json.Marshal(doc.Components.Schemas)
	_ = json.Unmarshal(raw, &schemas)
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if r, ok := x["$ref"].(string); ok && strings.HasPrefix(r, prefix) {
				name := strings.TrimPrefix(r, prefix)
				if !reached[name] {
					reached[name] = true
					walk(schemas[name])
				}
			}
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	var tree any
	raw, _ = json.Marshal(struct {
		Paths     map[string]PathItem `json:"paths"`
		Responses map[string]Response `json:"responses"`
	}{doc.Paths, doc.Components.Responses})
	_ = json.Unmarshal(raw, &tree)
	walk(tree)
	for name := range doc.Components.Schemas {
		if !reached[name] {
			delete(doc.Components.Schemas, name)
		}
	}
}

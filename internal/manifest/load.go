package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	genmanifest "github.com/mandate-dev/mandate/gen/manifest"
	"github.com/mandate-dev/mandate/internal/facts"
)

// ErrInvalid marks every Load failure.
var ErrInvalid = errors.New("invalid manifest")

// Set is a loaded, cross-checked manifest with its descriptors.
type Set struct {
	manifest *Manifest
	raw      []byte
	files    *protoregistry.Files
	types    *protoregistry.Types
	byCode   map[string]*Command
	byMethod map[string]*Command
	methods  map[string]protoreflect.MethodDescriptor
	// declarations are the commands' DeclarationDigest, by code.
	declarations map[string]string
}

// Embedded loads the manifest and descriptor set compiled into the binary
// (the helpdesk sample domain).
func Embedded() (*Set, error) {
	return Load(genmanifest.Manifest, genmanifest.DescriptorSet)
}

// LoadFiles loads a manifest and descriptor set from files.
func LoadFiles(manifestPath, descriptorsPath string) (*Set, error) {
	m, err := os.ReadFile(manifestPath) //nolint:gosec // operator-provided path
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	d, err := os.ReadFile(descriptorsPath) //nolint:gosec // operator-provided path
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return Load(m, d)
}

// Load parses manifest bytes and descriptor set bytes and checks that they
// belong together: digests match, and every command's RPC exists in the
// descriptors with the declared input and output types. It compiles each
// command's facts (Command.Facts) once, here.
func Load(manifestJSON, descriptorSet []byte) (*Set, error) {
	fail := func(format string, args ...any) (*Set, error) {
		return nil, fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(manifestJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return fail("decode: %v", err)
	}
	if m.Format != Format {
		return fail("format %q, want %q", m.Format, Format)
	}
	digest, err := verifyDigest(manifestJSON)
	if err != nil {
		return fail("%v", err)
	}
	if digest != m.Digest {
		return fail("digest %s does not match content (%s): the file was edited or truncated", m.Digest, digest)
	}
	if got := DigestOf(descriptorSet); got != m.DescriptorSetDigest {
		return fail("descriptor set digest %s does not match the manifest's %s: the pair comes from different builds", got, m.DescriptorSetDigest)
	}
	var fds descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(descriptorSet, &fds); err != nil {
		return fail("descriptor set: %v", err)
	}
	files, err := protodesc.NewFiles(&fds)
	if err != nil {
		return fail("descriptor set: %v", err)
	}
	s := &Set{
		manifest: &m,
		raw:      manifestJSON,
		files:    files,
		types:    typesOf(files),
		byCode:   map[string]*Command{},
		byMethod: map[string]*Command{},
		methods:  map[string]protoreflect.MethodDescriptor{},

		declarations: map[string]string{},
	}
	compiler := facts.NewCompiler()
	for _, c := range m.Commands {
		if c == nil || c.Code == "" {
			return fail("command without a code")
		}
		if _, dup := s.byCode[c.Code]; dup {
			return fail("duplicate command %s", c.Code)
		}
		md, err := s.lookupMethod(c)
		if err != nil {
			return fail("%s: %v", c.Code, err)
		}
		s.byCode[c.Code] = c
		s.byMethod[c.RPC.FullMethod] = c
		s.methods[c.Code] = md
		c.facts = compiler.Command(md, c.Deadline, c.InputSchema)
		if s.declarations[c.Code], err = declarationDigest(c); err != nil {
			return fail("%s: %v", c.Code, err)
		}
	}
	return s, nil
}

// DeclarationDigest is the digest of command code's declaration (64 hex
// characters; "" for a code the manifest does not have): everything that
// decides how a call of it is governed and what it may do — risk,
// confirmation, approver, permissions, conditions, side effects,
// separation of duties, sensitive fields, deadline, lifecycle, its RPC and
// its input schema — and not its prose (display name, description, agent
// and approver hints, examples) nor its output schema. An approval holds for one
// declaration: a redeploy that changes it voids the command's open grants.
func (s *Set) DeclarationDigest(code string) string { return s.declarations[code] }

// DeclarationDigestOf is the DeclarationDigest of a command declared
// outside a Set (a test's fixture); "" when it cannot be encoded.
func DeclarationDigestOf(c *Command) string {
	d, _ := declarationDigest(c)
	return d
}

// declarationDigest hashes c's governing fields, canonically encoded.
func declarationDigest(c *Command) (string, error) {
	d := *c
	d.DisplayName, d.Description, d.AgentHint, d.ApproverHint, d.Examples, d.OutputSchema = "", "", "", "", nil, nil
	b, err := Canonical(&d, false)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(append([]byte("mandate.declaration.v1\n"), b...))
	return hex.EncodeToString(sum[:]), nil
}

func (s *Set) lookupMethod(c *Command) (protoreflect.MethodDescriptor, error) {
	svc, method, ok := splitMethod(c.RPC.FullMethod)
	if !ok || svc != c.RPC.Service || method != c.RPC.Method {
		return nil, fmt.Errorf("malformed rpc binding %q", c.RPC.FullMethod)
	}
	d, err := s.files.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, fmt.Errorf("service %s is not in the descriptor set", svc)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("%s is not a service", svc)
	}
	md := sd.Methods().ByName(protoreflect.Name(method))
	if md == nil {
		return nil, fmt.Errorf("method %s is not in service %s", method, svc)
	}
	if string(md.Input().FullName()) != c.RPC.InputType || string(md.Output().FullName()) != c.RPC.OutputType {
		return nil, fmt.Errorf("rpc types %s → %s do not match the descriptors (%s → %s)",
			c.RPC.InputType, c.RPC.OutputType, md.Input().FullName(), md.Output().FullName())
	}
	return md, nil
}

// typesOf registers a dynamic type for every message, enum and extension,
// so protojson can resolve Any and extensions of the loaded files.
func typesOf(files *protoregistry.Files) *protoregistry.Types {
	t := new(protoregistry.Types)
	var addMessages func(ms protoreflect.MessageDescriptors)
	addMessages = func(ms protoreflect.MessageDescriptors) {
		for i := range ms.Len() {
			md := ms.Get(i)
			if !md.IsMapEntry() {
				_ = t.RegisterMessage(dynamicpb.NewMessageType(md))
			}
			addMessages(md.Messages())
			addEnums(t, md.Enums())
			addExtensions(t, md.Extensions())
		}
	}
	files.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		addMessages(fd.Messages())
		addEnums(t, fd.Enums())
		addExtensions(t, fd.Extensions())
		return true
	})
	return t
}

func addEnums(t *protoregistry.Types, es protoreflect.EnumDescriptors) {
	for i := range es.Len() {
		_ = t.RegisterEnum(dynamicpb.NewEnumType(es.Get(i)))
	}
}

func addExtensions(t *protoregistry.Types, xs protoreflect.ExtensionDescriptors) {
	for i := range xs.Len() {
		_ = t.RegisterExtension(dynamicpb.NewExtensionType(xs.Get(i)))
	}
}

// Manifest returns the parsed manifest. Callers must not modify it.
func (s *Set) Manifest() *Manifest { return s.manifest }

// Bytes returns the manifest exactly as loaded.
func (s *Set) Bytes() []byte { return s.raw }

// Digest returns the manifest digest.
func (s *Set) Digest() string { return s.manifest.Digest }

// Commands returns every command, sorted by code.
func (s *Set) Commands() []*Command {
	out := append([]*Command(nil), s.manifest.Commands...)
	sort.Slice(out, func(i, j int) bool { return out[i].Code < out[j].Code })
	return out
}

// ByCode returns the command with the given code.
func (s *Set) ByCode(code string) (*Command, bool) {
	c, ok := s.byCode[code]
	return c, ok
}

// ByMethod returns the command bound to a gRPC full method name
// ("/pkg.Service/Method").
func (s *Set) ByMethod(fullMethod string) (*Command, bool) {
	c, ok := s.byMethod[fullMethod]
	return c, ok
}

// Method returns the RPC descriptor of a command.
func (s *Set) Method(code string) (protoreflect.MethodDescriptor, bool) {
	md, ok := s.methods[code]
	return md, ok
}

// Files returns the descriptors of the set.
func (s *Set) Files() *protoregistry.Files { return s.files }

// Types returns dynamic types for every message, enum and extension of the
// set.
func (s *Set) Types() *protoregistry.Types { return s.types }

// sampleDigest is the digest of the embedded sample manifest.
var sampleDigest = sync.OnceValue(func() string {
	var m struct {
		Digest string `json:"digest"`
	}
	_ = json.Unmarshal(genmanifest.Manifest, &m)
	return m.Digest
})

// SampleDigest returns the digest of the embedded helpdesk sample
// manifest.
func SampleDigest() string { return sampleDigest() }

// IsSample reports whether s is the helpdesk sample manifest (embedded, or
// the same files loaded from disk): the sample's own extras (its REST
// routes, its schema) go only with it.
func (s *Set) IsSample() bool { return s.Digest() == sampleDigest() }

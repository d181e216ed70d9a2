package compile

import (
	"slices"

	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	// The catalog's file is linked in with the declaration options.
	_ "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// CatalogFile declares the catalog's own commands (ops.review), which
// every deployment's manifest holds: the catalog serves them whatever
// backends the deployment governs.
const CatalogFile = "mandate/v1/catalog.proto"

// WithCatalogCommands returns fds and targets with the catalog's own
// commands added, for a build whose input does not include them (an
// adopter's workspace imports mandate/v1/options.proto, not the catalog):
// CatalogFile and the imports fds lacks are taken from the descriptors
// linked into this binary, and CatalogFile joins the targets. A build that
// has CatalogFile keeps its own copy.
func WithCatalogCommands(fds *descriptorpb.FileDescriptorSet, targets []string) (*descriptorpb.FileDescriptorSet, []string, error) {
	have := map[string]bool{}
	for _, f := range fds.GetFile() {
		have[f.GetName()] = true
	}
	out := &descriptorpb.FileDescriptorSet{File: slices.Clone(fds.GetFile())}
	if !have[CatalogFile] {
		fd, err := protoregistry.GlobalFiles.FindFileByPath(CatalogFile)
		if err != nil {
			return nil, nil, err
		}
		var add func(fd protoreflect.FileDescriptor)
		add = func(fd protoreflect.FileDescriptor) {
			if have[fd.Path()] {
				return
			}
			have[fd.Path()] = true
			imports := fd.Imports()
			for i := range imports.Len() {
				add(imports.Get(i).FileDescriptor)
			}
			out.File = append(out.File, protodesc.ToFileDescriptorProto(fd)) // imports first, as Compile needs
		}
		add(fd)
	}
	if len(targets) > 0 && !slices.Contains(targets, CatalogFile) {
		targets = append(slices.Clone(targets), CatalogFile)
	}
	return out, targets, nil
}

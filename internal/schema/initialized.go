package schema

import (
	"sync"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// CanLackRequired reports whether a message of type md can fail
// proto.CheckInitialized: whether it or a message it can contain declares a
// required field (proto2 `required`, or an edition's LEGACY_REQUIRED), or
// accepts extensions (which may declare them). For any other type the check
// passes whatever the message holds, so AllowPartial changes nothing but
// its cost — which for a dynamic message is a walk over every field that
// allocates as it goes, on every marshal and unmarshal. Results are cached
// per descriptor.
func CanLackRequired(md protoreflect.MessageDescriptor) bool {
	if v, ok := lackRequired.Load(md); ok {
		return v.(bool) //nolint:forcetypeassert // only bools are stored
	}
	v := canLackRequired(md, map[protoreflect.FullName]bool{})
	lackRequired.Store(md, v)
	return v
}

// lackRequired caches CanLackRequired by descriptor (a descriptor's
// identity: two descriptors of one name from different sources are
// answered separately).
var lackRequired sync.Map

// canLackRequired walks md and the message types of its fields once each;
// seen breaks recursive types.
func canLackRequired(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	if md.RequiredNumbers().Len() > 0 || md.ExtensionRanges().Len() > 0 {
		return true
	}
	fields := md.Fields()
	for i := range fields.Len() {
		if m := fields.Get(i).Message(); m != nil && canLackRequired(m, seen) {
			return true
		}
	}
	return false
}

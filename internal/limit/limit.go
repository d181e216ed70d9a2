// Package limit is what the build and the executor share about a command's
// declared limits (mandate.v1.Limit): the field paths a limit reads, their
// values on a call, the window's bounds and the words a human reads. The
// build refuses a limit these rules refuse (MANDATE1023), so the executor
// meets only limits that resolve.
package limit

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// MaxWindow bounds a limit's window.
const MaxWindow = 31 * 24 * time.Hour

// PerName is the manifest's name of p, "" for an unspecified or unknown
// scope.
func PerName(p mandatev1.LimitScope) string {
	switch p {
	case mandatev1.LimitScope_LIMIT_SCOPE_AGENT:
		return manifest.LimitPerAgent
	case mandatev1.LimitScope_LIMIT_SCOPE_USER:
		return manifest.LimitPerUser
	case mandatev1.LimitScope_LIMIT_SCOPE_TENANT:
		return manifest.LimitPerTenant
	}
	return ""
}

// ExhaustedName is the manifest's name of w, "" for an unspecified or
// unknown policy.
func ExhaustedName(w mandatev1.LimitExhausted) string {
	switch w {
	case mandatev1.LimitExhausted_LIMIT_EXHAUSTED_REFUSE:
		return manifest.LimitExhaustRefuse
	case mandatev1.LimitExhausted_LIMIT_EXHAUSTED_ESCALATE:
		return manifest.LimitExhaustEscalate
	}
	return ""
}

// Window parses a manifest window ("86400s") and checks its bounds.
func Window(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("window %q is not a duration", s)
	}
	return d, CheckWindow(d)
}

// CheckWindow checks a window's bounds: positive, at most MaxWindow.
func CheckWindow(d time.Duration) error {
	if d <= 0 || d > MaxWindow {
		return fmt.Errorf("window %s is not within (0, %s]", d, MaxWindow)
	}
	return nil
}

// WindowString is the manifest's spelling of a declared window (protojson,
// e.g. "86400s").
func WindowString(d *durationpb.Duration) string {
	if d == nil {
		return ""
	}
	return strconv.FormatFloat(d.AsDuration().Seconds(), 'f', -1, 64) + "s"
}

// Path is a resolved dotted field path: singular message fields, then the
// field read.
type Path []protoreflect.FieldDescriptor

// ErrPath: a path that does not name a field a limit may read.
var ErrPath = errors.New("limit: field path")

// Resolve walks path (proto field names joined by '.') from md. Every step
// but the last must be a singular message field; the last must be a
// singular scalar: an integer for a sum (sum true), a string or an enum
// for a group.
func Resolve(md protoreflect.MessageDescriptor, path string, sum bool) (Path, error) {
	if path == "" {
		return nil, fmt.Errorf("%w: empty", ErrPath)
	}
	parts := strings.Split(path, ".")
	out := make(Path, 0, len(parts))
	for i, name := range parts {
		fd := md.Fields().ByName(protoreflect.Name(name))
		if fd == nil {
			return nil, fmt.Errorf("%w: %s has no field %q", ErrPath, md.FullName(), name)
		}
		if fd.IsList() || fd.IsMap() {
			return nil, fmt.Errorf("%w: %s is repeated", ErrPath, strings.Join(parts[:i+1], "."))
		}
		out = append(out, fd)
		if i < len(parts)-1 {
			if fd.Message() == nil {
				return nil, fmt.Errorf("%w: %s is not a message", ErrPath, strings.Join(parts[:i+1], "."))
			}
			md = fd.Message()
			continue
		}
		if sum && !integer(fd.Kind()) {
			return nil, fmt.Errorf("%w: %s is a %s, not an integer", ErrPath, path, fd.Kind())
		}
		if !sum && fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.EnumKind {
			return nil, fmt.Errorf("%w: %s is a %s, not a string or an enum", ErrPath, path, fd.Kind())
		}
	}
	return out, nil
}

func integer(k protoreflect.Kind) bool {
	switch k {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return true
	}
	return false
}

// value is the field p names in m, and false when a message on the way is
// not set (the field is then its zero value).
func (p Path) value(m protoreflect.Message) (protoreflect.Value, bool) {
	for _, fd := range p[:len(p)-1] {
		if !m.Has(fd) {
			return protoreflect.Value{}, false
		}
		m = m.Get(fd).Message()
	}
	return m.Get(p[len(p)-1]), true
}

// Amount is what a call with request m spends by p's integer field: its
// value, 0 when it is negative or absent, and at most max+1 (any value
// above the ceiling spends past it alike; a uint64 beyond int64 is not
// wrapped).
func (p Path) Amount(m protoreflect.Message, max int64) int64 {
	v, ok := p.value(m)
	if !ok {
		return 0
	}
	var n int64
	switch p[len(p)-1].Kind() {
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		u := v.Uint()
		if u > uint64(max) {
			return max + 1
		}
		n = int64(u)
	default:
		n = v.Int()
	}
	if n < 0 {
		return 0
	}
	return min(n, max+1)
}

// Group is the value of p's string or enum field in m (an enum by its
// value's name), "" when absent.
func (p Path) Group(m protoreflect.Message) string {
	v, ok := p.value(m)
	if !ok {
		return ""
	}
	fd := p[len(p)-1]
	if fd.Kind() == protoreflect.EnumKind {
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return string(ev.Name())
		}
		return strconv.Itoa(int(v.Enum()))
	}
	return v.String()
}

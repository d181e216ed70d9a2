package audit

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"slices"
	"time"
)

// Page sizes of [Filter.PageSize].
const (
	DefaultPageSize = 50
	MaxPageSize     = 1000
)

// Filter selects rows of one tenant. Zero fields do not filter; set fields are ANDed; the
// values of a list field are ORed.
type Filter struct {
	// Tenant is required. The service layer sets it to the caller's own tenant; stores never
	// return rows of another tenant whatever the other fields say.
	Tenant string
	// From (inclusive) and To (exclusive) bound the record Time.
	From, To time.Time
	// ActorKinds keeps rows whose ActorKind is one of these.
	ActorKinds []ActorKind
	// AgentID and Model keep rows of this agent / model.
	AgentID string
	Model   string
	// Risks keeps rows whose Risk is one of these.
	Risks []Risk
	// SideEffect keeps rows whose SideEffects contain it.
	SideEffect string
	// Command keeps rows of this command code.
	Command string
	// Outcomes keeps rows whose Outcome is one of these.
	Outcomes []Outcome
	// Stage keeps rows of this stage.
	Stage string
	// Approved keeps rows with (true) or without (false) an approval.
	Approved *bool
	// Approver keeps rows approved by this user.
	Approver string
	// ConversationID keeps rows of this conversation.
	ConversationID string
	// Phase keeps intent or outcome rows.
	Phase Phase
	// PageSize is the maximum number of rows per page: default 50, at most 1000 (larger
	// values are lowered to 1000).
	PageSize int
	// PageToken continues from a previous Page's NextPageToken. It is bound to the filter: a
	// token is refused (ErrInvalidPageToken) with any other field values except PageSize.
	PageToken string
}

// Page is one page of query results.
type Page struct {
	// Records are the matching rows, newest (highest Seq) first.
	Records []Stored
	// NextPageToken fetches the next (older) page; empty when there is none.
	NextPageToken string
}

// PreparedFilter is a normalized, validated filter with its page token decoded. Stores run
// queries from it.
type PreparedFilter struct {
	Filter
	// BeforeSeq restricts the page to rows with Seq < BeforeSeq; zero for the first page.
	BeforeSeq int64
	digest    [16]byte
}

// Prepare normalizes f (sorted, de-duplicated lists; times in UTC to the microsecond; page size
// defaulted and capped), validates it and decodes its page token.
func (f Filter) Prepare() (PreparedFilter, error) {
	f.ActorKinds = sortedSet(f.ActorKinds)
	f.Risks = sortedSet(f.Risks)
	f.Outcomes = sortedSet(f.Outcomes)
	if !f.From.IsZero() {
		f.From = normTime(f.From)
	}
	if !f.To.IsZero() {
		// To is exclusive: round up so that a row at the truncated instant is not excluded
		// by a bound that lies after it.
		to := f.To.UTC()
		if t := to.Truncate(time.Microsecond); !t.Equal(to) {
			to = t.Add(time.Microsecond)
		}
		f.To = to
	}
	if f.Approved != nil {
		v := *f.Approved
		f.Approved = &v
	}
	switch {
	case f.PageSize < 0:
		return PreparedFilter{}, invalid("page_size", "is negative")
	case f.PageSize == 0:
		f.PageSize = DefaultPageSize
	case f.PageSize > MaxPageSize:
		f.PageSize = MaxPageSize
	}
	if err := f.validate(); err != nil {
		return PreparedFilter{}, err
	}
	p := PreparedFilter{Filter: f, digest: f.digest()}
	if f.PageToken != "" {
		seq, err := p.decodeToken(f.PageToken)
		if err != nil {
			return PreparedFilter{}, err
		}
		p.BeforeSeq = seq
	}
	return p, nil
}

func sortedSet[T ~string](in []T) []T {
	if len(in) == 0 {
		return nil
	}
	out := slices.Clone(in)
	slices.Sort(out)
	return slices.Compact(out)
}

func (f *Filter) validate() error {
	if f.Tenant == "" {
		return invalid("tenant", "is required")
	}
	for _, s := range []struct{ field, v string }{
		{"tenant", f.Tenant}, {"agent_id", f.AgentID}, {"model", f.Model}, {"side_effect", f.SideEffect},
		{"command", f.Command}, {"stage", f.Stage}, {"approver", f.Approver}, {"conversation_id", f.ConversationID},
	} {
		if err := checkText(s.field, s.v, MaxFieldLen); err != nil {
			return err
		}
	}
	for _, k := range f.ActorKinds {
		if !k.Valid() {
			return invalid("actor_kinds", "holds "+quote(string(k))+"; want user, agent or service")
		}
	}
	for _, r := range f.Risks {
		if !r.Valid() {
			return invalid("risks", "holds "+quote(string(r))+"; want L0..L4")
		}
	}
	for _, o := range f.Outcomes {
		if !o.Valid() {
			return invalid("outcomes", "holds "+quote(string(o))+"; want pending, executed, refused, failed, unknown or replayed")
		}
	}
	if f.Phase != "" && !f.Phase.Valid() {
		return invalid("phase", "must be empty, intent or outcome")
	}
	if !f.From.IsZero() && !f.To.IsZero() && !f.From.Before(f.To) {
		return invalid("to", "must be after from")
	}
	return nil
}

func quote(s string) string {
	if len(s) > 32 {
		s = s[:32] + "…"
	}
	return `"` + s + `"`
}

// digest identifies the filter's selection (every field but PageSize and PageToken), so that
// a page token cannot be replayed with another filter.
func (f *Filter) digest() [16]byte {
	b := []byte("mandate.audit.filter.v1\x00")
	b = appendStr(b, f.Tenant)
	b = appendTime(b, f.From)
	b = appendTime(b, f.To)
	b = binary.BigEndian.AppendUint64(b, uint64(len(f.ActorKinds)))
	for _, k := range f.ActorKinds {
		b = appendStr(b, string(k))
	}
	b = appendStr(b, f.AgentID)
	b = appendStr(b, f.Model)
	b = binary.BigEndian.AppendUint64(b, uint64(len(f.Risks)))
	for _, r := range f.Risks {
		b = appendStr(b, string(r))
	}
	b = appendStr(b, f.SideEffect)
	b = appendStr(b, f.Command)
	b = binary.BigEndian.AppendUint64(b, uint64(len(f.Outcomes)))
	for _, o := range f.Outcomes {
		b = appendStr(b, string(o))
	}
	b = appendStr(b, f.Stage)
	switch {
	case f.Approved == nil:
		b = append(b, 0)
	case *f.Approved:
		b = append(b, 1)
	default:
		b = append(b, 2)
	}
	b = appendStr(b, f.Approver)
	b = appendStr(b, f.ConversationID)
	b = appendStr(b, string(f.Phase))
	sum := sha256.Sum256(b)
	var d [16]byte
	copy(d[:], sum[:])
	return d
}

const tokenVersion = 1

// NextPageToken returns the token of the page that follows a page whose last (oldest) row has
// Seq lastSeq.
func (p *PreparedFilter) NextPageToken(lastSeq int64) string {
	b := make([]byte, 0, 1+8+16)
	b = append(b, tokenVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(lastSeq))
	b = append(b, p.digest[:]...)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (p *PreparedFilter) decodeToken(tok string) (int64, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) != 1+8+16 || b[0] != tokenVersion {
		return 0, errToken("is malformed")
	}
	seq := int64(binary.BigEndian.Uint64(b[1:9]))
	if seq <= 1 {
		return 0, errToken("is malformed")
	}
	if [16]byte(b[9:]) != p.digest {
		return 0, errToken("was issued for a different filter")
	}
	return seq, nil
}

func errToken(reason string) error {
	return &pageTokenError{reason: reason}
}

type pageTokenError struct{ reason string }

func (e *pageTokenError) Error() string { return "audit: invalid page token: the token " + e.reason }

func (e *pageTokenError) Is(target error) bool {
	return target == ErrInvalidPageToken || target == ErrInvalid
}

// Match reports whether s is selected by the filter, ignoring paging. Stores that filter in Go
// (memory) use it; SQL stores must select exactly the same rows.
func (p *PreparedFilter) Match(s *Stored) bool {
	f := &p.Filter
	switch {
	case s.Tenant != f.Tenant:
		return false
	case !f.From.IsZero() && s.Time.Before(f.From):
		return false
	case !f.To.IsZero() && !s.Time.Before(f.To):
		return false
	case len(f.ActorKinds) > 0 && !slices.Contains(f.ActorKinds, s.ActorKind):
		return false
	case f.AgentID != "" && s.AgentID != f.AgentID:
		return false
	case f.Model != "" && s.Model != f.Model:
		return false
	case len(f.Risks) > 0 && !slices.Contains(f.Risks, s.Risk):
		return false
	case f.SideEffect != "" && !slices.Contains(s.SideEffects, f.SideEffect):
		return false
	case f.Command != "" && s.Command != f.Command:
		return false
	case len(f.Outcomes) > 0 && !slices.Contains(f.Outcomes, s.Outcome):
		return false
	case f.Stage != "" && s.Stage != f.Stage:
		return false
	case f.Approved != nil && *f.Approved != s.Approved():
		return false
	case f.Approver != "" && (s.Approval == nil || s.Approval.Approver != f.Approver):
		return false
	case f.ConversationID != "" && s.ConversationID != f.ConversationID:
		return false
	case f.Phase != "" && s.Phase != f.Phase:
		return false
	}
	return true
}

package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
)

// HashSize is the length of PrevHash and Hash.
const HashSize = sha256.Size

// genesis is the PrevHash of every tenant's first row.
var genesis = make([]byte, HashSize)

// GenesisHash returns the PrevHash of a tenant's first row: 32 zero bytes.
func GenesisHash() []byte { return bytes.Clone(genesis) }

// encodingVersion opens every canonical encoding, so that a future layout can never produce
// the same bytes as this one.
const encodingVersion = "mandate.audit.record.v1\x00"

// encodingVersion2 opens the encoding of a row whose approval records a trust ceiling: v1
// with the ceiling after the approval's time. Rows without one keep v1, so every hash of
// an earlier release still verifies.
const encodingVersion2 = "mandate.audit.record.v2\x00"

// ComputeHash returns SHA-256(prev || canonical encoding of r with seq). The encoding is
// length-prefixed and fixed-order, so two different records can never encode alike; r must be
// normalized ([Record.Normalize]) for the hash to match what a store computes.
func ComputeHash(prev []byte, seq int64, r *Record) []byte {
	// Every append hashes a row: the encoding is built in a pooled buffer, so that the only
	// allocation left is the returned hash.
	bp := encodeBufs.Get().(*[]byte)
	buf := append((*bp)[:0], prev...)
	buf = appendCanonical(buf, seq, r)
	sum := sha256.Sum256(buf)
	if cap(buf) <= maxPooledEncoding {
		*bp = buf
		encodeBufs.Put(bp)
	}
	return sum[:]
}

// encodeBufs holds buffers for ComputeHash's canonical encoding.
var encodeBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// maxPooledEncoding keeps a buffer grown by a row with large arguments out of the pool, so
// that the pool does not pin it.
const maxPooledEncoding = 16 << 10

// CanonicalEncoding returns the bytes that ComputeHash hashes after prev. It is exposed so that
// external verifiers can be checked against it.
func CanonicalEncoding(seq int64, r *Record) []byte { return appendCanonical(nil, seq, r) }

func appendStr(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return binary.BigEndian.AppendUint64(b, 1)
	}
	return binary.BigEndian.AppendUint64(b, 0)
}

// appendTime encodes presence and Unix microseconds (the precision stores keep).
func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return binary.BigEndian.AppendUint64(b, 0)
	}
	b = binary.BigEndian.AppendUint64(b, 1)
	return binary.BigEndian.AppendUint64(b, uint64(t.UnixMicro()))
}

func appendCanonical(b []byte, seq int64, r *Record) []byte {
	v2 := r.Approval != nil && r.Approval.TrustCeiling != ""
	if v2 {
		b = append(b, encodingVersion2...)
	} else {
		b = append(b, encodingVersion...)
	}
	b = appendStr(b, r.Tenant)
	b = binary.BigEndian.AppendUint64(b, uint64(seq))
	b = appendStr(b, r.InvocationID)
	b = appendStr(b, string(r.Phase))
	b = appendTime(b, r.Time)
	b = appendStr(b, string(r.Channel))
	b = appendStr(b, r.Command)
	b = appendStr(b, string(r.Risk))
	b = binary.BigEndian.AppendUint64(b, uint64(len(r.SideEffects)))
	for _, se := range r.SideEffects {
		b = appendStr(b, se)
	}
	b = appendBool(b, r.Idempotent)
	b = appendBool(b, r.Reversible)
	b = appendStr(b, r.Subject)
	b = appendStr(b, r.UserID)
	b = appendStr(b, string(r.ActorKind))
	b = appendStr(b, r.AgentID)
	b = appendStr(b, r.Model)
	b = appendStr(b, r.ModelVersion)
	b = appendStr(b, r.ConversationID)
	b = appendStr(b, r.MCPSessionID)
	if a := r.Approval; a != nil {
		b = appendBool(b, true)
		b = appendStr(b, a.ChallengeID)
		b = appendStr(b, a.Approver)
		b = appendStr(b, a.Channel)
		b = appendTime(b, a.DecidedAt)
		if v2 {
			b = appendStr(b, a.TrustCeiling)
		}
	} else {
		b = appendBool(b, false)
	}
	b = appendStr(b, string(r.Outcome))
	b = appendStr(b, r.Stage)
	b = appendStr(b, r.Code)
	b = appendStr(b, r.Message)
	b = binary.BigEndian.AppendUint64(b, uint64(len(r.Arguments)))
	b = append(b, r.Arguments...)
	b = appendStr(b, r.ArgumentsDigest)
	b = appendStr(b, r.ResultDigest)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Duration))
	b = appendStr(b, r.TraceID)
	b = appendStr(b, r.ManifestDigest)
	return b
}

// Head is a tenant's chain head as a store keeps it apart from the rows: the Seq and Hash of
// the last row. It lets Verify notice that the newest rows were deleted.
type Head struct {
	Seq  int64
	Hash []byte
}

// Problem names what is wrong with a chain.
type Problem string

// Problems that Verify reports.
const (
	// ProblemHashMismatch: the row's content does not hash to its Hash (the row was edited).
	ProblemHashMismatch Problem = "hash_mismatch"
	// ProblemPrevHashMismatch: the row's PrevHash is not the previous row's Hash (a row before
	// it was replaced, or its PrevHash edited).
	ProblemPrevHashMismatch Problem = "prev_hash_mismatch"
	// ProblemGap: a Seq is missing (a row was deleted) or out of order.
	ProblemGap Problem = "gap"
	// ProblemHeadMismatch: the head does not match the last row (the newest rows were deleted,
	// rows were added behind the store's back, or the head was edited).
	ProblemHeadMismatch Problem = "head_mismatch"
)

// Break is the first broken link of a chain.
type Break struct {
	// Seq is where the chain breaks: the edited row, or the first missing Seq.
	Seq int64
	// InvocationID and Phase name the row at Seq; empty when that row is missing.
	InvocationID string
	Phase        Phase
	// Problem says what is wrong.
	Problem Problem
	// Detail explains it for a human.
	Detail string
}

// Report is the result of walking a tenant's chain.
type Report struct {
	// Tenant is the tenant whose chain was walked.
	Tenant string
	// Rows is how many rows were checked before the walk ended.
	Rows int64
	// Head is the chain head the store holds (zero Seq when the tenant has no rows).
	Head Head
	// OK is true when every link and the head check out.
	OK bool
	// Break is the first broken link; nil when OK.
	Break *Break
}

// ErrChainBroken is returned (wrapped) by [Report.Err] for a chain that does not verify.
var ErrChainBroken = errors.New("audit: chain broken")

// Err returns nil for an intact chain and an error naming the break otherwise.
func (r Report) Err() error {
	if r.OK || r.Break == nil {
		return nil
	}
	b := r.Break
	return fmt.Errorf("%w: tenant %q seq %d (%s): %s", ErrChainBroken, r.Tenant, b.Seq, b.Problem, b.Detail)
}

// ChainVerifier checks a tenant's rows one by one, in Seq order, and then the head. Stores use
// it to implement Verify so that every implementation checks exactly the same things.
type ChainVerifier struct {
	tenant string
	next   int64
	prev   []byte
	last   *Stored
	rows   int64
	brk    *Break
}

// NewChainVerifier returns a verifier for tenant's chain.
func NewChainVerifier(tenant string) *ChainVerifier {
	return &ChainVerifier{tenant: tenant, next: 1, prev: genesis}
}

// NewChainVerifierAt returns a verifier for the part of tenant's chain that starts at seq, for
// a store that keeps only its newest rows: the row at seq must carry prev as its PrevHash. What
// came before seq cannot be checked; prev is taken on trust (a row's Hash covers its PrevHash,
// so prev cannot be edited without the row failing its own check).
func NewChainVerifierAt(tenant string, seq int64, prev []byte) *ChainVerifier {
	return &ChainVerifier{tenant: tenant, next: seq, prev: bytes.Clone(prev)}
}

// Add checks the next row. It returns false once a break has been found; later rows are not
// looked at.
func (v *ChainVerifier) Add(s *Stored) bool {
	if v.brk != nil {
		return false
	}
	switch {
	case s.Tenant != v.tenant:
		v.brk = &Break{Seq: s.Seq, InvocationID: s.InvocationID, Phase: s.Phase, Problem: ProblemHashMismatch,
			Detail: "the row belongs to another tenant"}
	case s.Seq > v.next:
		v.brk = &Break{Seq: v.next, Problem: ProblemGap,
			Detail: fmt.Sprintf("row %d is missing; the next row is %d (invocation %s, %s)", v.next, s.Seq, s.InvocationID, s.Phase)}
	case s.Seq < v.next:
		v.brk = &Break{Seq: s.Seq, InvocationID: s.InvocationID, Phase: s.Phase, Problem: ProblemGap,
			Detail: fmt.Sprintf("row %d appears after row %d", s.Seq, v.next-1)}
	case !bytes.Equal(s.PrevHash, v.prev):
		v.brk = &Break{Seq: s.Seq, InvocationID: s.InvocationID, Phase: s.Phase, Problem: ProblemPrevHashMismatch,
			Detail: fmt.Sprintf("prev_hash %s is not the hash of the previous row (%s)", short(s.PrevHash), short(v.prev))}
	default:
		if want := ComputeHash(s.PrevHash, s.Seq, &s.Record); !bytes.Equal(want, s.Hash) {
			v.brk = &Break{Seq: s.Seq, InvocationID: s.InvocationID, Phase: s.Phase, Problem: ProblemHashMismatch,
				Detail: fmt.Sprintf("the row's content hashes to %s, but its hash is %s: the row was modified", short(want), short(s.Hash))}
		}
	}
	if v.brk != nil {
		return false
	}
	v.rows++
	v.next = s.Seq + 1
	v.prev = s.Hash
	last := *s
	v.last = &last
	return true
}

// Finish checks the head against the last row and returns the report. hasHead is false when the
// store holds no head for the tenant.
func (v *ChainVerifier) Finish(head Head, hasHead bool) Report {
	rep := Report{Tenant: v.tenant, Rows: v.rows, Head: head}
	if v.brk == nil {
		lastSeq := v.next - 1
		switch {
		case !hasHead && lastSeq > 0:
			v.brk = &Break{Seq: lastSeq, InvocationID: v.last.InvocationID, Phase: v.last.Phase, Problem: ProblemHeadMismatch,
				Detail: "the tenant has rows but no chain head"}
		case !hasHead:
		case head.Seq > lastSeq:
			v.brk = &Break{Seq: lastSeq + 1, Problem: ProblemHeadMismatch,
				Detail: fmt.Sprintf("the head is at row %d but the last row is %d: rows %d..%d were deleted", head.Seq, lastSeq, lastSeq+1, head.Seq)}
		case head.Seq < lastSeq:
			v.brk = &Break{Seq: head.Seq + 1, Problem: ProblemHeadMismatch,
				Detail: fmt.Sprintf("the head is at row %d but rows continue to %d: rows were added behind the store's back", head.Seq, lastSeq)}
		case !bytes.Equal(head.Hash, v.prev):
			v.brk = &Break{Seq: lastSeq, InvocationID: v.last.InvocationID, Phase: v.last.Phase, Problem: ProblemHeadMismatch,
				Detail: fmt.Sprintf("the head hash %s is not the last row's hash %s", short(head.Hash), short(v.prev))}
		}
	}
	rep.Break = v.brk
	rep.OK = v.brk == nil
	return rep
}

func short(b []byte) string {
	s := hex.EncodeToString(b)
	if len(s) > 16 {
		return s[:16] + "…"
	}
	return s
}

package executor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// Store keeps the executor's own state: idempotency records, the history of
// executed commands that separation of duties is checked against, and the
// outbox of domain events. Implementations: memory (embedded default and
// tests) and postgres, held to one conformance suite.
type Store interface {
	// Reserve claims an idempotency key for the call r describes. It
	// returns:
	//   - (nil, nil) when the key is new (or its record expired): the caller
	//     owns it and must Finish or Release it;
	//   - (saved, nil) when a call with this key and digest already finished:
	//     replay saved;
	//   - ErrInFlight when a call with this key is still running;
	//   - an *AbandonedError when a call with this key was reserved and its
	//     lease ran out without an outcome (its executor died): only its
	//     backend's receipt can say whether it ran (see Reclaim, Settle);
	//   - ErrKeyReused when the key was used with a different digest.
	// Records expire r.TTL after they were reserved.
	Reserve(ctx context.Context, key IdemKey, r Reservation) (*Saved, error)
	// Peek answers what Reserve would for a call with this key and digest,
	// and claims nothing (a check, Executor.Check): (nil, nil) when the key
	// is free, the saved response, ErrInFlight, an *AbandonedError or
	// ErrKeyReused.
	Peek(ctx context.Context, key IdemKey, digest string) (*Saved, error)
	// Reclaim hands the key to the call r describes, atomically, when its
	// record still belongs to invocation previous and that call provably
	// never ran (its backend fenced it): the record is abandoned in flight
	// or finished with an outcome that was unknown. What previous spent of
	// its command's limits (noted on the record by Spend or
	// ReserveSpending with the key) is given back in the same step. It
	// reports whether it did; false means another caller got there first.
	Reclaim(ctx context.Context, key IdemKey, previous string, r Reservation) (bool, error)
	// Settle replaces the saved response of the key's record, when the
	// record belongs to invocation, with what that invocation's receipt
	// says it returned, and marks it finished.
	Settle(ctx context.Context, key IdemKey, saved Saved) error
	// Resolve applies an operator's verdict to the idempotency record of
	// tenant's invocation, whatever its key and state: with saved nil (the
	// call never ran) the record is dropped, so a retry runs, and what the
	// call spent of its limits is given back; otherwise it
	// is finished with saved, which retries replay. It reports whether the
	// invocation held a key.
	Resolve(ctx context.Context, tenant, invocationID string, saved *Saved) (bool, error)
	// Renew extends the lease of the key's claim to lease from now, when
	// the claim is still in flight and belongs to invocation; it reports
	// whether it did (false: the call finished, gave the key back, or a
	// retry took it over after the lease lapsed).
	Renew(ctx context.Context, key IdemKey, invocation string, lease time.Duration) (bool, error)
	// Release drops a reservation whose call was refused before dispatch, so
	// nothing is saved for it.
	Release(ctx context.Context, key IdemKey) error
	// Finish records, atomically, what a dispatched call produced: the
	// response to replay for its idempotency key (if any), the execution
	// (on success, for separation of duties) and the domain event (on
	// success).
	Finish(ctx context.Context, f Finish) error
	// Executed reports whether user executed any of commands on subject in
	// tenant.
	Executed(ctx context.Context, tenant, user string, commands []string, subject string) (bool, error)
	// Events returns up to limit events of tenant after seq, oldest first.
	// Purged events are gone: the page starts at the oldest kept event after
	// afterSeq.
	Events(ctx context.Context, tenant string, afterSeq int64, limit int) ([]Event, error)

	// Backlog returns the tenants whose outbox holds events the relay has not
	// delivered, each with its cursor (the last delivered seq) and its head
	// (the last committed seq), in tenant order.
	Backlog(ctx context.Context) ([]Cursor, error)
	// MarkDelivered records that tenant's events up to and including seq
	// were delivered. The cursor never moves back: a lower seq (a slower
	// replica's report) changes nothing.
	MarkDelivered(ctx context.Context, tenant string, seq int64) error
	// Purge bounds the tables: it deletes the idempotency records and the
	// parked calls expired at p.Now, the limit spends lapsed, and the
	// events committed at or before p.Now-p.KeepEvents that were
	// delivered (or, with p.Undelivered, also those that were not).
	Purge(ctx context.Context, p PurgePolicy) (Purged, error)
	// Spool keeps an audit row in the executor's outbox of audit rows, to
	// be appended to the trail by the relay (FlushSpool; see Spooled,
	// Unspool): every intent and the outcome of a dispatched call, written
	// before dispatch and after the reply, and any row the trail would not
	// take when it was sent there directly.
	Spool(ctx context.Context, row SpooledRow) error
	// Spooled returns up to limit spooled rows, oldest first.
	Spooled(ctx context.Context, limit int) ([]SpooledRow, error)
	// Unspool drops spooled rows once the trail holds them. It need not
	// survive a crash of the store's server: a row that comes back is
	// appended again, and the trail stores it once.
	Unspool(ctx context.Context, ids []int64) error
	// Spooling returns those of tenant's invocations that still have a
	// row in the spool (the trail does not hold it yet), in no particular
	// order: the reconciler never takes an intent whose outcome is still
	// on its way for a lost one.
	Spooling(ctx context.Context, tenant string, invocationIDs []string) ([]string, error)
	// Bury keeps a row the trail refuses outright in the dead letter, in
	// one transaction with unspooling it (row.SpoolID; 0 for a row that
	// was never spooled): a row is never dropped.
	Bury(ctx context.Context, row DeadLetter) error
	// DeadLetters returns up to limit of tenant's dead-lettered rows,
	// oldest first.
	DeadLetters(ctx context.Context, tenant string, limit int) ([]DeadLetter, error)
	// Redrive moves tenant's dead-lettered rows ids (nil: all of them)
	// back to the spool, in one transaction, and says how many it moved;
	// ids of another tenant or unknown are ignored.
	Redrive(ctx context.Context, tenant string, ids []int64) (int, error)
	// Spend counts one call's use of its command's declared limits
	// (budget_check), all or none, serialised per bucket across every
	// executor sharing the store: for each item it sums what was spent in
	// the bucket within the item's window and says whether Amount still
	// fits under Max. When every item fits — or s.Force — each is recorded,
	// timed by the store's clock, and its balance says until when it counts
	// (Balance.Lapses, the call's receipt for Refund); when one does not,
	// none is. With s.Key, what is recorded is also noted on the key's
	// idempotency record, so that Reclaim gives it back when the key's call
	// provably never ran. s.DryRun records nothing (check mode). The
	// balances are in the order of s.Items.
	//
	// A bucket keeps one row (Postgres) or entry (memory) whatever the
	// number of calls: its spends are summed per lapse instant, and a
	// spend counts for its window rounded up to the next 1/64 of the window
	// (SpendGrain) — at most that much longer, never shorter.
	Spend(ctx context.Context, s Spending) ([]Balance, error)
	// Refund gives back what a call spent (its receipt: what Spend
	// recorded and until when) in tenant: the call provably did not run. A
	// spend that has lapsed since is not counted any more, and is ignored;
	// an empty receipt is no error. Each receipt is refunded at most once
	// by the executor; the store never takes a bucket below zero.
	Refund(ctx context.Context, tenant string, receipt []Spent) error
	// Park keeps what the arguments' stages decided for a call refused
	// with confirmation.required, under (p.Tenant, p.ChallengeID), for the
	// approved call to resume from (Parked): it replaces a record under
	// the same pair. It is kept until p.Expires, at most MaxParkedFor
	// after now; a record whose bytes exceed MaxParkedBytes is refused
	// (ErrParkedTooLarge), and so is one without tenant, challenge,
	// command or expiry in the future.
	Park(ctx context.Context, p Parked) error
	// Parked returns tenant's record for challenge, or nil (no error)
	// when there is none or it expired. The record is a copy.
	Parked(ctx context.Context, tenant, challenge string) (*Parked, error)
	// Unpark drops tenant's record for challenge, if any.
	Unpark(ctx context.Context, tenant, challenge string) error
}

// Parked is what the argument stages (schema_validate) decided for a call
// that confirmation_check refused with confirmation.required, kept for its
// approved call to resume from (docs/architecture/confirmation.md, "An
// approved call resumes"). It is bound to the challenge, and restored only
// for a call of the same command and declaration whose input is the same
// bytes.
type Parked struct {
	Tenant      string
	ChallengeID string
	// Command and DeclarationDigest are the command's code and the digest
	// of its declaration when the call was parked.
	Command           string
	DeclarationDigest string
	// InputDigest fingerprints the input exactly as received (Call.Input).
	InputDigest string
	// Canonical is the request's canonical wire bytes.
	Canonical []byte
	// Arguments is the redacted JSON of the arguments, Withheld the
	// sensitive paths that held a value, ArgumentsDigest the digest of
	// Canonical.
	Arguments       string
	Withheld        []string
	ArgumentsDigest string
	// InvocationDigest binds the challenge to the parked call (its
	// principal and idempotency key): a call whose own digest differs is
	// not resumed.
	InvocationDigest string
	// Expires is when the record stops counting: the challenge's expiry.
	Expires time.Time
}

// Size is what a parked record weighs against MaxParkedBytes.
func (p *Parked) Size() int {
	n := len(p.Canonical) + len(p.Arguments)
	for _, w := range p.Withheld {
		n += len(w)
	}
	return n
}

// ValidParked checks p as every Store does before Park, at now.
func ValidParked(p Parked, now time.Time) error {
	switch {
	case p.Tenant == "" || p.ChallengeID == "" || p.Command == "":
		return fmt.Errorf("%w: a tenant, a challenge and a command are required", ErrParkedInvalid)
	case !p.Expires.After(now):
		return fmt.Errorf("%w: it expires at %s, not after now", ErrParkedInvalid, p.Expires)
	case p.Size() > MaxParkedBytes:
		return fmt.Errorf("%w: %d bytes", ErrParkedTooLarge, p.Size())
	}
	return nil
}

// ParkedUntil is when a record parked at now to expire at expires stops
// counting: expires, at most MaxParkedFor after now.
func ParkedUntil(expires, now time.Time) time.Time {
	if limit := now.Add(MaxParkedFor); expires.After(limit) {
		return limit
	}
	return expires
}

// Bounds of a parked record.
const (
	// MaxParkedBytes bounds a parked record's canonical bytes and
	// arguments together: the decoder's default bound of an input.
	MaxParkedBytes = 1 << 20
	// MaxParkedFor bounds how long a record is kept, whatever its
	// challenge's expiry.
	MaxParkedFor = 24 * time.Hour
)

// Parking errors.
var (
	// ErrParkedTooLarge: the record exceeds MaxParkedBytes; the approved
	// call runs in full.
	ErrParkedTooLarge = errors.New("executor: parked call too large")
	// ErrParkedInvalid: a record the store refuses.
	ErrParkedInvalid = errors.New("executor: invalid parked call")
)

// ReserveSpender is a Store that can claim an idempotency key and count a
// spending in one transaction, so that a keyed call of a command that
// declares limits pays one commit for both. The executor uses it where the
// store offers it, and Reserve then Spend otherwise.
type ReserveSpender interface {
	// ReserveSpending answers as Reserve does. When it claims the key —
	// Reserve's (nil, nil) — it also decides s as Spend does, in the same
	// transaction, and returns the balances (recorded when every item fits
	// or s.Force, and noted on the key's record). Otherwise, and when the claim was won without the
	// spending (a later round), the balances are nil and nothing was spent.
	ReserveSpending(ctx context.Context, key IdemKey, r Reservation, s Spending) (*Saved, []Balance, error)
}

// BatchSpooler is a Store that spools several audit rows in one
// transaction and says where each went, so that the executor commits the
// rows of concurrent calls together (group commit) and relays them
// without reading them back. The executor uses it where the store offers
// it, and Spool one row at a time otherwise.
type BatchSpooler interface {
	// SpoolRows spools rows, all or none, in their order, and returns
	// their ids (as Spooled reports them), in the same order. With lazy,
	// the store may answer before the rows would survive a crash of its
	// own server (Postgres: synchronous_commit off): for rows whose loss
	// the reconciler makes good (an outcome: its intent is then settled
	// from the backend's receipt), never for an intent.
	SpoolRows(ctx context.Context, rows []SpooledRow, lazy bool) ([]int64, error)
}

// Spending is one call's use of declared limits (Store.Spend).
type Spending struct {
	Tenant string
	// Key is the call's idempotency key, when it has one: what the call
	// spends is noted on the key's record (Store.Reclaim gives it back).
	Key   *IdemKey
	Items []SpendItem
	// Force records every item even past its ceiling: a human approved
	// the call that a limit escalated.
	Force bool
	// DryRun reads the balances and records nothing.
	DryRun bool
}

// SpendItem is the use of one limit's bucket.
type SpendItem struct {
	// Bucket names what is counted together within the tenant: the
	// command, the limit and whose (and which group's) calls.
	Bucket string
	// Amount is what the call spends (1 for a rate); at least 0.
	Amount int64
	// Max is the ceiling; Window how long a spend counts.
	Max    int64
	Window time.Duration
}

// Balance is a bucket's state as Store.Spend found it.
type Balance struct {
	// Used is what the bucket held within the window, before this call.
	Used int64
	// Fits reports whether Used plus the item's Amount is at most Max.
	Fits bool
	// RetryAfter, when the item does not fit, is how long until enough of
	// the window's spends lapse for it to fit; 0 when it never can (its
	// Amount alone is over Max).
	RetryAfter time.Duration
	// Lapses, when the item's amount was recorded (a positive amount, not
	// a dry run, and everything fitted or the spending was forced), is
	// when it stops counting: the receipt's instant (Spent).
	Lapses time.Time
}

// Spent is what one call recorded in one bucket, for Store.Refund: the
// bucket, the amount and the instant it lapses (Balance.Lapses).
type Spent struct {
	Bucket string
	Amount int64
	Lapses time.Time
}

// ReceiptOf is what a spending recorded, from its balances: the items with
// a positive amount whose balance has Lapses.
func ReceiptOf(s Spending, bal []Balance) []Spent {
	var out []Spent
	for i, it := range s.Items {
		if i < len(bal) && !bal[i].Lapses.IsZero() && it.Amount > 0 {
			out = append(out, Spent{Bucket: it.Bucket, Amount: it.Amount, Lapses: bal[i].Lapses})
		}
	}
	return out
}

// SpendGrain is the granularity of a window: a spend counts until the
// first multiple of it (since the Unix epoch) at or after its time plus
// the window, so that one bucket holds at most about 65 lapse instants per
// window however many calls spend in it. A 64th of the window, at least a
// microsecond (the stores' precision).
func SpendGrain(window time.Duration) time.Duration {
	g := (window + 63) / 64
	if r := g % time.Microsecond; r != 0 {
		g += time.Microsecond - r
	}
	return max(g, time.Microsecond)
}

// SpendLapses is when a spend made at now with window stops counting:
// now + window, rounded up to SpendGrain(window).
func SpendLapses(now time.Time, window time.Duration) time.Time {
	g := SpendGrain(window).Microseconds()
	us := now.Add(window).UnixMicro()
	if now.Add(window).Nanosecond()%1000 != 0 {
		us++
	}
	if r := us % g; r != 0 {
		us += g - r
	}
	return time.UnixMicro(us)
}

// ErrSpendInvalid: a Spending the store refuses (no tenant, an
// item without a bucket, a bucket named twice, a negative amount, a
// ceiling or window that is not positive).
var ErrSpendInvalid = errors.New("executor: invalid spending")

// ValidSpending checks s as every Store does before Spend.
func ValidSpending(s Spending) error {
	if s.Tenant == "" {
		return fmt.Errorf("%w: a tenant is required", ErrSpendInvalid)
	}
	seen := make(map[string]bool, len(s.Items))
	for i, it := range s.Items {
		if it.Bucket == "" || it.Amount < 0 || it.Max <= 0 || it.Window <= 0 {
			return fmt.Errorf("%w: item %d (bucket %q, amount %d, max %d, window %s)", ErrSpendInvalid, i, it.Bucket, it.Amount, it.Max, it.Window)
		}
		if seen[it.Bucket] {
			return fmt.Errorf("%w: item %d names bucket %q again", ErrSpendInvalid, i, it.Bucket)
		}
		seen[it.Bucket] = true
	}
	return nil
}

// RetryAfterOf is Balance.RetryAfter for an item that does not fit:
// spends are a bucket's spends within the window, each
// with the time it lapses; it returns how long after now enough of them
// have lapsed for amount to fit under max, and 0 when amount alone is
// over max. Every Store computes it the same way.
func RetryAfterOf(spends []Lapse, amount, max int64, now time.Time) time.Duration {
	if amount > max {
		return 0
	}
	var used int64
	for _, s := range spends {
		used += s.Amount
	}
	sorted := slices.Clone(spends)
	slices.SortFunc(sorted, func(a, b Lapse) int { return a.At.Compare(b.At) })
	for _, s := range sorted {
		if used+amount <= max {
			break
		}
		used -= s.Amount
		if used+amount <= max {
			if d := s.At.Sub(now); d > 0 {
				return d
			}
			return time.Millisecond
		}
	}
	return time.Millisecond
}

// Lapse is one spend in a bucket: what it spent and when it stops counting.
type Lapse struct {
	Amount int64
	At     time.Time
}

// DeadLetter is an audit row the trail refused outright, kept until an
// operator re-drives it.
type DeadLetter struct {
	// ID is assigned by Bury, increasing.
	ID int64
	// SpoolID is the spooled row it replaces (Bury only; 0: none).
	SpoolID int64
	// Tenant and InvocationID say whose row it is.
	Tenant       string
	InvocationID string
	// Record is the audit record as spooled.
	Record []byte
	// Spooled is when it was first spooled (or held); Dead when it was
	// buried.
	Spooled, Dead time.Time
	// Reason is the trail's last refusal.
	Reason string
}

// Cursor is a tenant's delivery state.
type Cursor struct {
	Tenant string
	// Delivered is the seq of the last event delivered (0: none).
	Delivered int64
	// Head is the seq of the last event committed.
	Head int64
}

// PurgePolicy says what Store.Purge deletes.
type PurgePolicy struct {
	// Now is the time expiry and age are measured at.
	Now time.Time
	// KeepEvents is how long events are kept after their commit, so that
	// Store.Events can still answer for recent history.
	KeepEvents time.Duration
	// Undelivered also deletes old events that were never delivered: for a
	// deployment without a relay, whose outbox nobody drains.
	Undelivered bool
}

// Purged counts what Store.Purge deleted.
type Purged struct {
	Events          int64
	IdempotencyKeys int64
	// Spends are limit spends whose window had passed.
	Spends int64
	// Parked are parked calls that had expired.
	Parked int64
}

// Store errors.
var (
	// ErrInFlight: a call with the same idempotency key is still running.
	ErrInFlight = errors.New("executor: idempotency key in flight")
	// ErrKeyReused: the idempotency key was used with a different input.
	ErrKeyReused = errors.New("executor: idempotency key reused with different input")
	// ErrUnavailable: the store could not be reached.
	ErrUnavailable = errors.New("executor: store unavailable")
)

// Reservation is a call claiming an idempotency key.
type Reservation struct {
	// Digest is the call's input digest: the same key with another
	// digest is refused.
	Digest string
	// InvocationID is the call's invocation, recorded with the claim.
	InvocationID string
	// TTL is how long the record is remembered.
	TTL time.Duration
	// Lease bounds how long the claim stays in flight without an outcome
	// (the call's deadline and a margin); past it the claim is abandoned.
	// Zero: no lease (in flight until TTL).
	Lease time.Duration
}

// AbandonedError is Reserve's answer for a key whose call was reserved and
// never finished within its lease.
type AbandonedError struct {
	// InvocationID is the abandoned call's invocation.
	InvocationID string
}

func (e *AbandonedError) Error() string {
	return "executor: idempotency key abandoned in flight by " + e.InvocationID
}

// IdemKey scopes an idempotency key: Stripe semantics, per tenant, user and
// command.
type IdemKey struct {
	Tenant  string
	User    string
	Command string
	Key     string
}

// Saved is a finished call's response, replayed for a repeated key.
type Saved struct {
	// InvocationID of the call that produced it.
	InvocationID string
	// Output is the result as JSON (success).
	Output []byte
	// Status is the serialized google.rpc.Status of a failure (nil on
	// success).
	Status []byte
	// AuditID is the intent row's "<tenant>/<seq>" in responses saved by
	// earlier releases; empty since the intent is relayed to the trail
	// after the call (find the rows by InvocationID).
	AuditID string
}

// Execution is one successful command run, for separation of duties.
type Execution struct {
	Tenant       string
	User         string
	Command      string
	Subject      string
	InvocationID string
	Time         time.Time
}

// Event is a domain event published after a successful command.
type Event struct {
	// Seq is assigned by the store, per tenant, increasing.
	Seq          int64
	Tenant       string
	Command      string
	Subject      string
	InvocationID string
	UserID       string
	AgentID      string
	// Result is the command's output as JSON (sensitive fields withheld).
	Result []byte
	Time   time.Time
}

// Finish is what Store.Finish records in one transaction.
type Finish struct {
	// Key and Saved complete an idempotency reservation (Key nil: none).
	Key   *IdemKey
	Saved Saved
	// Execution is recorded for successful calls with a subject.
	Execution *Execution
	// Event is published for successful calls.
	Event *Event
}

// SpooledRow is an audit row waiting in the executor's spool.
type SpooledRow struct {
	// ID is assigned by Spool, increasing.
	ID int64
	// Tenant and InvocationID say whose row it is.
	Tenant       string
	InvocationID string
	// Record is the audit record, in the spool's encoding (spoolcodec.go:
	// the protobuf binary encoding of mandatev1.AuditRecord).
	Record []byte
	// Time is when it was spooled.
	Time time.Time

	// rec is the record Record encodes, kept by the executor that spooled
	// it for its relay (relayOwn), which then sends it without decoding
	// Record again; nil in rows read from the store.
	rec *mandatev1.AuditRecord
}

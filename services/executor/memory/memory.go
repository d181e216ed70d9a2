package memory

import (
	"bytes"
	"context"
	"errors"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/mandate-dev/mandate/services/executor"
)

// Options tunes a Store. Zero fields take the documented defaults.
type Options struct {
	// Now is the clock that reservations and their expiry, and limit spends and their lapse, are
	// measured with. Default time.Now.
	Now func() time.Time
	// MaxEvents caps one Events page; a limit <= 0 or above it means MaxEvents. Default 1000.
	MaxEvents int
}

func (o Options) withDefaults() Options {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxEvents <= 0 {
		o.MaxEvents = 1000
	}
	return o
}

// Store is an in-memory executor.Store, safe for concurrent use.
type Store struct {
	opts Options

	mu     sync.Mutex
	idem   map[executor.IdemKey]*record
	runs   map[runKey]struct{} // for Executed; a set, so a repeated Finish adds nothing
	events map[string]*outbox  // by tenant
	spool  []executor.SpooledRow
	spoolN int64
	dead   []executor.DeadLetter
	deadN  int64
	spends map[string]map[string][]executor.Lapse // limit spends by tenant and bucket, summed per lapse instant, by lapse
	parked map[parkKey]executor.Parked

	relay sync.Mutex // the relay lease (relaylease.go); not mu, which a round's calls take
}

type parkKey struct{ tenant, challenge string }

type record struct {
	digest     string
	finished   bool
	expiresAt  time.Time
	invocation string
	leaseUntil time.Time // zero: no lease
	saved      executor.Saved
	spent      []executor.Spent // what the key's calls spent of their limits (Reclaim gives it back)
}

type runKey struct{ tenant, user, subject, command string }

type outbox struct {
	events    []executor.Event    // kept events, by increasing Seq (purging leaves gaps)
	head      int64               // the last assigned Seq
	delivered int64               // the relay's cursor
	byInv     map[string]struct{} // invocation ids with a kept event
}

var _ executor.Store = (*Store)(nil)

// New returns an empty Store.
func New(opts Options) *Store {
	return &Store{
		opts:   opts.withDefaults(),
		idem:   map[executor.IdemKey]*record{},
		runs:   map[runKey]struct{}{},
		events: map[string]*outbox{},
		spends: map[string]map[string][]executor.Lapse{},
		parked: map[parkKey]executor.Parked{},
	}
}

// Reserve implements executor.Store. A record whose expiry is at or before now is treated as
// absent and replaced.
func (s *Store) Reserve(ctx context.Context, key executor.IdemKey, r executor.Reservation) (*executor.Saved, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validKey(key); err != nil {
		return nil, fail("reserve", err)
	}
	if r.TTL <= 0 {
		return nil, fail("reserve", errBadTTL)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	if rec, ok := s.idem[key]; ok && now.Before(rec.expiresAt) {
		switch {
		case rec.digest != r.Digest:
			return nil, executor.ErrKeyReused
		case !rec.finished && !rec.leaseUntil.IsZero() && !now.Before(rec.leaseUntil):
			return nil, &executor.AbandonedError{InvocationID: rec.invocation}
		case !rec.finished:
			return nil, executor.ErrInFlight
		}
		saved := cloneSaved(rec.saved)
		return &saved, nil
	}
	s.idem[key] = newRecord(now, r)
	return nil, nil
}

// Peek implements executor.Store.
func (s *Store) Peek(ctx context.Context, key executor.IdemKey, digest string) (*executor.Saved, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validKey(key); err != nil {
		return nil, fail("peek", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	rec, ok := s.idem[key]
	switch {
	case !ok || !now.Before(rec.expiresAt):
		return nil, nil
	case rec.digest != digest:
		return nil, executor.ErrKeyReused
	case !rec.finished && !rec.leaseUntil.IsZero() && !now.Before(rec.leaseUntil):
		return nil, &executor.AbandonedError{InvocationID: rec.invocation}
	case !rec.finished:
		return nil, executor.ErrInFlight
	}
	saved := cloneSaved(rec.saved)
	return &saved, nil
}

// Renew implements executor.Store.
func (s *Store) Renew(ctx context.Context, key executor.IdemKey, invocation string, lease time.Duration) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := validKey(key); err != nil {
		return false, fail("renew", err)
	}
	if lease <= 0 || invocation == "" {
		return false, fail("renew", errBadLease)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	rec, ok := s.idem[key]
	if !ok || rec.finished || rec.invocation != invocation || !now.Before(rec.expiresAt) {
		return false, nil
	}
	rec.leaseUntil = now.Add(lease)
	return true, nil
}

func newRecord(now time.Time, r executor.Reservation) *record {
	rec := &record{digest: r.Digest, expiresAt: now.Add(r.TTL), invocation: r.InvocationID}
	if r.Lease > 0 {
		rec.leaseUntil = now.Add(r.Lease)
	}
	return rec
}

// Reclaim implements executor.Store.
func (s *Store) Reclaim(ctx context.Context, key executor.IdemKey, previous string, r executor.Reservation) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := validKey(key); err != nil {
		return false, fail("reclaim", err)
	}
	if r.TTL <= 0 {
		return false, fail("reclaim", errBadTTL)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	rec, ok := s.idem[key]
	if !ok || previous == "" || rec.digest != r.Digest || recordInvocation(rec) != previous {
		return false, nil
	}
	if !rec.finished && (rec.leaseUntil.IsZero() || now.Before(rec.leaseUntil)) {
		return false, nil // still running
	}
	s.refund(key.Tenant, rec.spent, now) // previous never ran
	s.idem[key] = newRecord(now, r)
	return true, nil
}

// Settle implements executor.Store.
func (s *Store) Settle(ctx context.Context, key executor.IdemKey, saved executor.Saved) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec, ok := s.idem[key]; ok && saved.InvocationID != "" && recordInvocation(rec) == saved.InvocationID {
		rec.finished = true
		rec.saved = cloneSaved(saved)
	}
	return nil
}

// recordInvocation is the invocation a record belongs to: the one that
// finished it, or the one that reserved it.
func recordInvocation(rec *record) string {
	if rec.finished && rec.saved.InvocationID != "" {
		return rec.saved.InvocationID
	}
	return rec.invocation
}

// Release implements executor.Store. It drops the key only while it is in flight: a finished
// record keeps its response, and releasing an unknown key does nothing.
func (s *Store) Release(ctx context.Context, key executor.IdemKey) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.idem[key]; ok && !r.finished {
		delete(s.idem, key)
	}
	return nil
}

// Finish implements executor.Store. The response completes the key's reservation only while
// it is in flight; when there is none (released, or expired and taken by another call) the
// execution and the event are still recorded, since the call did run. A repeated Finish for
// the same invocation adds no second execution or event.
func (s *Store) Finish(ctx context.Context, f executor.Finish) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validFinish(f); err != nil {
		return fail("finish", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	// Nothing below can fail, so Finish records all of its parts or none.
	if f.Key != nil {
		if r, ok := s.idem[*f.Key]; ok && !r.finished {
			r.finished = true
			r.saved = cloneSaved(f.Saved)
		}
	}
	if e := f.Execution; e != nil {
		s.runs[runKey{e.Tenant, e.User, e.Subject, e.Command}] = struct{}{}
	}
	if e := f.Event; e != nil {
		ob := s.events[e.Tenant]
		if ob == nil {
			ob = &outbox{byInv: map[string]struct{}{}}
			s.events[e.Tenant] = ob
		}
		if _, done := ob.byInv[e.InvocationID]; !done {
			ev := cloneEvent(*e)
			ob.head++
			ev.Seq = ob.head
			if ev.Time.IsZero() {
				ev.Time = now
			}
			ev.Time = ev.Time.UTC()
			ob.events = append(ob.events, ev)
			ob.byInv[e.InvocationID] = struct{}{}
		}
	}
	return nil
}

// Executed implements executor.Store.
func (s *Store) Executed(ctx context.Context, tenant, user string, commands []string, subject string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range commands {
		if _, ok := s.runs[runKey{tenant, user, subject, c}]; ok {
			return true, nil
		}
	}
	return false, nil
}

// Events implements executor.Store. A limit <= 0 or above Options.MaxEvents returns at most
// MaxEvents events.
func (s *Store) Events(ctx context.Context, tenant string, afterSeq int64, limit int) ([]executor.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit <= 0 || limit > s.opts.MaxEvents {
		limit = s.opts.MaxEvents
	}
	afterSeq = max(afterSeq, 0)
	s.mu.Lock()
	defer s.mu.Unlock()
	ob := s.events[tenant]
	if ob == nil {
		return nil, nil
	}
	i := sort.Search(len(ob.events), func(i int) bool { return ob.events[i].Seq > afterSeq })
	page := ob.events[i:]
	if len(page) == 0 {
		return nil, nil
	}
	page = page[:min(limit, len(page))]
	out := make([]executor.Event, len(page))
	for i := range page {
		out[i] = cloneEvent(page[i])
	}
	return out, nil
}

// Backlog implements executor.Store.
func (s *Store) Backlog(ctx context.Context) ([]executor.Cursor, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []executor.Cursor
	for tenant, ob := range s.events {
		if ob.head > ob.delivered {
			out = append(out, executor.Cursor{Tenant: tenant, Delivered: ob.delivered, Head: ob.head})
		}
	}
	slices.SortFunc(out, func(a, b executor.Cursor) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out, nil
}

// MarkDelivered implements executor.Store. The cursor does not move past the head.
func (s *Store) MarkDelivered(ctx context.Context, tenant string, seq int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if tenant == "" {
		return fail("mark delivered", errors.New("no tenant"))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ob := s.events[tenant]; ob != nil {
		ob.delivered = max(ob.delivered, min(seq, ob.head))
	}
	return nil
}

// Purge implements executor.Store.
func (s *Store) Purge(ctx context.Context, p executor.PurgePolicy) (executor.Purged, error) {
	var n executor.Purged
	if err := ctx.Err(); err != nil {
		return n, err
	}
	if p.KeepEvents < 0 {
		return n, fail("purge", errors.New("negative KeepEvents"))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, r := range s.idem {
		if !p.Now.Before(r.expiresAt) {
			delete(s.idem, k)
			n.IdempotencyKeys++
		}
	}
	cutoff := p.Now.Add(-p.KeepEvents)
	for _, ob := range s.events {
		kept := ob.events[:0]
		for _, e := range ob.events {
			if (p.Undelivered || e.Seq <= ob.delivered) && !e.Time.After(cutoff) {
				delete(ob.byInv, e.InvocationID)
				n.Events++
				continue
			}
			kept = append(kept, e)
		}
		clear(ob.events[len(kept):])
		ob.events = kept
	}
	for tenant, buckets := range s.spends {
		for bucket, entries := range buckets {
			live := liveSpends(entries, p.Now)
			n.Spends += int64(len(entries) - len(live))
			setBucket(buckets, bucket, live)
		}
		if len(buckets) == 0 {
			delete(s.spends, tenant)
		}
	}
	for k, pk := range s.parked {
		if !p.Now.Before(pk.Expires) {
			delete(s.parked, k)
			n.Parked++
		}
	}
	return n, nil
}

// Park implements executor.Store.
func (s *Store) Park(ctx context.Context, p executor.Parked) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := s.opts.Now()
	if err := executor.ValidParked(p, now); err != nil {
		return fail("park", err)
	}
	p.Expires = executor.ParkedUntil(p.Expires, now)
	p.Canonical = bytes.Clone(p.Canonical)
	p.Withheld = slices.Clone(p.Withheld)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.parked[parkKey{p.Tenant, p.ChallengeID}] = p
	return nil
}

// Parked implements executor.Store.
func (s *Store) Parked(ctx context.Context, tenant, challenge string) (*executor.Parked, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := s.opts.Now()
	s.mu.Lock()
	p, ok := s.parked[parkKey{tenant, challenge}]
	s.mu.Unlock()
	if !ok || !now.Before(p.Expires) {
		return nil, nil
	}
	p.Canonical = bytes.Clone(p.Canonical)
	p.Withheld = slices.Clone(p.Withheld)
	return &p, nil
}

// Unpark implements executor.Store.
func (s *Store) Unpark(ctx context.Context, tenant, challenge string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.parked, parkKey{tenant, challenge})
	return nil
}

// PurgeExpired deletes the idempotency records that have expired (and, with them, the limit
// spends that have lapsed) and returns how many records it deleted. Reserve replaces an expired
// record anyway; purging only bounds memory.
func (s *Store) PurgeExpired(ctx context.Context) (int64, error) {
	n, err := s.Purge(ctx, executor.PurgePolicy{Now: s.opts.Now(), KeepEvents: 1<<63 - 1})
	return n.IdempotencyKeys, err
}

var errBadTTL = errors.New("ttl must be positive")

var errBadLease = errors.New("a renewal needs a positive lease and its invocation")

// fail prefixes a validation error with the operation. These errors are the caller's bug, not
// a store condition, so they match none of the executor sentinels.
func fail(op string, err error) error {
	return &opError{op: "executor: " + op, err: err}
}

type opError struct {
	op  string
	err error
}

func (e *opError) Error() string { return e.op + ": " + e.err.Error() }
func (e *opError) Unwrap() error { return e.err }

func validKey(k executor.IdemKey) error {
	switch {
	case k.Tenant == "":
		return errors.New("idempotency key has no tenant")
	case k.User == "":
		return errors.New("idempotency key has no user")
	case k.Command == "":
		return errors.New("idempotency key has no command")
	case k.Key == "":
		return errors.New("idempotency key is empty")
	}
	return nil
}

func validFinish(f executor.Finish) error {
	if f.Key != nil {
		if err := validKey(*f.Key); err != nil {
			return err
		}
	}
	if e := f.Execution; e != nil {
		switch {
		case e.Tenant == "":
			return errors.New("execution has no tenant")
		case e.User == "":
			return errors.New("execution has no user")
		case e.Command == "":
			return errors.New("execution has no command")
		case e.Subject == "":
			return errors.New("execution has no subject")
		case e.InvocationID == "":
			return errors.New("execution has no invocation id")
		}
	}
	if e := f.Event; e != nil {
		switch {
		case e.Tenant == "":
			return errors.New("event has no tenant")
		case e.Command == "":
			return errors.New("event has no command")
		case e.InvocationID == "":
			return errors.New("event has no invocation id")
		}
	}
	return nil
}

func cloneSaved(s executor.Saved) executor.Saved {
	s.Output = bytes.Clone(s.Output)
	s.Status = bytes.Clone(s.Status)
	return s
}

func cloneEvent(e executor.Event) executor.Event {
	e.Result = bytes.Clone(e.Result)
	return e
}

// Spool implements executor.Store: SpoolRows of one row.
func (s *Store) Spool(ctx context.Context, row executor.SpooledRow) error {
	_, err := s.SpoolRows(ctx, []executor.SpooledRow{row}, false)
	return err
}

// SpoolRows implements executor.BatchSpooler; lazy changes nothing in memory.
func (s *Store) SpoolRows(ctx context.Context, rows []executor.SpooledRow, _ bool) ([]int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, row := range rows {
		if len(row.Record) == 0 || row.Tenant == "" {
			return nil, fail("spool", errors.New("a spooled row needs a tenant and a record"))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]int64, len(rows))
	for i, row := range rows {
		s.spoolN++
		row.ID = s.spoolN
		if row.Time.IsZero() {
			row.Time = s.opts.Now()
		}
		row.Record = bytes.Clone(row.Record)
		s.spool = append(s.spool, row)
		ids[i] = row.ID
	}
	return ids, nil
}

// Spooled implements executor.Store.
func (s *Store) Spooled(ctx context.Context, limit int) ([]executor.SpooledRow, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if limit <= 0 || limit > len(s.spool) {
		limit = len(s.spool)
	}
	out := make([]executor.SpooledRow, limit)
	for i, r := range s.spool[:limit] {
		r.Record = bytes.Clone(r.Record)
		out[i] = r
	}
	return out, nil
}

// Unspool implements executor.Store.
func (s *Store) Unspool(ctx context.Context, ids []int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	drop := map[int64]bool{}
	for _, id := range ids {
		drop[id] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.spool = slices.DeleteFunc(s.spool, func(r executor.SpooledRow) bool { return drop[r.ID] })
	return nil
}

// Spooling implements executor.Store.
func (s *Store) Spooling(ctx context.Context, tenant string, invocationIDs []string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.spool {
		if r.Tenant == tenant && slices.Contains(invocationIDs, r.InvocationID) && !slices.Contains(out, r.InvocationID) {
			out = append(out, r.InvocationID)
		}
	}
	return out, nil
}

// Bury implements executor.Store.
func (s *Store) Bury(ctx context.Context, row executor.DeadLetter) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(row.Record) == 0 || row.Tenant == "" {
		return fail("bury", errors.New("a dead letter needs a tenant and a record"))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if row.SpoolID != 0 {
		s.spool = slices.DeleteFunc(s.spool, func(r executor.SpooledRow) bool { return r.ID == row.SpoolID })
	}
	s.deadN++
	row.ID, row.SpoolID = s.deadN, 0
	if row.Dead.IsZero() {
		row.Dead = s.opts.Now()
	}
	if row.Spooled.IsZero() {
		row.Spooled = row.Dead
	}
	row.Record = bytes.Clone(row.Record)
	s.dead = append(s.dead, row)
	return nil
}

// DeadLetters implements executor.Store.
func (s *Store) DeadLetters(ctx context.Context, tenant string, limit int) ([]executor.DeadLetter, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []executor.DeadLetter
	for _, r := range s.dead {
		if limit > 0 && len(out) == limit {
			break
		}
		if r.Tenant == tenant {
			r.Record = bytes.Clone(r.Record)
			out = append(out, r)
		}
	}
	return out, nil
}

// Redrive implements executor.Store.
func (s *Store) Redrive(ctx context.Context, tenant string, ids []int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	pick := map[int64]bool{}
	for _, id := range ids {
		pick[id] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	s.dead = slices.DeleteFunc(s.dead, func(r executor.DeadLetter) bool {
		if r.Tenant != tenant || (ids != nil && !pick[r.ID]) {
			return false
		}
		s.spoolN++
		s.spool = append(s.spool, executor.SpooledRow{ID: s.spoolN, Tenant: r.Tenant, InvocationID: r.InvocationID, Record: r.Record, Time: r.Spooled})
		n++
		return true
	})
	return n, nil
}

// Resolve implements executor.Store.
func (s *Store) Resolve(ctx context.Context, tenant, invocationID string, saved *executor.Saved) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, rec := range s.idem {
		if k.Tenant != tenant || invocationID == "" || recordInvocation(rec) != invocationID {
			continue
		}
		if saved == nil {
			s.refund(tenant, rec.spent, s.opts.Now()) // it never ran
			delete(s.idem, k)
			return true, nil
		}
		rec.finished = true
		rec.saved = cloneSaved(*saved)
		rec.saved.InvocationID = invocationID
		return true, nil
	}
	return false, nil
}

// Spend implements executor.Store. The mutex serialises every bucket at once, so deciding and
// recording are one step; a spend counts while the clock is strictly before its lapse.
func (s *Store) Spend(ctx context.Context, sp executor.Spending) ([]executor.Balance, error) {
	if err := executor.ValidSpending(sp); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make([]executor.Balance, len(sp.Items))
	if len(sp.Items) == 0 {
		return out, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	buckets := s.spends[sp.Tenant]
	all := true
	for i, it := range sp.Items {
		live := liveSpends(buckets[it.Bucket], now)
		var used int64
		for _, l := range live {
			used = addSat(used, l.Amount)
		}
		b := executor.Balance{Used: used, Fits: used <= it.Max-it.Amount} // Max > 0 and Amount >= 0: no overflow
		if !b.Fits {
			b.RetryAfter = executor.RetryAfterOf(live, it.Amount, it.Max, now)
			all = false
		}
		out[i] = b
	}
	if sp.DryRun || (!all && !sp.Force) {
		return out, nil
	}
	if buckets == nil {
		buckets = map[string][]executor.Lapse{}
		s.spends[sp.Tenant] = buckets
	}
	var rec *record
	if sp.Key != nil {
		rec = s.idem[*sp.Key]
	}
	for i, it := range sp.Items {
		live := liveSpends(buckets[it.Bucket], now)
		if it.Amount > 0 {
			at := executor.SpendLapses(now, it.Window)
			live = addSpend(live, at, it.Amount)
			out[i].Lapses = at
			if rec != nil {
				rec.spent = append(rec.spent, executor.Spent{Bucket: it.Bucket, Amount: it.Amount, Lapses: at})
			}
		}
		setBucket(buckets, it.Bucket, live)
	}
	if len(buckets) == 0 {
		delete(s.spends, sp.Tenant)
	}
	return out, nil
}

// liveSpends returns a bucket's entries that still count at now (a new slice).
func liveSpends(entries []executor.Lapse, now time.Time) []executor.Lapse {
	out := make([]executor.Lapse, 0, len(entries)+1)
	for _, l := range entries {
		if now.Before(l.At) {
			out = append(out, l)
		}
	}
	return out
}

// addSpend adds amount to the entry lapsing at at, keeping entries ordered by lapse.
func addSpend(entries []executor.Lapse, at time.Time, amount int64) []executor.Lapse {
	i, found := slices.BinarySearchFunc(entries, at, func(l executor.Lapse, t time.Time) int { return l.At.Compare(t) })
	if found {
		entries[i].Amount = addSat(entries[i].Amount, amount)
		return entries
	}
	return slices.Insert(entries, i, executor.Lapse{Amount: amount, At: at})
}

// setBucket stores a bucket's entries, or drops the bucket when it has none.
func setBucket(buckets map[string][]executor.Lapse, bucket string, entries []executor.Lapse) {
	if len(entries) == 0 {
		delete(buckets, bucket)
		return
	}
	buckets[bucket] = entries
}

// addSat adds two non-negative amounts, saturating instead of overflowing (forced spends may
// add up past any ceiling).
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Refund implements executor.Store.
func (s *Store) Refund(ctx context.Context, tenant string, receipt []executor.Spent) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refund(tenant, receipt, s.opts.Now())
	return nil
}

// refund takes receipt off tenant's buckets: each amount off its entry, never below zero, when
// the entry still counts at now. The caller holds s.mu.
func (s *Store) refund(tenant string, receipt []executor.Spent, now time.Time) {
	buckets := s.spends[tenant]
	for _, r := range receipt {
		live := liveSpends(buckets[r.Bucket], now)
		live = slices.DeleteFunc(live, func(l executor.Lapse) bool {
			return l.At.Equal(r.Lapses) && l.Amount <= r.Amount
		})
		for i := range live {
			if live[i].At.Equal(r.Lapses) {
				live[i].Amount -= r.Amount
			}
		}
		if buckets != nil {
			setBucket(buckets, r.Bucket, live)
		}
	}
	if buckets != nil && len(buckets) == 0 {
		delete(s.spends, tenant)
	}
}

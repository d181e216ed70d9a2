package memory

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/internal/follow"
)

// DefaultRetain is how long a challenge is kept after it expires unless
// Options.Retain says otherwise.
const DefaultRetain = time.Hour

// sweepEvery is how often (by the store's clock) Create looks for
// challenges past their retention.
const sweepEvery = time.Minute

// Options tunes a Store.
type Options struct {
	// Now is the store's clock. Default time.Now. Tests set it to move time
	// without waiting.
	Now func() time.Time
	// Retain is how long a challenge is kept after its expiry, whatever
	// its state: until then Get reports it (EXPIRED, or as it was decided
	// or redeemed); after it, it reads as ErrNotFound and its invocation
	// would open a new one. It bounds the store under sustained load.
	// Default DefaultRetain.
	Retain time.Duration
}

// notice is a stored confirm.Notice.
type notice struct {
	id      int64
	kind    confirm.NoticeKind
	at      time.Time
	c       *confirm.Challenge // the stored challenge, read when claimed
	next    time.Time          // next attempt
	tries   int
	reason  string
	givenUp bool
}

// Store is the in-memory confirm.Store, confirm.SessionStore and
// confirm.NoticeStore. The zero value is not usable; call New.
type Store struct {
	now    func() time.Time
	retain time.Duration
	hub    follow.Hub

	mu           sync.Mutex
	closed       bool
	done         chan struct{}
	byID         map[string]*confirm.Challenge
	byInvocation map[[2]string]string // (tenant, invocation id) → challenge id
	logins       map[string]time.Time // jti → expiry
	sessions     map[string]confirm.Session
	swept        time.Time // the last sweep of challenges past retention
	notices      map[int64]*notice
	lastNotice   int64               // the last notice id handed out
	expiredNoted map[string]struct{} // ids of the challenges with an expired notice
	wg           sync.WaitGroup
}

var (
	_ confirm.Store        = (*Store)(nil)
	_ confirm.SessionStore = (*Store)(nil)
	_ confirm.NoticeStore  = (*Store)(nil)
	_ confirm.Purger       = (*Store)(nil)
)

// New returns an empty Store.
func New(opts Options) *Store {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Retain <= 0 {
		opts.Retain = DefaultRetain
	}
	return &Store{
		now:          opts.Now,
		retain:       opts.Retain,
		done:         make(chan struct{}),
		byID:         map[string]*confirm.Challenge{},
		byInvocation: map[[2]string]string{},
		logins:       map[string]time.Time{},
		sessions:     map[string]confirm.Session{},
		notices:      map[int64]*notice{},
		expiredNoted: map[string]struct{}{},
	}
}

// Close ends every Watch and waits for their goroutines. Later calls fail
// with confirm.ErrUnavailable.
func (s *Store) Close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.done)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// clock returns the store's time at the precision Postgres keeps, so both
// stores hand out the same timestamps.
func (s *Store) clock() time.Time { return s.now().UTC().Truncate(time.Microsecond) }

var errClosed = confirm.Unavailable("memory store", nil)

// view returns a copy of c with its effective state at now.
func view(c *confirm.Challenge, now time.Time) confirm.Challenge {
	out := *c
	out.Prompt.SideEffects = slices.Clone(c.Prompt.SideEffects)
	out.Prompt.Permissions = slices.Clone(c.Prompt.Permissions)
	out.Prompt.WithheldFields = slices.Clone(c.Prompt.WithheldFields)
	out.Prompt.Reasons = slices.Clone(c.Prompt.Reasons)
	out.State = confirm.EffectiveState(c.State, c.ExpiresAt, now)
	return out
}

// Create implements confirm.Store.
func (s *Store) Create(_ context.Context, c confirm.Challenge, ttl time.Duration) (confirm.Challenge, bool, error) {
	if err := confirm.CheckNew(&c, ttl); err != nil {
		return confirm.Challenge{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return confirm.Challenge{}, false, errClosed
	}
	now := s.clock()
	s.sweep(now)
	if id, ok := s.byInvocation[[2]string{c.Tenant, c.InvocationID}]; ok {
		return view(s.byID[id], now), false, nil
	}
	if _, taken := s.byID[c.ID]; taken {
		return confirm.Challenge{}, false, confirm.Invalid("id", "is taken")
	}
	c.State = confirm.StatePending
	c.CreatedAt, c.ExpiresAt = now, now.Add(ttl)
	c.DecidedBy, c.DecidedAt, c.DecisionChannel, c.RedeemedAt = "", time.Time{}, "", time.Time{}
	stored := view(&c, now) // a private copy
	stored.State = confirm.StatePending
	s.byID[c.ID] = &stored
	s.byInvocation[[2]string{c.Tenant, c.InvocationID}] = c.ID
	s.record(confirm.NoticeOpened, &stored, now, now)
	return view(&stored, now), true, nil
}

// record adds a notice of kind about the stored challenge c, due at now. The
// caller holds mu.
func (s *Store) record(kind confirm.NoticeKind, c *confirm.Challenge, at, now time.Time) {
	s.lastNotice++
	s.notices[s.lastNotice] = &notice{id: s.lastNotice, kind: kind, at: at, c: c, next: now}
}

// sweep drops the challenges that expired more than retain ago, with their
// notices (delivered or not), at most once per sweepEvery. The caller holds
// mu.
func (s *Store) sweep(now time.Time) {
	if now.Sub(s.swept) < sweepEvery {
		return
	}
	s.swept = now
	s.drop(now, len(s.byID))
}

// drop deletes up to limit challenges that expired more than retain ago,
// oldest expiry first, with their notices, and returns how many. The caller
// holds mu.
func (s *Store) drop(now time.Time, limit int) int {
	var old []*confirm.Challenge
	for _, c := range s.byID {
		if now.Sub(c.ExpiresAt) > s.retain {
			old = append(old, c)
		}
	}
	if len(old) == 0 || limit <= 0 {
		return 0
	}
	slices.SortFunc(old, func(a, b *confirm.Challenge) int {
		return cmp.Or(a.ExpiresAt.Compare(b.ExpiresAt), cmp.Compare(a.ID, b.ID))
	})
	old = old[:min(limit, len(old))]
	for _, c := range old {
		delete(s.byID, c.ID)
		delete(s.byInvocation, [2]string{c.Tenant, c.InvocationID})
		delete(s.expiredNoted, c.ID)
	}
	for id, n := range s.notices {
		if s.byID[n.c.ID] != n.c {
			delete(s.notices, id)
		}
	}
	return len(old)
}

// PurgeExpired implements confirm.Purger.
func (s *Store) PurgeExpired(_ context.Context, limit int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, errClosed
	}
	return s.drop(s.clock(), limit), nil
}

// Get implements confirm.Store.
func (s *Store) Get(_ context.Context, tenant, id string) (confirm.Challenge, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return confirm.Challenge{}, errClosed
	}
	c, ok := s.byID[id]
	if !ok || c.Tenant != tenant {
		return confirm.Challenge{}, confirm.ErrNotFound
	}
	return view(c, s.clock()), nil
}

// ListPending implements confirm.Store.
func (s *Store) ListPending(_ context.Context, tenant string, limit int) ([]confirm.Challenge, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	now := s.clock()
	var out []confirm.Challenge
	for _, c := range s.byID {
		if c.Tenant == tenant && confirm.EffectiveState(c.State, c.ExpiresAt, now) == confirm.StatePending {
			out = append(out, view(c, now))
		}
	}
	slices.SortFunc(out, func(a, b confirm.Challenge) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	if limit >= 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// CountPending implements confirm.Store.
func (s *Store) CountPending(_ context.Context, tenant, user, agent string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, errClosed
	}
	now := s.clock()
	n := 0
	for _, c := range s.byID {
		if c.Tenant == tenant && c.RequesterUser == user && c.RequesterAgent == agent &&
			confirm.EffectiveState(c.State, c.ExpiresAt, now) == confirm.StatePending {
			n++
		}
	}
	return n, nil
}

// Decide implements confirm.Store.
func (s *Store) Decide(_ context.Context, tenant, id string, d confirm.Decision) (confirm.Challenge, error) {
	if d.By == "" {
		return confirm.Challenge{}, confirm.Invalid("decided_by", "is required")
	}
	if !confirm.ValidChannel(d.Channel) {
		return confirm.Challenge{}, confirm.Invalid("channel", "is not a decision channel")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return confirm.Challenge{}, errClosed
	}
	c, ok := s.byID[id]
	if !ok || c.Tenant != tenant {
		return confirm.Challenge{}, confirm.ErrNotFound
	}
	now := s.clock()
	// A challenge with an expired notice stays expired, should the clock
	// step back.
	_, noted := s.expiredNoted[id]
	if err := confirm.DecideRefusal(c.State, noted || !now.Before(c.ExpiresAt)); err != nil {
		return confirm.Challenge{}, err
	}
	c.State = confirm.StateDeclined
	if d.Approve {
		c.State = confirm.StateApproved
	}
	c.DecidedBy, c.DecidedAt, c.DecisionChannel = d.By, now, d.Channel
	s.record(confirm.NoticeDecided, c, now, now)
	s.hub.Notify(id)
	return view(c, now), nil
}

// Redeem implements confirm.Store.
func (s *Store) Redeem(_ context.Context, tenant, id, digest string) (confirm.Challenge, error) {
	return s.grant(tenant, id, func(c *confirm.Challenge, now time.Time) error {
		if err := confirm.RedeemRefusal(c.State, c.InvocationDigest == digest, !now.Before(c.ExpiresAt)); err != nil {
			return err
		}
		c.State, c.RedeemedAt = confirm.StateRedeemed, now
		return nil
	})
}

// Release implements confirm.Store.
func (s *Store) Release(_ context.Context, tenant, id, digest string) (confirm.Challenge, error) {
	return s.grant(tenant, id, func(c *confirm.Challenge, now time.Time) error {
		if err := confirm.ReleaseRefusal(c.State, c.InvocationDigest == digest, !now.Before(c.ExpiresAt)); err != nil {
			return err
		}
		c.State, c.RedeemedAt = confirm.StateApproved, time.Time{}
		return nil
	})
}

// grant applies move to the tenant's challenge id under the store's lock
// and returns it as it then is; the challenge's watchers are woken.
func (s *Store) grant(tenant, id string, move func(c *confirm.Challenge, now time.Time) error) (confirm.Challenge, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return confirm.Challenge{}, errClosed
	}
	c, ok := s.byID[id]
	if !ok || c.Tenant != tenant {
		return confirm.Challenge{}, confirm.ErrNotFound
	}
	now := s.clock()
	if err := move(c, now); err != nil {
		return confirm.Challenge{}, err
	}
	s.hub.Notify(id)
	return view(c, now), nil
}

// Watch implements confirm.Store.
func (s *Store) Watch(ctx context.Context, tenant, id string) (<-chan confirm.Challenge, error) {
	sub := s.hub.Subscribe(id)
	woken := sub.C()
	first, err := s.Get(ctx, tenant, id)
	if err != nil {
		sub.Close()
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		sub.Close()
		return nil, errClosed
	}
	s.wg.Add(1) // under mu: Close cannot be waiting yet
	s.mu.Unlock()
	out := make(chan confirm.Challenge)
	go func() {
		defer s.wg.Done()
		follow.Run(ctx, s.done, out, first, sub, woken,
			func(ctx context.Context) (confirm.Challenge, error) { return s.Get(ctx, tenant, id) },
			follow.Options{Now: s.now})
	}()
	return out, nil
}

// ConsumeLoginToken implements confirm.SessionStore.
func (s *Store) ConsumeLoginToken(_ context.Context, jti string, expiresAt time.Time) error {
	if jti == "" {
		return confirm.Invalid("jti", "is required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	now := s.clock()
	for k, exp := range s.logins {
		if exp.Add(time.Minute).Before(now) {
			delete(s.logins, k)
		}
	}
	if _, used := s.logins[jti]; used {
		return confirm.ErrLoginTokenUsed
	}
	s.logins[jti] = expiresAt
	return nil
}

// CreateSession implements confirm.SessionStore.
func (s *Store) CreateSession(_ context.Context, sess confirm.Session, ttl time.Duration) (confirm.Session, error) {
	switch {
	case sess.IDHash == "" || sess.Tenant == "" || sess.UserID == "" || sess.CSRFToken == "":
		return confirm.Session{}, confirm.Invalid("session", "needs id hash, tenant, user and CSRF token")
	case ttl <= 0:
		return confirm.Session{}, confirm.Invalid("ttl", "must be positive")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return confirm.Session{}, errClosed
	}
	now := s.clock()
	for k, old := range s.sessions {
		if !now.Before(old.ExpiresAt) {
			delete(s.sessions, k)
		}
	}
	if _, taken := s.sessions[sess.IDHash]; taken {
		return confirm.Session{}, confirm.Invalid("session", "id is taken")
	}
	sess.CreatedAt, sess.ExpiresAt = now, now.Add(ttl)
	s.sessions[sess.IDHash] = sess
	return sess, nil
}

// Session implements confirm.SessionStore.
func (s *Store) Session(_ context.Context, idHash string) (confirm.Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return confirm.Session{}, errClosed
	}
	sess, ok := s.sessions[idHash]
	if !ok || !s.clock().Before(sess.ExpiresAt) {
		return confirm.Session{}, confirm.ErrNotFound
	}
	return sess, nil
}

// DeleteSession implements confirm.SessionStore.
func (s *Store) DeleteSession(_ context.Context, idHash string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	delete(s.sessions, idHash)
	return nil
}

// ExpireDue implements confirm.NoticeStore.
func (s *Store) ExpireDue(_ context.Context, limit int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, errClosed
	}
	if limit <= 0 {
		return 0, nil
	}
	now := s.clock()
	var due []*confirm.Challenge
	for id, c := range s.byID {
		if _, noted := s.expiredNoted[id]; !noted && c.State == confirm.StatePending && !now.Before(c.ExpiresAt) {
			due = append(due, c)
		}
	}
	slices.SortFunc(due, func(a, b *confirm.Challenge) int {
		return cmp.Or(a.ExpiresAt.Compare(b.ExpiresAt), cmp.Compare(a.ID, b.ID))
	})
	due = due[:min(limit, len(due))]
	for _, c := range due {
		s.expiredNoted[c.ID] = struct{}{}
		s.record(confirm.NoticeExpired, c, c.ExpiresAt, now)
	}
	return len(due), nil
}

// ClaimNotices implements confirm.NoticeStore.
func (s *Store) ClaimNotices(_ context.Context, limit int, lease time.Duration) ([]confirm.Notice, error) {
	if lease < time.Microsecond {
		return nil, confirm.Invalid("lease", "must be positive")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	if limit <= 0 {
		return nil, nil
	}
	now := s.clock()
	var due []*notice
	for _, n := range s.notices {
		if !n.givenUp && !n.next.After(now) {
			due = append(due, n)
		}
	}
	slices.SortFunc(due, func(a, b *notice) int { return cmp.Compare(a.id, b.id) })
	due = due[:min(limit, len(due))]
	out := make([]confirm.Notice, 0, len(due))
	for _, n := range due {
		n.next = now.Add(lease)
		out = append(out, confirm.Notice{
			ID: n.id, Kind: n.kind, Tenant: n.c.Tenant, ChallengeID: n.c.ID, At: n.at, Attempts: n.tries,
			Challenge: view(n.c, now),
		})
	}
	return out, nil
}

// NoticeDelivered implements confirm.NoticeStore.
func (s *Store) NoticeDelivered(_ context.Context, id int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	delete(s.notices, id)
	return nil
}

// NoticeFailed implements confirm.NoticeStore.
func (s *Store) NoticeFailed(_ context.Context, id int64, after time.Duration, reason string) error {
	reason = confirm.NoticeReason(reason)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	if n, ok := s.notices[id]; ok && !n.givenUp {
		n.tries++
		n.next = s.clock().Add(max(after, 0)).Truncate(time.Microsecond)
		n.reason = reason
	}
	return nil
}

// NoticeGiveUp implements confirm.NoticeStore.
func (s *Store) NoticeGiveUp(_ context.Context, id int64, reason string) error {
	reason = confirm.NoticeReason(reason)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	if n, ok := s.notices[id]; ok {
		n.givenUp, n.reason = true, reason
	}
	return nil
}

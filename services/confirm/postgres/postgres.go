package postgres

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandate-dev/mandate/internal/storage/migrate"
	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/internal/follow"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations creates the confirm schema; migrator.Run (`mandate migrate`) applies it before New.
var Migrations = migrate.Set{Service: "confirm", FS: mustSub(migrationFiles, "migrations")}

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err) // the directory is embedded above; this cannot fail
	}
	return sub
}

// Channel is the LISTEN/NOTIFY channel; the payload is a challenge id.
const Channel = "mandate_confirm"

// Options tunes a Store. Zero fields take the documented defaults.
type Options struct {
	// Logger receives listener and watch problems. Default slog.Default().
	Logger *slog.Logger
	// WatchPoll is how often a watcher re-reads its challenge without having
	// been woken. Default 2s.
	WatchPoll time.Duration
	// WatchReadyTimeout bounds how long Watch waits for the listener to be
	// in place. Default 5s.
	WatchReadyTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the listener's reconnect backoff.
	// Defaults 100ms, 5s.
	ReconnectMin, ReconnectMax time.Duration
	// Retain is how long a challenge is kept after it expires (it reads
	// as EXPIRED meanwhile); PurgeExpired deletes it after that, with its
	// notices. Default DefaultRetain.
	Retain time.Duration
}

// DefaultRetain is how long a challenge is kept after its expiry unless
// Options.Retain says otherwise: a week, for the approval page to answer
// "expired" and an operator to look; the audit trail keeps the decision
// for good.
const DefaultRetain = 7 * 24 * time.Hour

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.WatchPoll <= 0 {
		o.WatchPoll = 2 * time.Second
	}
	if o.WatchReadyTimeout <= 0 {
		o.WatchReadyTimeout = 5 * time.Second
	}
	if o.ReconnectMin <= 0 {
		o.ReconnectMin = 100 * time.Millisecond
	}
	if o.ReconnectMax <= 0 {
		o.ReconnectMax = 5 * time.Second
	}
	if o.Retain <= 0 {
		o.Retain = DefaultRetain
	}
	return o
}

// Store is the PostgreSQL confirm.Store, confirm.SessionStore and
// confirm.NoticeStore. It does not own the pool.
type Store struct {
	pool *pgxpool.Pool
	opts Options
	hub  follow.Hub

	mu       sync.Mutex
	closed   bool
	done     chan struct{} // closed by Close: ends watches
	watchers int
	stop     context.CancelFunc // stops the current listener; nil when none runs
	ready    chan struct{}      // closed once the current listener has LISTEN in place
	wg       sync.WaitGroup     // watch and listener goroutines
}

var (
	_ confirm.Store        = (*Store)(nil)
	_ confirm.SessionStore = (*Store)(nil)
	_ confirm.NoticeStore  = (*Store)(nil)
	_ confirm.Purger       = (*Store)(nil)
)

// New returns a Store on pool, whose database must have [Migrations]
// applied.
func New(pool *pgxpool.Pool, opts Options) *Store {
	return &Store{pool: pool, opts: opts.withDefaults(), done: make(chan struct{})}
}

// Close ends every Watch, stops the listener and waits for their
// goroutines. Later calls fail with confirm.ErrUnavailable. It does not
// close the pool.
func (s *Store) Close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.done)
		if s.stop != nil {
			s.stop()
			s.stop = nil
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

var errClosed = confirm.Unavailable("postgres store closed", nil)

// columns in the order scan reads them; state is the effective state.
const columns = `id, tenant, command, risk, invocation_digest, invocation_id, requester_user, requester_agent,
	approver_kind, approver_permission, prompt,
	CASE WHEN state IN ('PENDING', 'APPROVED') AND expires_at <= now() THEN 'EXPIRED' ELSE state END,
	created_at, expires_at, decided_by, decided_at, decision_channel, redeemed_at`

func scan(row pgx.Row) (confirm.Challenge, error) {
	var (
		c                          confirm.Challenge
		kind, state                string
		prompt                     []byte
		decidedBy, decisionChannel *string
		decidedAt, redeemedAt      *time.Time
	)
	err := row.Scan(&c.ID, &c.Tenant, &c.Command, &c.Risk, &c.InvocationDigest, &c.InvocationID,
		&c.RequesterUser, &c.RequesterAgent, &kind, &c.Approver.Permission, &prompt, &state,
		&c.CreatedAt, &c.ExpiresAt, &decidedBy, &decidedAt, &decisionChannel, &redeemedAt)
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(prompt, &c.Prompt); err != nil {
		return c, fmt.Errorf("decoding the stored prompt: %w", err)
	}
	c.Approver.Kind, c.State = confirm.ApproverKind(kind), confirm.State(state)
	c.CreatedAt, c.ExpiresAt = c.CreatedAt.UTC(), c.ExpiresAt.UTC()
	if decidedBy != nil {
		c.DecidedBy = *decidedBy
	}
	if decisionChannel != nil {
		c.DecisionChannel = *decisionChannel
	}
	if decidedAt != nil {
		c.DecidedAt = decidedAt.UTC()
	}
	if redeemedAt != nil {
		c.RedeemedAt = redeemedAt.UTC()
	}
	return c, nil
}

// mapErr turns a database failure into a confirm error: unavailable when
// the database could not be reached, the context's error when the caller
// gave up, a generic error (driver text kept for logs only) otherwise.
func mapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*confirm.Error](err); ok {
		return err
	}
	switch pg.Classify(err) {
	case pg.KindUnavailable:
		return confirm.Unavailable("confirm: "+op, pg.Wrap("confirm: "+op, err))
	case pg.KindCanceled:
		return fmt.Errorf("confirm: %s: %w", op, context.Canceled)
	}
	return pg.Wrap("confirm: "+op, err)
}

// Create implements confirm.Store.
func (s *Store) Create(ctx context.Context, c confirm.Challenge, ttl time.Duration) (confirm.Challenge, bool, error) {
	if err := confirm.CheckNew(&c, ttl); err != nil {
		return confirm.Challenge{}, false, err
	}
	if s.isClosed() {
		return confirm.Challenge{}, false, errClosed
	}
	prompt, err := json.Marshal(c.Prompt)
	if err != nil {
		return confirm.Challenge{}, false, confirm.Invalid("prompt", "cannot be encoded")
	}
	// One statement: the opened notice is written with the challenge, or
	// not at all when the invocation already has one.
	row := s.pool.QueryRow(ctx, `WITH created AS (
			INSERT INTO confirm.challenges (id, tenant, command, risk, invocation_digest, invocation_id,
			requester_user, requester_agent, approver_kind, approver_permission, prompt, state, created_at, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'PENDING', now(), now() + $12::bigint * interval '1 microsecond')
			ON CONFLICT (tenant, invocation_id) DO NOTHING
			RETURNING *
		), opened AS (
			INSERT INTO confirm.notices (kind, tenant, challenge_id, at, next_at)
			SELECT 'challenge.opened', tenant, id, created_at, created_at FROM created
		)
		SELECT `+columns+` FROM created`,
		c.ID, c.Tenant, c.Command, c.Risk, c.InvocationDigest, c.InvocationID, c.RequesterUser, c.RequesterAgent,
		string(c.Approver.Kind), c.Approver.Permission, prompt, ttl.Microseconds())
	stored, err := scan(row)
	if err == nil {
		return stored, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return confirm.Challenge{}, false, mapErr("create challenge", err)
	}
	// The invocation already has a challenge: opening is idempotent.
	stored, err = scan(s.pool.QueryRow(ctx, "SELECT "+columns+" FROM confirm.challenges WHERE tenant = $1 AND invocation_id = $2",
		c.Tenant, c.InvocationID))
	if err != nil {
		return confirm.Challenge{}, false, mapErr("create challenge", err)
	}
	return stored, false, nil
}

// Get implements confirm.Store.
func (s *Store) Get(ctx context.Context, tenant, id string) (confirm.Challenge, error) {
	if s.isClosed() {
		return confirm.Challenge{}, errClosed
	}
	c, err := scan(s.pool.QueryRow(ctx, "SELECT "+columns+" FROM confirm.challenges WHERE tenant = $1 AND id = $2", tenant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return confirm.Challenge{}, confirm.ErrNotFound
	}
	return c, mapErr("get challenge", err)
}

// ListPending implements confirm.Store.
func (s *Store) ListPending(ctx context.Context, tenant string, limit int) ([]confirm.Challenge, error) {
	if s.isClosed() {
		return nil, errClosed
	}
	rows, err := s.pool.Query(ctx, "SELECT "+columns+` FROM confirm.challenges
		WHERE tenant = $1 AND state = 'PENDING' AND expires_at > now()
		ORDER BY created_at DESC, id LIMIT $2`, tenant, max(limit, 0))
	if err != nil {
		return nil, mapErr("list pending challenges", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (confirm.Challenge, error) { return scan(r) })
	return out, mapErr("list pending challenges", err)
}

// CountPending implements confirm.Store.
func (s *Store) CountPending(ctx context.Context, tenant, user, agent string) (int, error) {
	if s.isClosed() {
		return 0, errClosed
	}
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM confirm.challenges
		WHERE tenant = $1 AND requester_user = $2 AND requester_agent = $3 AND state = 'PENDING' AND expires_at > now()`,
		tenant, user, agent).Scan(&n)
	return n, mapErr("count pending challenges", err)
}

// Decide implements confirm.Store.
func (s *Store) Decide(ctx context.Context, tenant, id string, d confirm.Decision) (confirm.Challenge, error) {
	if d.By == "" {
		return confirm.Challenge{}, confirm.Invalid("decided_by", "is required")
	}
	if !confirm.ValidChannel(d.Channel) {
		return confirm.Challenge{}, confirm.Invalid("channel", "is not a decision channel")
	}
	state := confirm.StateDeclined
	if d.Approve {
		state = confirm.StateApproved
	}
	// The decided notice is written by the same statement, so only with a
	// decision. NOT expiry_noticed: a Decide that started just before the
	// expiry and waited for the row while ExpireDue recorded its expired
	// notice is refused (the re-read then finds it expired), so that no
	// challenge is both expired and decided.
	return s.transition(ctx, "decide challenge", tenant, id,
		`WITH decided AS (
			UPDATE confirm.challenges SET state = $3, decided_by = $4, decided_at = now(), decision_channel = $5
			WHERE tenant = $1 AND id = $2 AND state = 'PENDING' AND expires_at > now() AND NOT expiry_noticed
			RETURNING *
		), noticed AS (
			INSERT INTO confirm.notices (kind, tenant, challenge_id, at, next_at)
			SELECT 'challenge.decided', tenant, id, decided_at, decided_at FROM decided
		)
		SELECT `+columns+` FROM decided`,
		[]any{tenant, id, string(state), d.By, d.Channel},
		func(stored confirm.State, _ string, expired bool) error {
			return confirm.DecideRefusal(stored, expired)
		})
}

// Redeem implements confirm.Store.
func (s *Store) Redeem(ctx context.Context, tenant, id, digest string) (confirm.Challenge, error) {
	return s.transition(ctx, "redeem grant", tenant, id,
		`UPDATE confirm.challenges SET state = 'REDEEMED', redeemed_at = now()
		WHERE tenant = $1 AND id = $2 AND state = 'APPROVED' AND invocation_digest = $3 AND expires_at > now()
		RETURNING `+columns,
		[]any{tenant, id, digest},
		func(stored confirm.State, storedDigest string, expired bool) error {
			return confirm.RedeemRefusal(stored, storedDigest == digest, expired)
		})
}

// Release implements confirm.Store.
func (s *Store) Release(ctx context.Context, tenant, id, digest string) (confirm.Challenge, error) {
	return s.transition(ctx, "release grant", tenant, id,
		`UPDATE confirm.challenges SET state = 'APPROVED', redeemed_at = NULL
		WHERE tenant = $1 AND id = $2 AND state IN ('REDEEMED', 'APPROVED') AND invocation_digest = $3 AND expires_at > now()
		RETURNING `+columns,
		[]any{tenant, id, digest},
		func(stored confirm.State, storedDigest string, expired bool) error {
			return confirm.ReleaseRefusal(stored, storedDigest == digest, expired)
		})
}

// transition runs a conditional UPDATE that changes the row only when its
// precondition holds. When it changes nothing, the row is read again to tell
// the caller why (refusal); should the re-read show the precondition
// holding after all (the row moved between the two statements), the update
// is tried again.
func (s *Store) transition(ctx context.Context, op, tenant, id, update string, args []any,
	refusal func(stored confirm.State, digest string, expired bool) error) (confirm.Challenge, error) {
	if s.isClosed() {
		return confirm.Challenge{}, errClosed
	}
	for range 3 {
		c, err := scan(s.pool.QueryRow(ctx, update, args...))
		if err == nil {
			s.hub.Notify(id) // local watchers need not wait for the NOTIFY round trip
			return c, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return confirm.Challenge{}, mapErr(op, err)
		}
		var (
			stored, digest string
			expired        bool
		)
		err = s.pool.QueryRow(ctx, `SELECT state, invocation_digest, expires_at <= now()
			FROM confirm.challenges WHERE tenant = $1 AND id = $2`, tenant, id).Scan(&stored, &digest, &expired)
		if errors.Is(err, pgx.ErrNoRows) {
			return confirm.Challenge{}, confirm.ErrNotFound
		}
		if err != nil {
			return confirm.Challenge{}, mapErr(op, err)
		}
		if err := refusal(confirm.State(stored), digest, expired); err != nil {
			return confirm.Challenge{}, err
		}
	}
	return confirm.Challenge{}, fmt.Errorf("confirm: %s: the challenge kept changing under the update", op)
}

// ConsumeLoginToken implements confirm.SessionStore.
func (s *Store) ConsumeLoginToken(ctx context.Context, jti string, expiresAt time.Time) error {
	if jti == "" {
		return confirm.Invalid("jti", "is required")
	}
	if s.isClosed() {
		return errClosed
	}
	// Expired records go first: their tokens no longer verify (the verifier's
	// leeway is well under the minute kept here).
	tag, err := s.pool.Exec(ctx, `WITH gc AS (DELETE FROM confirm.login_tokens WHERE expires_at < now() - interval '1 minute')
		INSERT INTO confirm.login_tokens (jti, expires_at) VALUES ($1, $2) ON CONFLICT (jti) DO NOTHING`, jti, expiresAt)
	if err != nil {
		return mapErr("consume login token", err)
	}
	if tag.RowsAffected() == 0 {
		return confirm.ErrLoginTokenUsed
	}
	return nil
}

// CreateSession implements confirm.SessionStore.
func (s *Store) CreateSession(ctx context.Context, sess confirm.Session, ttl time.Duration) (confirm.Session, error) {
	switch {
	case sess.IDHash == "" || sess.Tenant == "" || sess.UserID == "" || sess.CSRFToken == "":
		return confirm.Session{}, confirm.Invalid("session", "needs id hash, tenant, user and CSRF token")
	case ttl < time.Microsecond:
		return confirm.Session{}, confirm.Invalid("ttl", "must be positive")
	}
	if s.isClosed() {
		return confirm.Session{}, errClosed
	}
	err := s.pool.QueryRow(ctx, `WITH gc AS (DELETE FROM confirm.sessions WHERE expires_at <= now())
		INSERT INTO confirm.sessions (id_hash, tenant, user_id, csrf_token, created_at, expires_at)
		VALUES ($1, $2, $3, $4, now(), now() + $5::bigint * interval '1 microsecond')
		RETURNING created_at, expires_at`,
		sess.IDHash, sess.Tenant, sess.UserID, sess.CSRFToken, ttl.Microseconds()).Scan(&sess.CreatedAt, &sess.ExpiresAt)
	if pg.Classify(err) == pg.KindUniqueViolation {
		return confirm.Session{}, confirm.Invalid("session", "id is taken")
	}
	if err != nil {
		return confirm.Session{}, mapErr("create session", err)
	}
	sess.CreatedAt, sess.ExpiresAt = sess.CreatedAt.UTC(), sess.ExpiresAt.UTC()
	return sess, nil
}

// Session implements confirm.SessionStore.
func (s *Store) Session(ctx context.Context, idHash string) (confirm.Session, error) {
	if s.isClosed() {
		return confirm.Session{}, errClosed
	}
	sess := confirm.Session{IDHash: idHash}
	err := s.pool.QueryRow(ctx, `SELECT tenant, user_id, csrf_token, created_at, expires_at FROM confirm.sessions
		WHERE id_hash = $1 AND expires_at > now()`, idHash).
		Scan(&sess.Tenant, &sess.UserID, &sess.CSRFToken, &sess.CreatedAt, &sess.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return confirm.Session{}, confirm.ErrNotFound
	}
	if err != nil {
		return confirm.Session{}, mapErr("read session", err)
	}
	sess.CreatedAt, sess.ExpiresAt = sess.CreatedAt.UTC(), sess.ExpiresAt.UTC()
	return sess, nil
}

// DeleteSession implements confirm.SessionStore.
func (s *Store) DeleteSession(ctx context.Context, idHash string) error {
	if s.isClosed() {
		return errClosed
	}
	_, err := s.pool.Exec(ctx, "DELETE FROM confirm.sessions WHERE id_hash = $1", idHash)
	return mapErr("delete session", err)
}

package postgres

import (
	"context"
	"embed"
	"errors"
	"io/fs"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandate-dev/mandate/internal/storage/migrate"
	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/internal/feed"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations creates the audit schema; migrator.Run (`mandate migrate`) applies it before New.
var Migrations = migrate.Set{Service: "audit", FS: mustSub(migrationFiles, "migrations")}

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err) // the directory is embedded above; this cannot fail
	}
	return sub
}

// Channel is the LISTEN/NOTIFY channel; the payload is the tenant that got new rows.
const Channel = "mandate_audit"

// Options tunes a Store. Zero fields take the documented defaults.
type Options struct {
	// Logger receives listener and watch problems. Default slog.Default().
	Logger *slog.Logger
	// ConflictAttempts is how many times AppendBatch runs its transaction when it collides
	// with a concurrent writer (unique violation, serialization failure, deadlock). Default 5.
	ConflictAttempts int
	// WatchPoll is how often a watcher reads the store without having been woken. Default 2s.
	WatchPoll time.Duration
	// WatchReadyTimeout bounds how long Watch waits for the listener to be in place. Default 5s.
	WatchReadyTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the listener's reconnect backoff. Defaults 100ms, 5s.
	ReconnectMin, ReconnectMax time.Duration
	// AnnounceEvery is the least time between two of this Store's NOTIFYs (see announce):
	// tenants whose appends commit meanwhile are announced together by the next one, so a
	// remote watcher hears of a row up to this much later. PostgreSQL wakes every LISTENing
	// connection of the database on every NOTIFY, whatever its channel, so one per commit
	// would cost each listener of every service sharing the database a wake-up per commit.
	// Default 20ms; negative: one NOTIFY per commit as soon as it can be sent.
	AnnounceEvery time.Duration
}

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ConflictAttempts <= 0 {
		o.ConflictAttempts = 5
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
	switch {
	case o.AnnounceEvery == 0:
		o.AnnounceEvery = 20 * time.Millisecond
	case o.AnnounceEvery < 0:
		o.AnnounceEvery = 0
	}
	return o
}

// Store is the PostgreSQL audit.Store. It does not own the pool.
type Store struct {
	pool  *pgxpool.Pool
	opts  Options
	typed bool // the pool's connections describe statements: see typedParams

	hub feed.Hub

	ctx        context.Context // canceled by Close
	cancel     context.CancelFunc
	annPending map[string]bool // tenants to NOTIFY about; guarded by mu
	annRunning bool            // guarded by mu
	annSignal  chan struct{}   // wakes the announcer; buffered 1

	headMu   sync.Mutex
	headCond *sync.Cond            // on headMu; signalled when an append ends
	heads    map[string]audit.Head // predicted chain heads: after every append in flight, if it commits
	fast     map[string]int        // fast-path appends in flight per tenant
	locking  map[string]int        // locking-path appends in flight per tenant
	last     map[string]*chained   // per tenant: the newest fast batch in flight
	keys     map[audit.Key]int     // keys in fast batches in flight

	mu       sync.Mutex
	closed   bool
	done     chan struct{} // closed by Close: ends watches
	watchers int
	stop     context.CancelFunc // stops the current listener; nil when none runs
	ready    chan struct{}      // closed once the current listener has LISTEN in place
	wg       sync.WaitGroup     // watch and listener goroutines
}

var _ audit.Store = (*Store)(nil)

// New returns a Store on pool, whose database must have [Migrations] applied.
func New(pool *pgxpool.Pool, opts Options) *Store {
	s := &Store{
		pool:      pool,
		opts:      opts.withDefaults(),
		typed:     typedParams(pool.Config().ConnConfig),
		done:      make(chan struct{}),
		annSignal: make(chan struct{}, 1),
		heads:     map[string]audit.Head{},
		fast:      map[string]int{},
		locking:   map[string]int{},
		last:      map[string]*chained{},
		keys:      map[audit.Key]int{},
	}
	s.headCond = sync.NewCond(&s.headMu)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// Pool returns the pool the Store uses.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Close ends every Watch, stops the listener and waits for their goroutines. Later calls fail
// with audit.ErrClosed. It does not close the pool.
func (s *Store) Close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.done)
		s.cancel()
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

// columns of audit.records in the order scanRow and queueInsert use.
var columns = []string{
	"tenant", "seq", "invocation_id", "phase", "time", "channel", "command", "risk", "side_effects",
	"idempotent", "reversible", "subject", "user_id", "actor_kind", "agent_id", "model", "model_version",
	"conversation_id", "mcp_session_id", "approval_challenge_id", "approver", "approval_channel",
	"approval_decided_at", "outcome", "stage", "code", "message", "arguments", "arguments_digest",
	"result_digest", "duration_ns", "trace_id", "manifest_digest", "prev_hash", "hash",
	"approval_trust_ceiling",
}

var (
	columnList  = joinColumns("")
	rColumnList = joinColumns("r.")
)

func joinColumns(prefix string) string {
	out := ""
	for i, c := range columns {
		if i > 0 {
			out += ", "
		}
		out += prefix + c
	}
	return out
}

func scanRow(row pgx.CollectableRow) (audit.Stored, error) {
	var (
		s                                    audit.Stored
		phase, channel, risk, actor, outcome string
		challenge, approver, approvalChannel *string
		ceiling                              *string
		decided                              *time.Time
		args                                 []byte
		duration                             int64
	)
	err := row.Scan(
		&s.Tenant, &s.Seq, &s.InvocationID, &phase, &s.Time, &channel, &s.Command, &risk, &s.SideEffects,
		&s.Idempotent, &s.Reversible, &s.Subject, &s.UserID, &actor, &s.AgentID, &s.Model, &s.ModelVersion,
		&s.ConversationID, &s.MCPSessionID, &challenge, &approver, &approvalChannel,
		&decided, &outcome, &s.Stage, &s.Code, &s.Message, &args, &s.ArgumentsDigest,
		&s.ResultDigest, &duration, &s.TraceID, &s.ManifestDigest, &s.PrevHash, &s.Hash,
		&ceiling,
	)
	if err != nil {
		return s, err
	}
	s.Phase, s.Channel, s.Risk, s.ActorKind, s.Outcome = audit.Phase(phase), audit.Channel(channel), audit.Risk(risk), audit.ActorKind(actor), audit.Outcome(outcome)
	s.Time = s.Time.UTC()
	if len(s.SideEffects) == 0 {
		s.SideEffects = nil
	}
	if len(args) > 0 {
		s.Arguments = args
	}
	s.Duration = time.Duration(duration)
	if approver != nil {
		a := &audit.Approval{Approver: *approver}
		if challenge != nil {
			a.ChallengeID = *challenge
		}
		if approvalChannel != nil {
			a.Channel = *approvalChannel
		}
		if decided != nil {
			a.DecidedAt = decided.UTC()
		}
		if ceiling != nil {
			a.TrustCeiling = *ceiling
		}
		s.Approval = a
	}
	return s, nil
}

// storeError is what the Store returns for database failures. Its message names the operation
// and a generic cause only, never driver text (which may quote SQL, data or addresses); Unwrap
// reaches the audit sentinel, the pg sentinel and the driver error, for errors.Is/As and logs.
type storeError struct {
	op    string
	cause string
	errs  []error
}

func (e *storeError) Error() string   { return e.op + ": " + e.cause }
func (e *storeError) Unwrap() []error { return e.errs }

// mapErr classifies a database error and attaches the matching audit sentinel. Errors that are
// already audit errors pass through.
func mapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, audit.ErrInvalid) || errors.Is(err, audit.ErrNotFound) || errors.Is(err, audit.ErrClosed) {
		return err
	}
	if _, ok := errors.AsType[*storeError](err); ok {
		return err
	}
	werr := pg.Wrap(op, err)
	kind := pg.Classify(err)
	if pe, ok := errors.AsType[*pg.Error](werr); ok {
		kind = pe.Kind
	}
	switch kind {
	case pg.KindUnavailable:
		return &storeError{op: op, cause: "store unavailable", errs: []error{audit.ErrUnavailable, werr}}
	case pg.KindUniqueViolation, pg.KindSerializationFailure, pg.KindDeadlockDetected:
		return &storeError{op: op, cause: "concurrent write conflict", errs: []error{audit.ErrConflict, werr}}
	case pg.KindCanceled:
		return &storeError{op: op, cause: "canceled", errs: []error{werr}}
	default:
		return &storeError{op: op, cause: "database error", errs: []error{werr}}
	}
}

package audit

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/mandate-dev/mandate/internal/failure"
)

// reconcileBatch is how many pending intents one round of Reconcile handles.
const reconcileBatch = 256

// Reconcile appends an outcome row with Outcome unknown, Stage "audit" and Code
// "audit.outcome_unknown" for every intent older than olderThan that has no outcome row, and
// returns how many such rows it appended. The rows go through the Writer like any other, so
// they are chained, visible to queries and watchers, and idempotent: if the real outcome
// arrives first, it wins and nothing is appended for that intent; running Reconcile twice
// appends nothing the second time.
//
// olderThan must exceed the longest a command may run plus the time the executor spends
// retrying its outcome append: an outcome that arrives after reconciliation is answered with
// the unknown row already stored.
func (w *Writer) Reconcile(ctx context.Context, olderThan time.Duration) (int, error) {
	if olderThan < 0 {
		return 0, invalid("older_than", "is negative")
	}
	appended := 0
	seen := map[Key]bool{}
	for {
		now := w.opts.Now()
		intents, err := w.store.PendingIntents(ctx, now.Add(-olderThan), reconcileBatch)
		if err != nil {
			return appended, fmt.Errorf("audit: reconcile: %w", err)
		}
		if len(intents) == 0 {
			return appended, nil
		}
		recs := make([]Record, 0, len(intents))
		for i := range intents {
			k := intents[i].Key()
			if seen[k] {
				// The store handed back an intent whose outcome we already appended: its
				// pending state is not clearing, and looping would never end.
				return appended, fmt.Errorf("audit: reconcile: intent %s of tenant %q is still pending after its outcome was appended", k.InvocationID, k.Tenant)
			}
			seen[k] = true
			recs = append(recs, unknownOutcome(&intents[i], olderThan, now))
		}
		stored, err := w.Append(ctx, recs...)
		if err != nil {
			return appended, fmt.Errorf("audit: reconcile: %w", err)
		}
		for i := range stored {
			s := &stored[i]
			if s.Outcome != OutcomeUnknown || s.Code != failure.CodeAuditOutcomeUnknown {
				continue // the real outcome got there first
			}
			appended++
			w.opts.Logger.WarnContext(ctx, "audit: intent without outcome recorded as unknown",
				"tenant", s.Tenant, "invocation_id", s.InvocationID, "trace_id", s.TraceID,
				"command", s.Command, "seq", s.Seq)
		}
		if len(intents) < reconcileBatch {
			return appended, nil
		}
	}
}

func unknownOutcome(in *Stored, olderThan time.Duration, now time.Time) Record {
	r := in.Record.Clone()
	r.Phase = PhaseOutcome
	r.Time = now
	r.Outcome = OutcomeUnknown
	r.Stage = StageAudit
	r.Code = failure.CodeAuditOutcomeUnknown
	r.Message = fmt.Sprintf("no outcome was recorded within %s of the intent; whether the command ran is unknown", olderThan)
	r.Arguments = nil // they are on the intent row; the digest below still ties the two
	r.ResultDigest = ""
	r.Duration = 0
	return r
}

// Defaults of the [Reconciler]. DefaultReconcileAfter is well above the
// executor's receipt reconciler's (executor.DefaultReconcileAfter, 2m, every
// 30s): an intent an executor can still settle from its backend's receipt
// is not recorded unknown first.
const (
	DefaultReconcileAfter    = 15 * time.Minute
	DefaultReconcileInterval = time.Minute
)

// ReconcilerOptions tunes a [Reconciler].
type ReconcilerOptions struct {
	// Interval between runs. Default DefaultReconcileInterval.
	Interval time.Duration
	// OlderThan is the age after which an intent without outcome is reconciled. Default
	// DefaultReconcileAfter.
	OlderThan time.Duration
	// Logger receives failed runs. Default slog.Default().
	Logger *slog.Logger
}

// Reconciler runs [Writer.Reconcile] periodically. Several replicas may run one each: the
// appends are idempotent, so two reconcilers never record an invocation twice.
type Reconciler struct {
	w    *Writer
	opts ReconcilerOptions
}

// NewReconciler returns a Reconciler that appends through w.
func NewReconciler(w *Writer, opts ReconcilerOptions) *Reconciler {
	if opts.Interval <= 0 {
		opts.Interval = DefaultReconcileInterval
	}
	if opts.OlderThan <= 0 {
		opts.OlderThan = DefaultReconcileAfter
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Reconciler{w: w, opts: opts}
}

// Run reconciles at once and then every Interval until ctx ends; it returns nil then. A failed
// run (e.g. the store is unavailable) is logged and retried at the next tick.
func (r *Reconciler) Run(ctx context.Context) error {
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	for {
		if n, err := r.w.Reconcile(ctx, r.opts.OlderThan); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.opts.Logger.WarnContext(ctx, "audit: reconciliation failed; retrying at the next interval", "error", err, "reconciled", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

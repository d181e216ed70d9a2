package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// WriterOptions tunes a [Writer]. Zero fields take the documented defaults.
type WriterOptions struct {
	// MaxBatch caps the records one transaction commits. A single Append with more records is
	// committed on its own, whole. Default 512.
	MaxBatch int
	// MaxWait is how long the flusher, having found some appends queued, waits for more before
	// committing. Default 0: commit whatever is queued as soon as the previous commit is done,
	// which already batches everything that arrived during that commit.
	MaxWait time.Duration
	// MaxInFlight is how many batches may be committing at once. While one batch waits for
	// its commit (fsync), the next is collected and sent, so the store can overlap the two;
	// stores keep per-tenant commit order themselves. Default 2; 1 makes flushing strictly
	// serial.
	MaxInFlight int
	// Unbatched disables group commit: every Append runs its own transaction on the caller's
	// goroutine. For benchmarks and comparison; production wants batching.
	Unbatched bool
	// Attempts is how many times a batch is tried when the store is unavailable or a concurrent
	// writer got in the way (appends are idempotent, so trying again is safe). Default 3.
	Attempts int
	// RetryBackoff is the pause before the second attempt; it doubles after each. Default 20ms.
	RetryBackoff time.Duration
	// FlushTimeout bounds one batched commit attempt, which runs on behalf of many callers and
	// so cannot use any single caller's context. Default 15s.
	FlushTimeout time.Duration
	// Logger receives failures. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock for records without a Time and for reconciliation. Default time.Now.
	Now func() time.Time
}

func (o WriterOptions) withDefaults() WriterOptions {
	if o.MaxBatch <= 0 {
		o.MaxBatch = 512
	}
	if o.MaxWait < 0 {
		o.MaxWait = 0
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 2
	}
	if o.Attempts <= 0 {
		o.Attempts = 3
	}
	if o.RetryBackoff <= 0 {
		o.RetryBackoff = 20 * time.Millisecond
	}
	if o.FlushTimeout <= 0 {
		o.FlushTimeout = 15 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Writer appends records to a Store. Concurrent Appends are committed together (group commit):
// one flusher goroutine takes whatever is queued, up to MaxBatch records, hands it to the store
// as one transaction (Store.AppendBatch) and answers every caller once it committed; up to
// MaxInFlight such batches may be committing at once. An Append returns only after its records
// are committed. Writer is safe for concurrent use; Close it when done.
type Writer struct {
	store Store
	opts  WriterOptions

	reqs    chan *request
	closing chan struct{}
	done    chan struct{} // closed when the flusher has exited

	closeOnce sync.Once
	mu        sync.RWMutex // guards closed against in-flight unbatched appends
	closed    bool
	inflight  sync.WaitGroup

	appends, records, batches, failures atomic.Uint64
}

type request struct {
	recs []Record
	res  []Stored
	err  error
	done chan struct{}
}

// NewWriter returns a Writer on st and, unless opts.Unbatched, starts its flusher.
func NewWriter(st Store, opts WriterOptions) *Writer {
	w := &Writer{
		store:   st,
		opts:    opts.withDefaults(),
		reqs:    make(chan *request), // unbuffered: a request is either taken by the flusher or refused at Close
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	if w.opts.Unbatched {
		close(w.done)
	} else {
		go w.run()
	}
	return w
}

// Store returns the store the Writer appends to.
func (w *Writer) Store() Store { return w.store }

// Append normalizes and validates recs, appends them atomically and returns the stored rows in
// the same order. A record whose (Tenant, InvocationID, Phase) is already stored is not written
// again: its stored row is returned. Errors: a *ValidationError (ErrInvalid) before anything is
// queued; ErrUnavailable when the store could not be reached (retry later, with the same
// records); ErrClosed after Close. When ctx ends while the commit is under way, Append returns
// ctx's error and the records may or may not be committed; retrying is safe.
func (w *Writer) Append(ctx context.Context, recs ...Record) ([]Stored, error) {
	if len(recs) == 0 {
		return nil, nil
	}
	now := w.opts.Now()
	norm := make([]Record, len(recs))
	for i := range recs {
		norm[i] = recs[i].Normalize(now)
		if err := norm[i].Validate(); err != nil {
			if len(recs) > 1 {
				return nil, fmt.Errorf("audit: record %d of %d: %w", i+1, len(recs), err)
			}
			return nil, err
		}
	}
	w.appends.Add(1)
	if w.opts.Unbatched {
		return w.appendDirect(ctx, norm)
	}
	select {
	case <-w.closing:
		return nil, ErrClosed
	default:
	}
	req := &request{recs: norm, done: make(chan struct{})}
	select {
	case w.reqs <- req:
	case <-w.closing:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case <-req.done:
		return req.res, req.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (w *Writer) appendDirect(ctx context.Context, recs []Record) ([]Stored, error) {
	w.mu.RLock()
	if w.closed {
		w.mu.RUnlock()
		return nil, ErrClosed
	}
	w.inflight.Add(1)
	w.mu.RUnlock()
	defer w.inflight.Done()
	w.batches.Add(1)
	w.records.Add(uint64(len(recs)))
	res, err := w.appendWithRetry(ctx, recs)
	if err != nil {
		w.failures.Add(1)
	}
	return res, err
}

// Close stops accepting appends (they fail with ErrClosed), commits what is already queued and
// waits for it. It is idempotent.
func (w *Writer) Close() error {
	w.closeOnce.Do(func() {
		w.mu.Lock()
		w.closed = true
		w.mu.Unlock()
		close(w.closing)
	})
	<-w.done
	w.inflight.Wait()
	return nil
}

// WriterStats are counters of a Writer since it was created.
type WriterStats struct {
	// Appends counts accepted Append calls, Records the records they carried.
	Appends, Records uint64
	// Batches counts store transactions attempted (one per flush; per Append when unbatched).
	Batches uint64
	// Failures counts batches that failed after all attempts.
	Failures uint64
}

// Stats returns the Writer's counters.
func (w *Writer) Stats() WriterStats {
	return WriterStats{
		Appends:  w.appends.Load(),
		Records:  w.records.Load(),
		Batches:  w.batches.Load(),
		Failures: w.failures.Load(),
	}
}

func (w *Writer) run() {
	defer close(w.done)
	var flushing sync.WaitGroup
	defer flushing.Wait()
	slots := make(chan struct{}, w.opts.MaxInFlight)
	dispatch := func(batch []*request) {
		flushing.Go(func() {
			defer func() { <-slots }()
			w.flush(batch)
		})
	}
	for {
		select {
		case req := <-w.reqs:
			// Wait for a free slot before collecting: whatever queues meanwhile joins this
			// batch.
			slots <- struct{}{}
			dispatch(w.collect(req))
		case <-w.closing:
			// Appends racing with Close either got in before this drain or see closing.
			for {
				batch := w.collect(nil)
				if len(batch) == 0 {
					return
				}
				slots <- struct{}{}
				dispatch(batch)
			}
		}
	}
}

// collect gathers queued requests behind first (which may be nil) up to MaxBatch records.
func (w *Writer) collect(first *request) []*request {
	var batch []*request
	n := 0
	if first != nil {
		batch = append(batch, first)
		n = len(first.recs)
	}
	var deadline <-chan time.Time
	if w.opts.MaxWait > 0 && first != nil {
		t := time.NewTimer(w.opts.MaxWait)
		defer t.Stop()
		deadline = t.C
	}
	for n < w.opts.MaxBatch {
		if deadline == nil {
			select {
			case r := <-w.reqs:
				batch = append(batch, r)
				n += len(r.recs)
				continue
			default:
				return batch
			}
		}
		select {
		case r := <-w.reqs:
			batch = append(batch, r)
			n += len(r.recs)
		case <-deadline:
			deadline = nil
		case <-w.closing:
			deadline = nil
		}
	}
	return batch
}

func (w *Writer) flush(batch []*request) {
	if len(batch) == 0 {
		return
	}
	var all []Record
	if len(batch) == 1 {
		all = batch[0].recs
	} else {
		n := 0
		for _, r := range batch {
			n += len(r.recs)
		}
		all = make([]Record, 0, n)
		for _, r := range batch {
			all = append(all, r.recs...)
		}
	}
	w.batches.Add(1)
	w.records.Add(uint64(len(all)))
	ctx, cancel := context.WithTimeout(context.Background(), w.opts.FlushTimeout*time.Duration(w.opts.Attempts))
	defer cancel()
	res, err := w.appendWithRetry(ctx, all)
	if err != nil && len(batch) > 1 && !Retryable(err) {
		// Something in one request made the whole transaction fail (every record passed
		// Validate, so this is unexpected): commit the requests one by one so that only the
		// culprit fails.
		w.opts.Logger.Error("audit: batched append failed; retrying its appends one by one", "error", err, "appends", len(batch))
		for _, r := range batch {
			w.flush([]*request{r})
		}
		return
	}
	if err != nil {
		w.failures.Add(1)
		w.opts.Logger.Warn("audit: append failed", "error", err, "records", len(all), "retryable", Retryable(err))
	}
	off := 0
	for _, r := range batch {
		if err != nil {
			r.err = err
		} else {
			r.res = res[off : off+len(r.recs) : off+len(r.recs)]
		}
		off += len(r.recs)
		close(r.done)
	}
}

func (w *Writer) appendWithRetry(ctx context.Context, recs []Record) ([]Stored, error) {
	backoff := w.opts.RetryBackoff
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, w.opts.FlushTimeout)
		res, err := w.store.AppendBatch(actx, recs)
		if err != nil && errors.Is(actx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			// Our own per-attempt bound expired, not the caller's: the store did not answer in
			// time, which for the caller is the store being unavailable.
			err = fmt.Errorf("%w: no answer within %s: %w", ErrUnavailable, w.opts.FlushTimeout, err)
		}
		cancel()
		if err == nil {
			if len(res) != len(recs) {
				return nil, fmt.Errorf("audit: store returned %d rows for %d records", len(res), len(recs))
			}
			return res, nil
		}
		if attempt >= w.opts.Attempts || !Retryable(err) || ctx.Err() != nil {
			return nil, err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, errors.Join(err, ctx.Err())
		case <-t.C:
		}
		backoff *= 2
	}
}

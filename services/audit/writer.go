package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
)

// WriterOptions tunes a [Writer]. Zero fields take the documented defaults.
type WriterOptions struct {
	// MaxBatch caps the records one transaction commits. A single Append with more records is
	// committed on its own, whole. Default 512.
	MaxBatch int
	// MaxWait bounds how long the flusher waits for a batch to fill up. It waits only while
	// the batch is clearly smaller than the previous one — under load, the callers answered by
	// the previous commit are about to come back — and never when appends arrive one at a
	// time, so a lone writer pays nothing. Default 1ms; negative disables waiting.
	MaxWait time.Duration
	// MaxInFlight is how many batches may be committing at once. Default 1: the next batch
	// collects everything that arrives during a commit, which gives the largest batches. With
	// 2 or more, batches of different tenants commit in parallel, and a batch of a tenant that
	// is still committing is handed to the store, which keeps each tenant's commits in order
	// itself.
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
	// MeterProvider records MetricRecords and MetricBatchSize. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

func (o WriterOptions) withDefaults() WriterOptions {
	if o.MaxBatch <= 0 {
		o.MaxBatch = 512
	}
	switch {
	case o.MaxWait == 0:
		o.MaxWait = time.Millisecond
	case o.MaxWait < 0:
		o.MaxWait = 0
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 1
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
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	return o
}

// Writer appends records to a Store with group commit: one flusher goroutine takes whatever
// appends are queued (up to MaxBatch records, waiting up to MaxWait for a batch to fill), hands
// them to the store as one transaction (Store.AppendBatch) and, once it committed, answers every
// caller; appends that arrive during a commit form the next batch. An Append returns only after
// its records are committed. Writer is safe for concurrent use; Close it when done.
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
	metrics                             *writerMetrics

	lastBatch int // records in the previous batch; touched by the flusher goroutine only
}

// request is one Append on its way through the flusher. Requests are pooled: every governed
// call appends twice, and a request with its channel is otherwise three allocations each time.
type request struct {
	recs []Record
	res  []Stored
	err  error
	// done receives one value when res or err is set. It is buffered so that the flusher never
	// waits for a caller that has left (its context ended); such a request is not reused.
	done chan struct{}
	one  [1]Record // holds recs of a single-record Append
}

var requests = sync.Pool{New: func() any { return &request{done: make(chan struct{}, 1)} }}

// newRequest returns a pooled request with room for n records.
func newRequest(n int) *request {
	r := requests.Get().(*request)
	if n == 1 {
		r.recs = r.one[:]
	} else {
		r.recs = make([]Record, n)
	}
	return r
}

// release returns r to the pool. Only the caller that received r's answer (or never queued r)
// may release it: the flusher no longer holds it then.
func (r *request) release() {
	r.recs, r.res, r.err, r.one = nil, nil, nil, [1]Record{}
	requests.Put(r)
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
	m, err := newWriterMetrics(w.opts.MeterProvider)
	if err != nil {
		w.opts.Logger.Error("audit: writer metrics unavailable", "error", err)
		m, _ = newWriterMetrics(metricnoop.NewMeterProvider())
	}
	w.metrics = m
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
	req := newRequest(len(recs))
	for i := range recs {
		req.recs[i] = recs[i].Normalize(now)
		if err := req.recs[i].Validate(); err != nil {
			req.release()
			if len(recs) > 1 {
				return nil, fmt.Errorf("audit: record %d of %d: %w", i+1, len(recs), err)
			}
			return nil, err
		}
	}
	w.appends.Add(1)
	if w.opts.Unbatched {
		defer req.release()
		return w.appendDirect(ctx, req.recs)
	}
	select {
	case <-w.closing:
		req.release()
		return nil, ErrClosed
	default:
	}
	select {
	case w.reqs <- req:
	case <-w.closing:
		req.release()
		return nil, ErrClosed
	case <-ctx.Done():
		req.release()
		return nil, ctx.Err()
	}
	select {
	case <-req.done:
		res, err := req.res, req.err
		req.release()
		return res, err
	case <-ctx.Done():
		return nil, ctx.Err() // the flusher still holds req: it is left to the garbage collector
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
	w.metrics.transaction(len(recs), err)
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
	// MaxInFlight flushers take the batches, rather than a goroutine per batch: dispatching one
	// then allocates nothing. A batch is only sent with a slot taken, so a flusher is free (or
	// about to be) to receive it.
	batches := make(chan []*request)
	defer close(batches) // runs before flushing.Wait: the flushers end once they are done
	// Flushed batches come back here to be filled again, so that collecting allocates nothing
	// once a Writer has warmed up.
	spare := make(chan []*request, w.opts.MaxInFlight)
	for range w.opts.MaxInFlight {
		flushing.Go(func() {
			for batch := range batches {
				w.flush(batch)
				clear(batch) // the requests go back to their callers
				select {
				case spare <- batch[:0]:
				default:
				}
				<-slots
			}
		})
	}
	dispatch := func(batch []*request) { batches <- batch }
	reuse := func() []*request {
		select {
		case b := <-spare:
			return b
		default:
			return nil
		}
	}
	for {
		select {
		case req := <-w.reqs:
			// Wait for a free slot before collecting: whatever queues meanwhile joins this
			// batch.
			slots <- struct{}{}
			dispatch(w.collect(req, reuse()))
		case <-w.closing:
			// Appends racing with Close either got in before this drain or see closing.
			for {
				batch := w.collect(nil, reuse())
				if len(batch) == 0 {
					return
				}
				slots <- struct{}{}
				dispatch(batch)
			}
		}
	}
}

// collect gathers the requests queued behind first (nil when draining at Close), up to
// MaxBatch records. If that is well below the previous batch, it waits up to MaxWait for the
// rest to arrive. batch is an empty slice to fill, or nil.
func (w *Writer) collect(first *request, batch []*request) []*request {
	n := 0
	add := func(r *request) {
		batch = append(batch, r)
		n += len(r.recs)
	}
	drain := func() {
		for n < w.opts.MaxBatch {
			select {
			case r := <-w.reqs:
				add(r)
			default:
				return
			}
		}
	}
	if first != nil {
		add(first)
	}
	drain()
	if first == nil {
		return batch
	}
	if target := min(w.lastBatch, w.opts.MaxBatch); w.opts.MaxWait > 0 && n < target*3/4 {
		t := time.NewTimer(w.opts.MaxWait)
		defer t.Stop()
	wait:
		for n < target {
			select {
			case r := <-w.reqs:
				add(r)
				drain()
			case <-t.C:
				break wait
			case <-w.closing:
				break wait
			}
		}
	}
	w.lastBatch = n
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
	// A batch serves many callers, so no caller's context bounds it: each attempt is bounded by
	// FlushTimeout and the attempts by Attempts.
	res, err := w.appendWithRetry(context.Background(), all)
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
	w.metrics.transaction(len(all), err)
	off := 0
	for _, r := range batch {
		if err != nil {
			r.err = err
		} else {
			r.res = res[off : off+len(r.recs) : off+len(r.recs)]
		}
		off += len(r.recs)
		r.done <- struct{}{}
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

package audit_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/memory"
)

// fakeStore wraps the memory store to observe and disturb AppendBatch.
type fakeStore struct {
	*memory.Store
	delay     time.Duration
	failNext  atomic.Int32 // fail this many AppendBatch calls with failErr
	failErr   error
	poison    string // any batch holding this invocation id fails with a non-retryable error
	hang      chan struct{}
	calls     atomic.Int32
	maxBatch  atomic.Int32
	committed sync.Map // invocation id → true once its batch returned
}

func newFake(t *testing.T) *fakeStore {
	m := memory.New(memory.Options{})
	t.Cleanup(m.Close)
	return &fakeStore{Store: m, failErr: audit.ErrUnavailable}
}

func (f *fakeStore) AppendBatch(ctx context.Context, recs []audit.Record) ([]audit.Stored, error) {
	f.calls.Add(1)
	for {
		cur := f.maxBatch.Load()
		if int32(len(recs)) <= cur || f.maxBatch.CompareAndSwap(cur, int32(len(recs))) {
			break
		}
	}
	if f.hang != nil {
		select {
		case <-f.hang:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	time.Sleep(f.delay)
	if f.failNext.Add(-1) >= 0 {
		return nil, fmt.Errorf("fake: %w", f.failErr)
	}
	for i := range recs {
		if f.poison != "" && recs[i].InvocationID == f.poison {
			return nil, errors.New("fake: constraint violated")
		}
	}
	out, err := f.Store.AppendBatch(ctx, recs)
	if err == nil {
		for i := range recs {
			f.committed.Store(recs[i].InvocationID, true)
		}
	}
	return out, err
}

var quiet = slog.New(slog.DiscardHandler)

func newWriter(t *testing.T, st audit.Store, opts audit.WriterOptions) *audit.Writer {
	t.Helper()
	opts.Logger = quiet
	w := audit.NewWriter(st, opts)
	t.Cleanup(func() { _ = w.Close() })
	return w
}

func TestWriterGroupCommit(t *testing.T) {
	tests := []struct {
		name        string
		opts        audit.WriterOptions
		maxCalls    int32 // at most this many store transactions for 64 appends
		maxBatchCap int32
	}{
		{"batched", audit.WriterOptions{}, 16, 512},
		{"batched, two in flight", audit.WriterOptions{MaxInFlight: 2}, 24, 512},
		{"max batch 8", audit.WriterOptions{MaxBatch: 8}, 64, 8},
		{"unbatched", audit.WriterOptions{Unbatched: true}, 64, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := newFake(t)
			st.delay = 5 * time.Millisecond
			w := newWriter(t, st, tt.opts)
			var wg sync.WaitGroup
			for i := range 64 {
				wg.Go(func() {
					inv := fmt.Sprintf("inv-%d", i)
					out, err := w.Append(context.Background(), rec(inv, audit.PhaseIntent))
					if err != nil {
						t.Errorf("append %d: %v", i, err)
						return
					}
					// Acknowledged only after the commit that holds it.
					if _, ok := st.committed.Load(inv); !ok || out[0].InvocationID != inv {
						t.Errorf("append %d returned before its commit (or with another row)", i)
					}
				})
			}
			wg.Wait()
			calls := st.calls.Load()
			if tt.opts.Unbatched && calls != 64 {
				t.Fatalf("unbatched: %d store calls, want 64", calls)
			}
			if calls > tt.maxCalls {
				t.Fatalf("64 concurrent appends took %d transactions, want at most %d", calls, tt.maxCalls)
			}
			if mb := st.maxBatch.Load(); mb > tt.maxBatchCap {
				t.Fatalf("a batch held %d records, cap %d", mb, tt.maxBatchCap)
			}
			s := w.Stats()
			if s.Appends != 64 || s.Records != 64 || s.Failures != 0 || s.Batches != uint64(calls) {
				t.Fatalf("stats = %+v (store calls %d)", s, calls)
			}
			rep, err := st.Verify(context.Background(), "acme")
			if err != nil || !rep.OK || rep.Rows != 64 {
				t.Fatalf("verify: %+v %v", rep, err)
			}
		})
	}
}

func TestWriterLoneAppendDoesNotWait(t *testing.T) {
	st := newFake(t)
	w := newWriter(t, st, audit.WriterOptions{MaxWait: time.Second})
	for i := range 5 {
		start := time.Now()
		if _, err := w.Append(context.Background(), rec(fmt.Sprint(i), audit.PhaseIntent)); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Fatalf("a lone append took %v: it waited for a batch to fill", d)
		}
	}
}

func TestWriterRetries(t *testing.T) {
	tests := []struct {
		name      string
		failures  int32
		failErr   error
		attempts  int
		wantErr   error
		wantCalls int32
	}{
		{"unavailable twice, then up", 2, audit.ErrUnavailable, 3, nil, 3},
		{"unavailable longer than the attempts", 5, audit.ErrUnavailable, 3, audit.ErrUnavailable, 3},
		{"conflict is retried", 1, audit.ErrConflict, 3, nil, 2},
		{"invalid is not retried", 1, audit.ErrInvalid, 3, audit.ErrInvalid, 1},
	}
	for _, tt := range tests {
		for _, unbatched := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/unbatched=%v", tt.name, unbatched), func(t *testing.T) {
				st := newFake(t)
				st.failErr = tt.failErr
				st.failNext.Store(tt.failures)
				w := newWriter(t, st, audit.WriterOptions{Attempts: tt.attempts, RetryBackoff: time.Millisecond, Unbatched: unbatched})
				_, err := w.Append(context.Background(), rec("inv", audit.PhaseIntent))
				if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if got := st.calls.Load(); got != tt.wantCalls {
					t.Fatalf("store calls = %d, want %d", got, tt.wantCalls)
				}
				rep, _ := st.Verify(context.Background(), "acme")
				if want := int64(0); tt.wantErr == nil {
					want = 1
					if rep.Rows != want {
						t.Fatalf("rows = %d, want %d", rep.Rows, want)
					}
				} else if rep.Rows != want {
					t.Fatalf("rows = %d after a failed append", rep.Rows)
				}
			})
		}
	}
}

// A record that makes its batch fail for a non-retryable reason fails only its own append.
func TestWriterIsolatesPoisonedAppend(t *testing.T) {
	st := newFake(t)
	st.poison = "poison"
	st.delay = 5 * time.Millisecond
	w := newWriter(t, st, audit.WriterOptions{})
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range 16 {
		wg.Go(func() {
			inv := fmt.Sprint(i)
			if i == 7 {
				inv = "poison"
			}
			_, errs[i] = w.Append(context.Background(), rec(inv, audit.PhaseIntent))
		})
	}
	wg.Wait()
	for i, err := range errs {
		if (i == 7) != (err != nil) {
			t.Fatalf("append %d: err = %v", i, err)
		}
	}
	rep, _ := st.Verify(context.Background(), "acme")
	if rep.Rows != 15 {
		t.Fatalf("rows = %d, want 15", rep.Rows)
	}
}

func TestWriterStoreHangsIsUnavailable(t *testing.T) {
	st := newFake(t)
	st.hang = make(chan struct{})
	defer close(st.hang)
	w := newWriter(t, st, audit.WriterOptions{FlushTimeout: 50 * time.Millisecond, Attempts: 1})
	_, err := w.Append(context.Background(), rec("inv", audit.PhaseIntent))
	if !errors.Is(err, audit.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable after the flush timeout", err)
	}
}

func TestWriterCallerContext(t *testing.T) {
	st := newFake(t)
	st.hang = make(chan struct{})
	w := newWriter(t, st, audit.WriterOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := w.Append(ctx, rec("inv", audit.PhaseIntent)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the caller's deadline", err)
	}
	close(st.hang) // the batch still commits: the caller may retry and get the stored row
	out, err := w.Append(context.Background(), rec("inv", audit.PhaseIntent))
	if err != nil || out[0].Seq != 1 {
		t.Fatalf("retry: %+v, %v", out, err)
	}
}

func TestWriterCloseDrains(t *testing.T) {
	st := newFake(t)
	st.delay = 20 * time.Millisecond
	w := audit.NewWriter(st, audit.WriterOptions{Logger: quiet})
	var wg sync.WaitGroup
	var ok, closed atomic.Int32
	for i := range 32 {
		wg.Go(func() {
			_, err := w.Append(context.Background(), rec(fmt.Sprint(i), audit.PhaseIntent))
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, audit.ErrClosed):
				closed.Add(1)
			default:
				t.Errorf("append: %v", err)
			}
		})
	}
	time.Sleep(5 * time.Millisecond) // let some appends queue behind the first commit
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// Close returned: every accepted append has been committed and answered.
	rep, _ := st.Verify(context.Background(), "acme")
	wg.Wait()
	if rep.Rows != int64(ok.Load()) || ok.Load()+closed.Load() != 32 {
		t.Fatalf("rows %d, ok %d, closed %d", rep.Rows, ok.Load(), closed.Load())
	}
	if _, err := w.Append(context.Background(), rec("late", audit.PhaseIntent)); !errors.Is(err, audit.ErrClosed) {
		t.Fatalf("append after Close: %v", err)
	}
}

func TestWriterValidatesBeforeQueueing(t *testing.T) {
	st := newFake(t)
	w := newWriter(t, st, audit.WriterOptions{})
	bad := rec("bad", audit.PhaseIntent)
	bad.Tenant = ""
	_, err := w.Append(context.Background(), rec("good", audit.PhaseIntent), bad)
	var ve *audit.ValidationError
	if !errors.As(err, &ve) || ve.Field != "tenant" || !errors.Is(err, audit.ErrInvalid) {
		t.Fatalf("err = %v", err)
	}
	if st.calls.Load() != 0 {
		t.Fatal("an invalid append reached the store")
	}
	if out, err := w.Append(context.Background()); out != nil || err != nil {
		t.Fatalf("empty append: %v, %v", out, err)
	}
}

// TestWriterMetrics: every store transaction adds its records to mandate.audit.records by result
// and its size to mandate.audit.batch.size, batched or not.
func TestWriterMetrics(t *testing.T) {
	for _, unbatched := range []bool{false, true} {
		t.Run(fmt.Sprintf("unbatched=%v", unbatched), func(t *testing.T) {
			reader := sdkmetric.NewManualReader()
			st := newFake(t)
			st.delay = time.Millisecond
			w := newWriter(t, st, audit.WriterOptions{Unbatched: unbatched, Attempts: 1,
				MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
			var wg sync.WaitGroup
			for i := range 32 {
				wg.Go(func() {
					if _, err := w.Append(context.Background(), rec(fmt.Sprintf("inv-%d", i), audit.PhaseIntent)); err != nil {
						t.Errorf("append %d: %v", i, err)
					}
				})
			}
			wg.Wait()
			st.failNext.Store(1)
			if _, err := w.Append(context.Background(), rec("lost", audit.PhaseIntent), rec("lost", audit.PhaseOutcome)); !errors.Is(err, audit.ErrUnavailable) {
				t.Fatalf("append with the store down: %v", err)
			}

			var rm metricdata.ResourceMetrics
			if err := reader.Collect(context.Background(), &rm); err != nil {
				t.Fatal(err)
			}
			records := map[string]int64{}
			batches := map[string]metricdata.HistogramDataPoint[int64]{}
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					switch m.Name {
					case audit.MetricRecords:
						for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
							v, _ := dp.Attributes.Value("result")
							records[v.AsString()] += dp.Value
						}
					case audit.MetricBatchSize:
						for _, dp := range m.Data.(metricdata.Histogram[int64]).DataPoints {
							v, _ := dp.Attributes.Value("result")
							batches[v.AsString()] = dp
						}
					}
				}
			}
			if records[audit.ResultCommitted] != 32 || records[audit.ResultFailed] != 2 || len(records) != 2 {
				t.Fatalf("records %v, want 32 committed and 2 failed", records)
			}
			ok, failed := batches[audit.ResultCommitted], batches[audit.ResultFailed]
			// One observation per store transaction: the failed one, and the committed ones
			// the store saw (one per append when unbatched, fewer when batched).
			if int64(ok.Count)+int64(failed.Count) != int64(st.calls.Load()) || ok.Sum != 32 || failed.Count != 1 || failed.Sum != 2 {
				t.Fatalf("batch sizes: committed %d transactions of %d records, failed %d of %d; store calls %d",
					ok.Count, ok.Sum, failed.Count, failed.Sum, st.calls.Load())
			}
			if unbatched && ok.Count != 32 {
				t.Fatalf("unbatched: %d committed transactions, want 32", ok.Count)
			}
		})
	}
}

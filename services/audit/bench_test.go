package audit_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/audittest"
	"github.com/mandate-dev/mandate/services/audit/memory"
)

// benchRecords returns n records as a governed call writes them: an intent, then its
// invocation's outcome, arguments already compact (the executor encodes them).
func benchRecords(n int) []audit.Record {
	recs := make([]audit.Record, n)
	for i := range recs {
		phase := audit.PhaseIntent
		if i%2 == 1 {
			phase = audit.PhaseOutcome
		}
		recs[i] = audittest.Rec("acme", "inv-"+strconv.Itoa(i/2), phase).Normalize(audittest.Base)
	}
	return recs
}

// BenchmarkWriterAppend measures one Append of one record through the Writer's group commit
// into the memory store (bounded, as mandate dev runs it, so the store is in its steady state),
// at 1 and 16 concurrent writers. allocs/op is the number to watch: it is what every governed
// call pays twice in mandate dev.
//
//	go test -run '^$' -bench BenchmarkWriterAppend -benchmem ./services/audit/
func BenchmarkWriterAppend(b *testing.B) {
	for _, writers := range []int{1, 16} {
		b.Run(fmt.Sprintf("memory/writers=%d", writers), func(b *testing.B) {
			st := memory.New(memory.Options{MaxRows: 10_000})
			defer st.Close()
			w := audit.NewWriter(st, audit.WriterOptions{Logger: quiet})
			defer func() { _ = w.Close() }()
			recs := benchRecords(b.N)
			ctx := context.Background()
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ReportAllocs()
			b.ResetTimer()
			for range writers {
				wg.Go(func() {
					for {
						i := next.Add(1) - 1
						if i >= int64(b.N) {
							return
						}
						if _, err := w.Append(ctx, recs[i]); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}

// BenchmarkComputeHash measures hashing one realistic outcome row.
func BenchmarkComputeHash(b *testing.B) {
	r := audittest.Rec("acme", "inv-1", audit.PhaseOutcome).Normalize(audittest.Base)
	prev := audit.GenesisHash()
	b.ReportAllocs()
	for b.Loop() {
		audit.ComputeHash(prev, 1, &r)
	}
}

// BenchmarkNormalizeValidate measures what Append does to a record before queueing it.
func BenchmarkNormalizeValidate(b *testing.B) {
	r := audittest.Rec("acme", "inv-1", audit.PhaseOutcome).Normalize(audittest.Base)
	b.ReportAllocs()
	for b.Loop() {
		n := r.Normalize(audittest.Base)
		if err := n.Validate(); err != nil {
			b.Fatal(err)
		}
	}
}

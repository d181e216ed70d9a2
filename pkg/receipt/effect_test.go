package receipt_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/pkg/receipt"
)

const buy = "/shop.v1.Shop/Buy"

// shop is a backend whose effect is a counter: it proves how often an effect really ran.
type shop struct {
	receipts *receipt.Memory
	sold     int
}

// buy runs one delivery of an invocation the way a handler would.
func (s *shop) buy(ctx context.Context, method, id string, fail error) (*wrapperspb.StringValue, error) {
	var out *wrapperspb.StringValue
	err := s.receipts.InTx(ctx, func(tx receipt.MemoryTx) error {
		var err error
		out, err = receipt.Effect(ctx, tx, s.receipts, method, id, func() (*wrapperspb.StringValue, error) {
			if fail != nil {
				return nil, fail
			}
			s.sold++
			tx.OnRollback(func() { s.sold-- })
			return wrapperspb.String("order-" + id), nil
		})
		return err
	})
	return out, err
}

func TestEffect(t *testing.T) {
	ctx := context.Background()

	t.Run("redelivery returns the recorded result without acting again", func(t *testing.T) {
		s := &shop{receipts: receipt.NewMemory()}
		first, err := s.buy(ctx, buy, "inv-1", nil)
		if err != nil {
			t.Fatal(err)
		}
		again, err := s.buy(ctx, buy, "inv-1", nil)
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(first, again) || again.GetValue() != "order-inv-1" {
			t.Fatalf("redelivery = %v, want %v", again, first)
		}
		if s.sold != 1 {
			t.Fatalf("sold %d times, want 1", s.sold)
		}
		if _, err := s.buy(ctx, buy, "inv-2", nil); err != nil || s.sold != 2 {
			t.Fatalf("another invocation: err %v, sold %d; want it to act", err, s.sold)
		}
	})

	t.Run("a fenced invocation is refused and does not act", func(t *testing.T) {
		s := &shop{receipts: receipt.NewMemory()}
		if err := s.receipts.InTx(ctx, func(tx receipt.MemoryTx) error {
			_, err := receipt.Resolve(ctx, tx, s.receipts, "inv-1", time.Now())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		_, err := s.buy(ctx, buy, "inv-1", nil)
		fe := refusal(t, err, codes.FailedPrecondition, receipt.StageIdempotencyCheck, receipt.CodeFenced)
		if fe.Retriable || fe.InvocationID != "inv-1" || !errors.Is(err, receipt.ErrFenced) {
			t.Errorf("refusal = %+v (is ErrFenced: %v)", fe, errors.Is(err, receipt.ErrFenced))
		}
		if s.sold != 0 {
			t.Fatalf("sold %d times, want 0", s.sold)
		}
	})

	t.Run("a refused effect records nothing", func(t *testing.T) {
		s := &shop{receipts: receipt.NewMemory()}
		boom := failure.New("state_check", "state.sold_out", "sold out")
		if _, err := s.buy(ctx, buy, "inv-1", boom); !errors.Is(err, boom) {
			t.Fatalf("err = %v", err)
		}
		if _, found, _ := s.receipts.Get(ctx, nil, "inv-1"); found {
			t.Fatal("a refusal left a receipt")
		}
		if _, err := s.buy(ctx, buy, "inv-1", nil); err != nil || s.sold != 1 {
			t.Fatalf("redelivery after the refusal: err %v, sold %d; want it to act", err, s.sold)
		}
	})

	t.Run("no invocation id", func(t *testing.T) {
		s := &shop{receipts: receipt.NewMemory()}
		_, err := s.buy(ctx, buy, "", nil)
		_ = refusal(t, err, codes.InvalidArgument, receipt.StageRequestCheck, receipt.CodeInvalidMetadata)
		if s.sold != 0 {
			t.Fatalf("sold %d times, want 0", s.sold)
		}
	})

	t.Run("an invocation executed as another method", func(t *testing.T) {
		s := &shop{receipts: receipt.NewMemory()}
		if _, err := s.buy(ctx, buy, "inv-1", nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.buy(ctx, "/shop.v1.Shop/Return", "inv-1", nil); err == nil || s.sold != 1 {
			t.Fatalf("err = %v, sold %d; want an error and no second effect", err, s.sold)
		}
	})
}

func TestReplay(t *testing.T) {
	ctx := context.Background()
	m := receipt.NewMemory()
	result, _ := proto.Marshal(wrapperspb.String("order-7"))
	if err := m.InTx(ctx, func(tx receipt.MemoryTx) error {
		return m.Record(ctx, tx, receipt.Receipt{InvocationID: "inv-7", State: receipt.Executed, Method: buy, Result: result, RecordedAt: time.Now()})
	}); err != nil {
		t.Fatal(err)
	}
	got, found, err := receipt.Replay[*wrapperspb.StringValue](ctx, nil, m, "inv-7")
	if err != nil || !found || got.GetValue() != "order-7" {
		t.Fatalf("replay = %v, %v, %v", got, found, err)
	}
	got, found, err = receipt.Replay[*wrapperspb.StringValue](ctx, nil, m, "inv-8")
	if err != nil || found || got != nil {
		t.Fatalf("replay of an unknown invocation = %v, %v, %v", got, found, err)
	}
}

// refusal asserts err is a *failure.Error with the gRPC code, stage and code.
func refusal(t *testing.T, err error, code codes.Code, stage, errCode string) *failure.Error {
	t.Helper()
	var fe *failure.Error
	if !errors.As(err, &fe) {
		t.Fatalf("err = %v, want a refusal %s/%s", err, stage, errCode)
	}
	if fe.GRPCStatus().Code() != code || fe.Stage != stage || fe.Code != errCode {
		t.Fatalf("refusal = %v %s/%s, want %v %s/%s", fe.GRPCStatus().Code(), fe.Stage, fe.Code, code, stage, errCode)
	}
	return fe
}

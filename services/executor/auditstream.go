package executor

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// AuditStreamer opens the audit service's append stream: the part of
// mandatev1.AuditServiceClient an AuditStream uses.
type AuditStreamer interface {
	AppendStream(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[mandatev1.AppendStreamRequest, mandatev1.AppendStreamResponse], error)
}

// AuditStream is an AuditClient that carries every append on one
// long-lived AuditService.AppendStream, opened on the executor's own
// authority (its own credential, no caller relayed; every row names its
// tenant), so that no append pays a call and its credential checks.
// Concurrent appends share the stream, and the audit service commits those
// that arrive together in one transaction.
//
// Each Append waits for its acknowledgement or for its context to end, as
// a unary call does. When the stream breaks, the appends waiting on it fail
// with its error — Unavailable unless the audit service said otherwise —
// so the pipeline retries or spools them as it does any append the trail
// did not take; the next Append opens a new stream.
//
// A stream lives at most MaxAge: the next Append after that opens a new
// one, and the old stream is closed once its last acknowledgement came. A
// balancer in front of several audit replicas thus spreads the executors'
// streams again as replicas come and go, as it would unary calls.
type AuditStream struct {
	client AuditStreamer
	maxAge time.Duration
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	cur    *appendStream
	nextID uint64
}

// DefaultAuditStreamMaxAge is how long an AuditStream keeps one stream
// unless told otherwise.
const DefaultAuditStreamMaxAge = time.Minute

// NewAuditStream returns an AuditStream over client, whose connection must
// carry the executor's service credentials, that opens a new stream once
// one is maxAge old (DefaultAuditStreamMaxAge when zero or negative).
// Close it after the executor.
func NewAuditStream(client AuditStreamer, maxAge time.Duration) *AuditStream {
	if maxAge <= 0 {
		maxAge = DefaultAuditStreamMaxAge
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &AuditStream{client: client, maxAge: maxAge, ctx: ctx, cancel: cancel}
}

// Close ends the stream; appends still waiting fail as unavailable.
func (a *AuditStream) Close() {
	a.mu.Lock() // no stream opens after this
	a.cancel()
	a.mu.Unlock()
	a.wg.Wait()
}

// appendStream is one stream and the appends waiting on it.
type appendStream struct {
	stream grpc.BidiStreamingClient[mandatev1.AppendStreamRequest, mandatev1.AppendStreamResponse]
	cancel context.CancelFunc
	sendq  chan *mandatev1.AppendStreamRequest
	// done is closed when the stream broke; err says why.
	done chan struct{}
	err  error
	// opened is when the stream was opened; closeSend is closed to have
	// the sender end a retired stream's sending side.
	opened    time.Time
	closeSend chan struct{}

	mu      sync.Mutex
	waiting map[uint64]chan *mandatev1.AppendStreamResponse
	// retired: no append is registered on the stream any more; it ends
	// once waiting is empty.
	retired bool
	closing sync.Once
}

// Append appends req's records and returns where each was stored: tenant,
// invocation id, phase, seq and hash (AppendStreamRequest.brief), which is
// all the executor reads of them.
func (a *AuditStream) Append(ctx context.Context, req *mandatev1.AppendRequest, _ ...grpc.CallOption) (*mandatev1.AppendResponse, error) {
	s, id, ack, err := a.register()
	if err != nil {
		return nil, err
	}
	tc := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, tc)
	select {
	case s.sendq <- &mandatev1.AppendStreamRequest{Id: id, Records: req.GetRecords(), TraceContext: tc, Brief: true}:
	case <-s.done:
		return nil, s.err
	case <-ctx.Done():
		s.forget(id)
		return nil, ctx.Err()
	}
	select {
	case resp := <-ack:
		return acknowledged(resp)
	case <-s.done:
		// A retired stream ends as soon as its last acknowledgement is
		// received, so done and ack can be ready together: the
		// acknowledgement, handed over before the stream ended, wins.
		select {
		case resp := <-ack:
			return acknowledged(resp)
		default:
			return nil, s.err
		}
	case <-ctx.Done():
		s.forget(id)
		return nil, ctx.Err()
	}
}

// acknowledged is Append's answer for the audit service's response.
func acknowledged(resp *mandatev1.AppendStreamResponse) (*mandatev1.AppendResponse, error) {
	if resp.GetStatusCode() != int32(codes.OK) {
		return nil, responseError(resp)
	}
	return &mandatev1.AppendResponse{Records: resp.GetRecords()}, nil
}

// register returns the open stream (opening one if there is none) and a
// new request id on it, with the channel its acknowledgement comes on.
func (a *AuditStream) register() (*appendStream, uint64, chan *mandatev1.AppendStreamResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ctx.Err() != nil {
		return nil, 0, nil, status.Error(codes.Unavailable, "audit stream: closed")
	}
	s := a.cur
	if s != nil {
		select {
		case <-s.done:
			s = nil
		default:
			if time.Since(s.opened) >= a.maxAge {
				s.retire()
				s = nil
			}
		}
	}
	if s == nil {
		var err error
		if s, err = a.open(); err != nil {
			return nil, 0, nil, err
		}
		a.cur = s
	}
	a.nextID++
	ack := make(chan *mandatev1.AppendStreamResponse, 1)
	s.mu.Lock()
	s.waiting[a.nextID] = ack
	s.mu.Unlock()
	return s, a.nextID, ack, nil
}

// open opens a stream and starts its sender and receiver (a.mu held).
func (a *AuditStream) open() (*appendStream, error) {
	ctx, cancel := context.WithCancel(a.ctx)
	stream, err := a.client.AppendStream(ctx)
	if err != nil {
		cancel()
		return nil, streamError(err)
	}
	s := &appendStream{stream: stream, cancel: cancel, sendq: make(chan *mandatev1.AppendStreamRequest, 256),
		done: make(chan struct{}), waiting: map[uint64]chan *mandatev1.AppendStreamResponse{},
		opened: time.Now(), closeSend: make(chan struct{})}
	var once sync.Once
	fail := func(err error) {
		once.Do(func() {
			s.err = streamError(err)
			close(s.done)
			cancel()
		})
	}
	a.wg.Add(2)
	go func() {
		defer a.wg.Done()
		for {
			select {
			case req := <-s.sendq:
				if err := stream.Send(req); err != nil {
					// The stream's own error comes from Recv.
					<-s.done
					return
				}
			case <-s.closeSend:
				// Retired and every append acknowledged: the audit
				// service ends the stream, and Recv sees io.EOF.
				_ = stream.CloseSend()
				<-s.done
				return
			case <-s.done:
				return
			}
		}
	}()
	go func() {
		defer a.wg.Done()
		for {
			resp, err := stream.Recv()
			if err != nil {
				fail(err)
				return
			}
			s.mu.Lock()
			ack, ok := s.waiting[resp.GetId()]
			delete(s.waiting, resp.GetId())
			s.endIfIdle()
			s.mu.Unlock()
			if ok {
				ack <- resp
			}
		}
	}()
	return s, nil
}

// forget drops a request whose caller stopped waiting.
func (s *appendStream) forget(id uint64) {
	s.mu.Lock()
	delete(s.waiting, id)
	s.endIfIdle()
	s.mu.Unlock()
}

// retire stops registering appends on the stream (the AuditStream's mu
// held, so none is being registered) and ends it once the appends already
// registered are acknowledged.
func (s *appendStream) retire() {
	s.mu.Lock()
	s.retired = true
	s.endIfIdle()
	s.mu.Unlock()
}

// endIfIdle ends a retired stream that waits for nothing (s.mu held).
func (s *appendStream) endIfIdle() {
	if s.retired && len(s.waiting) == 0 {
		s.closing.Do(func() { close(s.closeSend) })
	}
}

// streamError is the error of a broken stream: the audit service's own
// status, or Unavailable when it ended without one (closed, cut off).
func streamError(err error) error {
	if st, ok := status.FromError(err); ok && st.Code() != codes.OK && st.Code() != codes.Unknown && st.Code() != codes.Canceled {
		return err
	}
	if errors.Is(err, io.EOF) {
		return status.Error(codes.Unavailable, "audit stream: ended by the audit service")
	}
	return status.Error(codes.Unavailable, "audit stream: "+err.Error())
}

// responseError is the error of a refused append, as the unary Append
// would have returned it.
func responseError(resp *mandatev1.AppendStreamResponse) error {
	st := status.New(codes.Code(resp.GetStatusCode()), resp.GetStatusMessage()) //nolint:gosec // a gRPC code
	if ce := resp.GetError(); ce != nil {
		if d, err := st.WithDetails(ce); err == nil {
			st = d
		}
	}
	return st.Err()
}

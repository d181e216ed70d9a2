package executor

import (
	"context"
	"errors"
	"io"
	"sync"

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
type AuditStream struct {
	client AuditStreamer
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	cur    *appendStream
	nextID uint64
}

// NewAuditStream returns an AuditStream over client, whose connection must
// carry the executor's service credentials. Close it after the executor.
func NewAuditStream(client AuditStreamer) *AuditStream {
	ctx, cancel := context.WithCancel(context.Background())
	return &AuditStream{client: client, ctx: ctx, cancel: cancel}
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

	mu      sync.Mutex
	waiting map[uint64]chan *mandatev1.AppendStreamResponse
}

// Append appends req's records and returns the stored rows.
func (a *AuditStream) Append(ctx context.Context, req *mandatev1.AppendRequest, _ ...grpc.CallOption) (*mandatev1.AppendResponse, error) {
	s, id, ack, err := a.register()
	if err != nil {
		return nil, err
	}
	tc := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, tc)
	select {
	case s.sendq <- &mandatev1.AppendStreamRequest{Id: id, Records: req.GetRecords(), TraceContext: tc}:
	case <-s.done:
		return nil, s.err
	case <-ctx.Done():
		s.forget(id)
		return nil, ctx.Err()
	}
	select {
	case resp := <-ack:
		if resp.GetStatusCode() != int32(codes.OK) {
			return nil, responseError(resp)
		}
		return &mandatev1.AppendResponse{Records: resp.GetRecords()}, nil
	case <-s.done:
		return nil, s.err
	case <-ctx.Done():
		s.forget(id)
		return nil, ctx.Err()
	}
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
		done: make(chan struct{}), waiting: map[uint64]chan *mandatev1.AppendStreamResponse{}}
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
	s.mu.Unlock()
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

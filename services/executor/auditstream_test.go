package executor_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/app/servicetest"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/audit"
	auditmem "github.com/mandate-dev/mandate/services/audit/memory"
	"github.com/mandate-dev/mandate/services/confirm"
	confirmmem "github.com/mandate-dev/mandate/services/confirm/memory"
	"github.com/mandate-dev/mandate/services/executor"
)

var (
	devSecret     = []byte("dev-secret-0123456789abcdef0123456789")
	serviceSecret = []byte("svc-secret-0123456789abcdef0123456789")
)

// auditPorts serves an in-memory audit trail and returns the client the
// executor holds, calling as service name.
func auditPorts(t *testing.T, name string) (mandatev1.AuditServiceClient, *auditmem.Store) {
	t.Helper()
	users, err := identity.NewVerifier(context.Background(), identity.Config{Audience: []string{"mandate"}, Issuers: []string{"test"}, DevSecret: devSecret})
	if err != nil {
		t.Fatal(err)
	}
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{Secret: serviceSecret, Audience: []string{"mandate"}, Issuers: []string{"test"}})
	if err != nil {
		t.Fatal(err)
	}
	src, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	store := auditmem.New(auditmem.Options{})
	writer := audit.NewWriter(store, audit.WriterOptions{})
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	dir := directory.NewCache(dirmem.New(), directory.CacheOptions{TTL: time.Hour})
	confirmStore := confirmmem.New(confirmmem.Options{})
	c, err := confirm.New(confirm.Config{Store: confirmStore, Directory: dir, Commands: set, ApprovalBaseURL: "http://approve.test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = writer.Close()
		store.Close()
		confirmStore.Close()
		dir.Close()
	})
	return servicetest.Executor(t, users, services, src, writer, dir, c).Audit, store
}

func intent(tenant, inv string) *mandatev1.AuditRecord {
	return &mandatev1.AuditRecord{InvocationId: inv, Phase: "intent", Tenant: tenant, Channel: "grpc", Command: "ticket.get", Outcome: "pending"}
}

// TestAuditStreamAppends: concurrent appends share one stream, and each
// gets its own rows back, filed under the tenant each record names.
func TestAuditStreamAppends(t *testing.T) {
	client, store := auditPorts(t, executor.ServiceName)
	s := executor.NewAuditStream(client, 0)
	defer s.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			tenant, inv := []string{"acme", "globex"}[i%2], fmt.Sprintf("inv_%d", i)
			resp, err := s.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{intent(tenant, inv)}})
			switch {
			case err != nil:
				errs <- err
			case len(resp.GetRecords()) != 1 || resp.GetRecords()[0].GetInvocationId() != inv ||
				resp.GetRecords()[0].GetTenant() != tenant || resp.GetRecords()[0].GetSeq() == 0:
				errs <- fmt.Errorf("append of %s/%s answered %v", tenant, inv, resp.GetRecords())
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, tenant := range []string{"acme", "globex"} {
		rep, err := store.Verify(context.Background(), tenant)
		if err != nil || !rep.OK || rep.Rows != 32 {
			t.Errorf("%s: %+v, %v; want 32 rows in an intact chain", tenant, rep, err)
		}
	}
}

// TestAuditStreamRefusal: a refused append fails with the audit service's
// error, as the unary Append would, and the stream goes on.
func TestAuditStreamRefusal(t *testing.T) {
	client, _ := auditPorts(t, executor.ServiceName)
	s := executor.NewAuditStream(client, 0)
	defer s.Close()
	ctx := context.Background()
	_, err := s.Append(ctx, &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{intent("", "inv_1")}})
	fe, ok := failure.FromStatus(status.Convert(err))
	if !ok || fe.Code != "schema.invalid" || status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a record without tenant: %v", err)
	}
	if _, err := s.Append(ctx, &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{intent("acme", "inv_2")}}); err != nil {
		t.Fatalf("after a refusal: %v", err)
	}
}

// TestAuditStreamOnlyTheExecutor: another service cannot open the stream.
func TestAuditStreamOnlyTheExecutor(t *testing.T) {
	client, _ := auditPorts(t, identity.MCPBridgeService)
	s := executor.NewAuditStream(client, 0)
	defer s.Close()
	_, err := s.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{intent("acme", "inv_1")}})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("append by the bridge: %v", err)
	}
}

// TestAuditStreamBreaks: appends waiting on a stream that breaks fail as
// unavailable, and the next append opens a new stream.
func TestAuditStreamBreaks(t *testing.T) {
	f := &fakeStreamer{}
	s := executor.NewAuditStream(f, 0)
	defer s.Close()
	ctx := context.Background()
	req := &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{intent("acme", "inv_1")}}
	if _, err := s.Append(ctx, req); err != nil {
		t.Fatal(err)
	}
	f.current().breakWith(errors.New("connection reset"))
	_, err := s.Append(ctx, req)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("append on a broken stream: %v (want Unavailable)", err)
	}
	if _, err := s.Append(ctx, req); err != nil {
		t.Fatalf("append after the break: %v", err)
	}
	if n := f.opened.Load(); n != 2 {
		t.Fatalf("%d streams opened, want 2", n)
	}
	// An audit service that does not answer: the append ends with its
	// context, as a unary call does.
	f.current().mute.Store(true)
	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := s.Append(dctx, req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("append to a silent trail: %v", err)
	}
}

// fakeStreamer opens streams that acknowledge every request until broken.
type fakeStreamer struct {
	opened atomic.Int32
	mu     sync.Mutex
	cur    *fakeStream
}

func (f *fakeStreamer) AppendStream(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[mandatev1.AppendStreamRequest, mandatev1.AppendStreamResponse], error) {
	f.opened.Add(1)
	s := &fakeStream{ctx: ctx, acks: make(chan *mandatev1.AppendStreamResponse, 16), broken: make(chan error, 1)}
	f.mu.Lock()
	f.cur = s
	f.mu.Unlock()
	return s, nil
}

func (f *fakeStreamer) current() *fakeStream {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur
}

type fakeStream struct {
	grpc.ClientStream
	ctx    context.Context
	acks   chan *mandatev1.AppendStreamResponse
	broken chan error
	mute   atomic.Bool
}

func (s *fakeStream) breakWith(err error) { s.broken <- err }

func (s *fakeStream) Send(req *mandatev1.AppendStreamRequest) error {
	if !s.mute.Load() {
		s.acks <- &mandatev1.AppendStreamResponse{Id: req.GetId(), Records: req.GetRecords()}
	}
	return nil
}

func (s *fakeStream) Recv() (*mandatev1.AppendStreamResponse, error) {
	select {
	case r := <-s.acks:
		return r, nil
	case err := <-s.broken:
		return nil, err
	case <-s.ctx.Done():
		return nil, s.ctx.Err()
	}
}

// countingStreamer counts the streams opened and the sending sides closed.
type countingStreamer struct {
	executor.AuditStreamer
	opened, closed atomic.Int32
}

func (c *countingStreamer) AppendStream(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[mandatev1.AppendStreamRequest, mandatev1.AppendStreamResponse], error) {
	s, err := c.AuditStreamer.AppendStream(ctx, opts...)
	if err != nil {
		return nil, err
	}
	c.opened.Add(1)
	return &closeCounting{BidiStreamingClient: s, closed: &c.closed}, nil
}

type closeCounting struct {
	grpc.BidiStreamingClient[mandatev1.AppendStreamRequest, mandatev1.AppendStreamResponse]
	closed *atomic.Int32
}

func (c *closeCounting) CloseSend() error {
	c.closed.Add(1)
	return c.BidiStreamingClient.CloseSend()
}

// TestAuditStreamRotates: once a stream is MaxAge old the next append opens
// a new one, and the old stream is closed once its appends are
// acknowledged — none of them fails, and the chain holds every row.
func TestAuditStreamRotates(t *testing.T) {
	client, store := auditPorts(t, executor.ServiceName)
	c := &countingStreamer{AuditStreamer: client}
	s := executor.NewAuditStream(c, time.Nanosecond) // every append finds its stream too old
	defer s.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 48)
	for i := range 48 {
		wg.Go(func() {
			if _, err := s.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{intent("acme", fmt.Sprintf("inv_%d", i))}}); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("append across a rotation: %v", err)
	}
	rep, err := store.Verify(context.Background(), "acme")
	if err != nil || !rep.OK || rep.Rows != 48 {
		t.Fatalf("%+v, %v; want 48 rows in an intact chain", rep, err)
	}
	opened := c.opened.Load()
	if opened < 2 {
		t.Fatalf("%d streams opened; want a new one after MaxAge", opened)
	}
	// Every stream but the current one is closed once its acks came.
	for deadline := time.Now().Add(10 * time.Second); c.closed.Load() != opened-1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d retired streams closed", c.closed.Load(), opened-1)
		}
	}
}

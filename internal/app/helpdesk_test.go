package app

import (
	"bytes"
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/pkg/receipt"
	"github.com/mandate-dev/mandate/services/executor"
)

// TestHelpdeskServesReceipts: `mandate helpdesk` serves mandate.v1.ReceiptService to the
// executor's service token alone (no user behind a reconciliation), fencing an unknown
// invocation, while its commands still refuse a service token without a user.
func TestHelpdeskServesReceipts(t *testing.T) {
	grpcAddr := freeAddr(t)
	ctx, stop := context.WithCancel(t.Context())
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		env := map[string]string{"MANDATE_DEV_SECRET": testSecret, "MANDATE_SERVICE_SECRET": testServiceSecret}
		done <- Run(ctx, []string{"helpdesk", "--store", "memory", "--grpc-addr", grpcAddr, "--http-addr", "127.0.0.1:0", "--metrics=false"},
			IO{Stdout: &bytes.Buffer{}, Stderr: &stderr, Env: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
	}()
	defer func() {
		stop()
		if code := <-done; code != 0 {
			t.Errorf("helpdesk exited with %d:\n%s", code, stderr.String())
		}
	}()
	src, err := identity.NewServiceTokenSource([]byte(testServiceSecret), DefaultIssuer, DefaultAudience, executor.ServiceName, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	receipts := mandatev1.NewReceiptServiceClient(conn)
	var got *mandatev1.Receipt
	for range 200 { // until the server listens
		callCtx, cancel := context.WithTimeout(t.Context(), time.Second)
		got, err = receipts.GetReceipt(callCtx, &mandatev1.GetReceiptRequest{InvocationId: "inv-cli-1"})
		cancel()
		if status.Code(err) != codes.Unavailable {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || got.GetState() != mandatev1.ReceiptState_RECEIPT_STATE_NOT_EXECUTED {
		t.Fatalf("GetReceipt = %v, %v; want NOT_EXECUTED\n%s", got, err, stderr.String())
	}
	callCtx := metadata.AppendToOutgoingContext(t.Context(), receipt.InvocationIDHeader, "inv-cli-2")
	_, err = helpdeskv1.NewHelpdeskServiceClient(conn).GetTicket(callCtx, &helpdeskv1.GetTicketRequest{TicketId: "T-1001"})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a command with a service token alone: %v, want Unauthenticated", err)
	}
}

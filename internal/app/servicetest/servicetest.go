// Package servicetest wires the executor's ports for tests as Mandate
// wires them: the audit and confirm APIs served on a server's in-process
// channel, with the interceptors of their gRPC servers, and called through
// the generated clients on the executor's own service identity.
package servicetest

import (
	"context"
	"testing"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/server/inprocess"
	"github.com/mandate-dev/mandate/services/audit"
	auditapi "github.com/mandate-dev/mandate/services/audit/api"
	"github.com/mandate-dev/mandate/services/confirm"
	confirmapi "github.com/mandate-dev/mandate/services/confirm/api"
)

// Ports are the executor's clients of the audit and confirm services.
type Ports struct {
	Audit   mandatev1.AuditServiceClient
	Confirm mandatev1.ConfirmServiceClient
}

// Executor serves the audit API over w (directory dir answers its readers)
// and the confirm API over c on a server whose authenticator verifies users
// and services as given and, like the audit service's own, admits a service
// on its own authority. The returned clients call on that server's
// in-process channel with the executor's credential from src, forwarding
// the caller in the context. The server stops when the test ends.
func Executor(t testing.TB, users *identity.Verifier, services *identity.ServiceVerifier, src identity.TokenSource,
	w *audit.Writer, dir directory.Resolver, c *confirm.Service,
) Ports {
	t.Helper()
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services, AllowServiceOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Name: "servicetest", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	auditapi.New(w, dir, nil).Register(srv)
	confirmapi.New(c, nil).Register(srv)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("servicetest server: %v", err)
		}
	})
	conn := inprocess.Conn(srv, src)
	return Ports{Audit: mandatev1.NewAuditServiceClient(conn), Confirm: mandatev1.NewConfirmServiceClient(conn)}
}

package clicore

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/dnstest"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
)

var testSecret = []byte("service-secret-0123456789abcdef0123")

// parseServiceFlags parses the flags of a service that dials others (the
// bridge's set) from args and the variables env.
func parseServiceFlags(env map[string]string, args ...string) (ServiceFlags, error) {
	env["MANDATE_DEV_SECRET"], env["MANDATE_SERVICE_SECRET"] = "dev-secret-0123456789abcdef0123456789", string(testSecret)
	s := config.New("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	s.FlagSet().SetOutput(io.Discard)
	var f ServiceFlags
	f.DeclareIdentity(s)
	f.DeclareDialing(s)
	return f, s.Parse(args)
}

// TestGRPCConnectionFlags: the connection lifetime and keepalive settings
// default to 5m, 2m and 30s, read their variables, and refuse a negative
// lifetime or pings more frequent than the servers allow, naming the flag
// and its variable.
func TestGRPCConnectionFlags(t *testing.T) {
	f, err := parseServiceFlags(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	if f.MaxConnectionAge != 5*time.Minute || f.MaxConnectionAgeGrace != 2*time.Minute || f.KeepaliveTime != 30*time.Second {
		t.Fatalf("defaults: age %v, grace %v, keepalive %v", f.MaxConnectionAge, f.MaxConnectionAgeGrace, f.KeepaliveTime)
	}
	f, err = parseServiceFlags(map[string]string{"MANDATE_GRPC_MAX_CONNECTION_AGE": "90s", "MANDATE_GRPC_MAX_CONNECTION_AGE_GRACE": "0", "MANDATE_GRPC_KEEPALIVE_TIME": "0"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg := f.ServerConfig(server.Config{}); cfg.MaxConnectionAge != 90*time.Second || cfg.MaxConnectionAgeGrace != 0 || f.KeepaliveTime != 0 {
		t.Fatalf("from variables: %+v, keepalive %v", cfg, f.KeepaliveTime)
	}
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"pings too often", map[string]string{"MANDATE_GRPC_KEEPALIVE_TIME": "5s"}, nil, "--grpc-keepalive-time (MANDATE_GRPC_KEEPALIVE_TIME) must be 0 or at least 10s"},
		{"negative age", map[string]string{}, []string{"--grpc-max-connection-age=-1s"}, "--grpc-max-connection-age (MANDATE_GRPC_MAX_CONNECTION_AGE) must not be negative"},
		{"negative grace", map[string]string{"MANDATE_GRPC_MAX_CONNECTION_AGE_GRACE": "-1m"}, nil, "--grpc-max-connection-age-grace (MANDATE_GRPC_MAX_CONNECTION_AGE_GRACE) must not be negative"},
		{"not a duration", map[string]string{"MANDATE_GRPC_MAX_CONNECTION_AGE": "soon"}, nil, "MANDATE_GRPC_MAX_CONNECTION_AGE: invalid value for --grpc-max-connection-age"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseServiceFlags(tc.env, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// startServer runs a Mandate server on addr (health only) until the test
// ends, or until the returned stop is called.
func startServer(t *testing.T, addr string) (srv *server.Server, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{Secret: testSecret, Audience: []string{"mandate"}, Issuers: []string{"mandate-dev"}})
	if err != nil {
		t.Fatal(err)
	}
	users, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{"mandate"}, Issuers: []string{"mandate-dev"}, DevSecret: []byte("dev-secret-0123456789abcdef0123456789")})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services, AllowServiceOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	srv, err = server.New(server.Config{Name: "peer", GRPCAddr: addr, HTTPAddr: "127.0.0.1:0", Auth: auth, ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server %s: %v", addr, err)
		}
	}
	t.Cleanup(stop)
	return srv, stop
}

// twoLoopbackPorts finds a port free on both 127.0.0.2 and 127.0.0.3: two
// replicas behind one name listen on the same port.
func twoLoopbackPorts(t *testing.T) string {
	t.Helper()
	for range 20 {
		l2, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Fatalf("127.0.0.2 is not usable here (Linux routes 127.0.0.0/8 to lo): %v", err)
		}
		_, port, _ := net.SplitHostPort(l2.Addr().String())
		l3, err := net.Listen("tcp", "127.0.0.3:"+port)
		_ = l2.Close()
		if err == nil {
			_ = l3.Close()
			return port
		}
	}
	t.Fatal("no port free on both 127.0.0.2 and 127.0.0.3")
	return ""
}

func newDialer(t *testing.T, keepalive time.Duration) *Dialer {
	t.Helper()
	src, err := identity.NewServiceTokenSource(testSecret, "mandate-dev", "mandate", "mcpbridge", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var cl Closers
	t.Cleanup(cl.Close)
	return NewDialer(src, "", keepalive, &cl)
}

// TestServiceConnectionsSpreadOverTheNamesAddresses: a service's
// connection to a name with two addresses (a headless Service's records)
// sends its calls round robin to both replicas; once one stops, every
// call goes to the other and none fails.
func TestServiceConnectionsSpreadOverTheNamesAddresses(t *testing.T) {
	port := twoLoopbackPorts(t)
	startServer(t, "127.0.0.2:"+port)
	_, stop3 := startServer(t, "127.0.0.3:"+port)
	dns := dnstest.Start(t)
	dns.Set("peer.mandate.test", "127.0.0.2", "127.0.0.3")
	target := dns.Target("peer.mandate.test", port)
	cc, err := newDialer(t, DefaultKeepaliveTime).Service(target)
	if err != nil {
		t.Fatal(err)
	}
	client := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	calls := func(n int) map[string]int {
		served := map[string]int{}
		for i := range n {
			var p peer.Peer
			if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
			host, _, _ := net.SplitHostPort(p.Addr.String())
			served[host]++
		}
		return served
	}
	served := calls(200)
	for _, ip := range []string{"127.0.0.2", "127.0.0.3"} {
		if served[ip] < 200/5 {
			t.Errorf("%s served %d of 200 calls: %v", ip, served[ip], served)
		}
	}
	t.Logf("%s: %v", target, served)
	stop3()
	if served := calls(200); served["127.0.0.2"] != 200 {
		t.Errorf("after 127.0.0.3 stopped: %v", served)
	}
}

// TestKeepalivePingsAreWithinTheServersPolicy: a service's connection to
// another pings it when idle, at the fastest interval the flags allow, and
// the Mandate server keeps the connection; a gRPC server with the default
// policy (pings at most every five minutes, none without a call) closes
// the same connection with GOAWAY too_many_pings — so the test would see a
// policy that does not match. About 40 s: the pings run on the clock.
func TestKeepalivePingsAreWithinTheServersPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for four keepalive pings (about 40 s)")
	}
	mandate, _ := startServer(t, "127.0.0.1:0")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	plain := grpc.NewServer()
	healthpb.RegisterHealthServer(plain, health.NewServer())
	go func() { _ = plain.Serve(lis) }()
	t.Cleanup(plain.Stop)

	d := newDialer(t, server.KeepaliveMinTime)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	left := map[string]chan connectivity.State{}
	for name, addr := range map[string]string{"mandate": mandate.GRPCAddr(), "plain": lis.Addr().String()} {
		cc, err := d.Service(addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// Idle from here on: only the pings travel. The channel leaves
		// READY when its connection is closed.
		ch := make(chan connectivity.State, 1)
		left[name] = ch
		go func() {
			for s := cc.GetState(); cc.WaitForStateChange(ctx, s); s = cc.GetState() {
				if st := cc.GetState(); st != connectivity.Ready {
					ch <- st
					return
				}
			}
		}()
	}
	select {
	case st := <-left["plain"]:
		t.Logf("the default-policy server closed the pinged connection (channel %v)", st)
	case st := <-left["mandate"]:
		t.Fatalf("the Mandate server closed a connection pinged every %s (channel %v)", server.KeepaliveMinTime, st)
	case <-ctx.Done():
		t.Fatal("the default-policy server never refused the pings: the test proves nothing")
	}
	select {
	case st := <-left["mandate"]:
		t.Fatalf("the Mandate server closed a connection pinged every %s (channel %v)", server.KeepaliveMinTime, st)
	default:
	}
}

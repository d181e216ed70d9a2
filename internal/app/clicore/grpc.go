package clicore

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifestcheck"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/telemetry"
)

// How the services' gRPC connections spread over replicas
// (docs/architecture/topology.md, "Replicas"). A target is resolved by
// gRPC's DNS resolver: "dns:///host:port" says so explicitly, and a plain
// "host:port" is resolved the same way (grpc.NewClient's default scheme is
// dns). Every address the name resolves to gets a connection of its own and
// calls go round robin over the ready ones, so a name with one record per
// replica (a headless Kubernetes Service) spreads the calls, and a replica
// that dies is left out until it answers again. A name with one address —
// a ClusterIP Service, an IP, a balancer — behaves as before: one
// connection. The servers end every connection after
// --grpc-max-connection-age, and the client re-resolves the name when one
// ends, which is how replicas added later are found.
const (
	// ServiceConfig is the gRPC service config of every connection a
	// service opens. Service configs published in DNS (TXT records) are
	// ignored: the resolver's answer chooses addresses, not policy.
	ServiceConfig = `{"loadBalancingConfig":[{"round_robin":{}}]}`

	// DefaultKeepaliveTime is how long a connection to another Mandate
	// service stays silent before the client pings it, and
	// keepaliveTimeout how long it waits for the answer before it
	// gives the connection up (and its calls go to the other replicas):
	// a peer that vanished without closing its sockets — a node lost —
	// is noticed in under a minute rather than when TCP gives up.
	DefaultKeepaliveTime = 30 * time.Second
	keepaliveTimeout     = 10 * time.Second

	// DefaultMaxConnectionAge and DefaultMaxConnectionAgeGrace are the
	// servers' defaults: a client's connections are renewed every five
	// minutes, and a call may run on for two more (longer than the audit
	// append stream lives, and than --reconcile-after assumes any call
	// takes) before its connection is closed under it.
	DefaultMaxConnectionAge      = 5 * time.Minute
	DefaultMaxConnectionAgeGrace = 2 * time.Minute
)

// declareServer declares the settings of the service's gRPC server: how
// long a client's connection lives.
func (f *ServiceFlags) declareServer(s *config.Set) {
	s.Duration(&f.MaxConnectionAge, "grpc-max-connection-age", DefaultMaxConnectionAge,
		"how long a client's gRPC connection lives before the server asks it to reconnect, so that clients balancing over DNS spread over replicas added since (0: forever)")
	s.Duration(&f.MaxConnectionAgeGrace, "grpc-max-connection-age-grace", DefaultMaxConnectionAgeGrace,
		"how long calls still running on a connection past --grpc-max-connection-age may take before it is closed under them; must exceed the longest call (0: as long as they take)")
	s.Check(func() error {
		if f.MaxConnectionAge < 0 {
			return s.Errorf("grpc-max-connection-age", "must not be negative")
		}
		if f.MaxConnectionAgeGrace < 0 {
			return s.Errorf("grpc-max-connection-age-grace", "must not be negative")
		}
		return nil
	})
}

// DeclareDialing declares the settings of the connections a service opens
// to the other Mandate services (the executor's and the bridge's): how
// often an idle connection is pinged.
func (f *ServiceFlags) DeclareDialing(s *config.Set) {
	s.Duration(&f.KeepaliveTime, "grpc-keepalive-time", DefaultKeepaliveTime,
		fmt.Sprintf("how long a gRPC connection to another Mandate service is silent before it is pinged (answer within %s, else it is closed); at least %s, which the services' servers allow (0: no pings)",
			keepaliveTimeout, server.KeepaliveMinTime))
	s.Check(func() error {
		if f.KeepaliveTime != 0 && f.KeepaliveTime < server.KeepaliveMinTime {
			return s.Errorf("grpc-keepalive-time", "must be 0 or at least %s: the services' servers close connections pinged more often", server.KeepaliveMinTime)
		}
		return nil
	})
}

// ServerConfig returns cfg with the listen addresses and connection
// lifetime of the flags.
func (f *ServiceFlags) ServerConfig(cfg server.Config) server.Config {
	cfg.GRPCAddr, cfg.HTTPAddr = f.GRPCAddr, f.HTTPAddr
	cfg.MaxConnectionAge, cfg.MaxConnectionAgeGrace = f.MaxConnectionAge, f.MaxConnectionAgeGrace
	return cfg
}

// ServiceDialer returns how a service dials the other Mandate services and
// the backends: as service `name` (a service token, with the caller's
// token relayed), with the trace context and the digest of the service's
// manifest on every call (manifestcheck: a service running another
// manifest refuses), pinging idle connections to other Mandate services
// every --grpc-keepalive-time. Connections are closed with cl.
func (f *ServiceFlags) ServiceDialer(name, manifestDigest string, cl *Closers) (*Dialer, error) {
	src, err := identity.NewServiceTokenSource([]byte(f.ServiceSecret.Reveal()), f.Issuers[0], f.Audience[0], name, time.Hour)
	if err != nil {
		return nil, err
	}
	return NewDialer(src, manifestDigest, f.KeepaliveTime, cl), nil
}

// Dialer opens a service's gRPC connections (ServiceDialer).
type Dialer struct {
	src       identity.TokenSource
	digest    string
	keepalive time.Duration
	cl        *Closers
}

// NewDialer is ServiceDialer with the service's token source given;
// keepaliveTime is the interval of the pings of Service's connections
// (0: none).
func NewDialer(src identity.TokenSource, manifestDigest string, keepaliveTime time.Duration, cl *Closers) *Dialer {
	return &Dialer{src: src, digest: manifestDigest, keepalive: keepaliveTime, cl: cl}
}

// Service dials another Mandate service, whose server allows the
// keepalive pings (server.KeepaliveMinTime).
func (d *Dialer) Service(target string) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{}
	if d.keepalive > 0 {
		opts = append(opts, grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: d.keepalive, Timeout: keepaliveTimeout, PermitWithoutStream: true,
		}))
	}
	return d.dial(target, opts...)
}

// Backend dials a backend, a server Mandate does not run: balanced like
// the services' connections, but without keepalive pings, which a gRPC
// server refuses by default (grpc-go's allows one every five minutes, and
// none without a call) by closing the connection with GOAWAY
// too_many_pings.
func (d *Dialer) Backend(target string) (*grpc.ClientConn, error) { return d.dial(target) }

// Backends dials every backend of a "proto service → address" map: the
// services of package mandate.* (the catalog's ops.review) are Mandate's
// own and dialed as services, the others as backends.
func (d *Dialer) Backends(addrs map[string]string) (map[string]grpc.ClientConnInterface, error) {
	conns := map[string]grpc.ClientConnInterface{}
	for svc, addr := range addrs {
		dial := d.Backend
		if strings.HasPrefix(svc, "mandate.") {
			dial = d.Service
		}
		c, err := dial(addr)
		if err != nil {
			return nil, err
		}
		conns[svc] = c
	}
	return conns, nil
}

func (d *Dialer) dial(target string, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts := append(append(telemetry.GRPCClientOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(ServiceConfig), grpc.WithDisableServiceConfig(),
		// The manifest digest (manifestcheck) is set with the credentials:
		// one copy of the outgoing metadata per call instead of two.
		grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(d.src, identity.Header{Key: manifestcheck.Header, Value: d.digest})),
		grpc.WithStreamInterceptor(identity.StreamClientInterceptor(d.src, identity.Header{Key: manifestcheck.Header, Value: d.digest}))),
		extra...)
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", target, err)
	}
	d.cl.Add(func() { _ = conn.Close() })
	return conn, nil
}

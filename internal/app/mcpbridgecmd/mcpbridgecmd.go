// Package mcpbridgecmd builds the MCP bridge and runs it as a command:
// `mandate mcpbridge` and the mandate-mcpbridge binary. `mandate dev`
// builds it with the same Build. It imports no other service: the bridge
// reaches the catalog, the executor and the confirm service through their
// generated clients, so that mandate-mcpbridge links only the bridge.
package mcpbridgecmd

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"time"

	"google.golang.org/grpc"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/edgelimit"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// Deps are what the MCP bridge is built from.
type Deps struct {
	// Catalog, Executor and Confirm reach those services with the bridge's
	// service credentials, which relay the caller's. Confirm nil: every
	// confirmation goes through the approval URL.
	Catalog, Executor, Confirm grpc.ClientConnInterface
	Manifest                   *manifest.Set
	Verifier                   *identity.Verifier
	// ResourceURL is the public URL of the MCP endpoint; the bridge serves
	// at its path.
	ResourceURL          string
	AuthorizationServers []string
	AdvertiseURL         string
	IdleTimeout          time.Duration
	SessionTimeout       time.Duration
	StateKey             []byte
	// Edge is the per-principal request rate of the bridge; MaxSessions
	// bounds a principal's open sessions (0: mcpbridge.DefaultMaxSessions).
	Edge        clicore.EdgeFlags
	MaxSessions int
	// Audit, when set, is where the bridge appends, on its own authority,
	// the rows of the requests it refused at the edge (nil: none).
	Audit  grpc.ClientConnInterface
	Logger *slog.Logger
}

// Service is the MCP bridge and the path it serves at.
type Service struct {
	bridge   *mcpbridge.Bridge
	path     string
	refusals *edgelimit.Recorder
}

// Build builds the bridge; it is closed with cl.
func Build(d Deps, cl *clicore.Closers) (*Service, error) {
	u, err := url.Parse(d.ResourceURL)
	if err != nil {
		return nil, fmt.Errorf("resource URL: %w", err)
	}
	path := u.Path
	if path == "" {
		path = "/"
	}
	cfg := mcpbridge.Config{
		Catalog:  mandatev1.NewCatalogServiceClient(d.Catalog),
		Executor: mandatev1.NewExecutorServiceClient(d.Executor),
		Manifest: d.Manifest, Verifier: d.Verifier,
		ResourceURL: d.ResourceURL, AuthorizationServers: d.AuthorizationServers,
		IdleTimeout: d.IdleTimeout, SessionTimeout: d.SessionTimeout, Logger: d.Logger,
		StateKey: d.StateKey, AdvertiseURL: d.AdvertiseURL,
		EdgeLimit: d.Edge.Limiter(), MaxSessions: d.MaxSessions,
	}
	if d.Confirm != nil {
		cfg.Confirm = mandatev1.NewConfirmServiceClient(d.Confirm)
	}
	if d.Audit != nil {
		if cfg.EdgeRecorder, err = edgelimit.NewRecorder(edgelimit.RecorderConfig{Audit: mandatev1.NewAuditServiceClient(d.Audit), Logger: d.Logger}); err != nil {
			return nil, err
		}
	}
	bridge, err := mcpbridge.New(cfg)
	if err != nil {
		return nil, err
	}
	cl.Add(bridge.Close)
	return &Service{bridge: bridge, path: path, refusals: cfg.EdgeRecorder}, nil
}

// Register serves MCP and the protected-resource metadata on srv.
func (b *Service) Register(srv *server.Server) {
	srv.Handle(b.path, b.bridge.Handler())
	srv.Handle(b.bridge.MetadataPath(), b.bridge.MetadataHandler())
}

// Start ends the open sessions' SSE streams as soon as p begins to stop:
// they would hold the HTTP shutdown until its timeout.
func (b *Service) Start(p *clicore.Group) {
	p.OnStopping(b.bridge.Close)
	if b.refusals != nil {
		p.Loop(b.refusals.Run) // appends the edge's refusal rows until the servers have stopped
	}
}

// Run runs the MCP bridge on its own: Streamable HTTP at the path
// of --resource-url, the RFC 9728 metadata and /healthz on --http-addr,
// and gRPC health on --grpc-addr. It keeps no data: tool lists and
// manifest reads come from the catalog, calls go to the executor and
// elicited confirmations to the confirm service, each relayed for the
// caller with the bridge's service token (service "mcpbridge"). Replicas
// share --state-secret (or the service secret it derives from) and each
// advertises its own address (--advertise-url): a request for a session
// another replica holds is forwarded there.
func Run(ctx context.Context, args []string, io clicore.IO) error {
	var (
		f                                  clicore.ServiceFlags
		mf                                 clicore.ManifestFlags
		catalogAddr, executorAddr, confirm string
		resourceURL, advertiseURL          string
		authServers                        []string
		sessionTimeout, idleTimeout        time.Duration
		stateSecret                        config.Secret
		auditAddr                          string
		edge                               clicore.EdgeFlags
		maxSessions                        int
	)
	s := config.New("mcpbridge", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	s.String(&f.GRPCAddr, "grpc-addr", "127.0.0.1:9095", "gRPC listen address (health only)")
	s.String(&f.HTTPAddr, "http-addr", "127.0.0.1:8085", "HTTP listen address: MCP, protected-resource metadata, /healthz")
	f.DeclareIdentity(s)
	f.DeclareDialing(s)
	mf.Declare(s)
	s.String(&catalogAddr, "catalog-addr", "127.0.0.1:9091", "gRPC address of the catalog service: host:port, or dns:///host:port, balanced round robin over every address the name resolves to")
	s.String(&executorAddr, "executor-addr", "127.0.0.1:9092", "gRPC address of the executor (host:port or dns:///host:port, balanced like --catalog-addr)")
	s.String(&confirm, "confirm-addr", "127.0.0.1:9093", "gRPC address of the confirm service (elicited confirmations); empty: approval URLs only")
	s.String(&auditAddr, "audit-addr", "127.0.0.1:9094", "gRPC address of the audit service, where the bridge appends the rows of requests it refused at the edge "+
		"(rate.limited, session.too_many; bounded per principal, the rest counted) on its own authority (host:port or dns:///host:port); empty: not recorded")
	edge.Declare(s, "MCP")
	s.Int(&maxSessions, "max-sessions", mcpbridge.DefaultMaxSessions, "MCP sessions one principal (tenant, user, agent) may hold open on this bridge; "+
		"past it an initialize is refused 429 session.too_many, and audited")
	s.Check(func() error {
		if maxSessions < 1 {
			return s.Errorf("max-sessions", "must be at least 1")
		}
		return nil
	})
	s.String(&resourceURL, "resource-url", "", "public URL of the MCP endpoint, the RFC 9728 resource (default http://<http-addr>/mcp)")
	s.String(&advertiseURL, "advertise-url", "", "URL at which the other bridge replicas reach this one (http://host:port of --http-addr, e.g. the pod's "+
		"address): session ids name it, sealed with the state secret, and a replica forwards requests for another's sessions to it "+
		"(default http://<http-addr>)")
	s.Strings(&authServers, "authorization-server", nil, "issuer URLs of the authorization servers MCP clients get tokens from, named in the "+
		"protected-resource metadata (default: --oidc-issuer, else the --issuer values that are URLs)")
	s.Duration(&sessionTimeout, "session-timeout", time.Hour, "close MCP sessions that made no request for this long; clients keep theirs with pings (0: never)")
	s.Duration(&idleTimeout, "idle-timeout", mcpbridge.DefaultIdleTimeout, "drop a principal's server and catalog watch this long after its last request once no session is open")
	s.SecretVar(&stateSecret, "state-secret", "HMAC key sealing the requestState of MCP 2026-07-28 confirmations and the owner named in session ids, the same on every replica "+
		"(at least 32 bytes; default: derived from --service-secret)")
	s.Check(func() error {
		if stateSecret.Set() && len(stateSecret.Reveal()) < mcpbridge.MinStateKeyBytes {
			return s.Errorf("state-secret", "must be at least %d bytes", mcpbridge.MinStateKeyBytes)
		}
		return nil
	})
	s.Check(func() error {
		if resourceURL == "" {
			return nil
		}
		if u, err := url.Parse(resourceURL); err != nil || u.Scheme == "" || u.Host == "" {
			return s.Errorf("resource-url", "must be an absolute URL")
		}
		return nil
	})
	s.Check(func() error {
		for _, as := range authServers {
			if !mcpbridge.IsIssuerURL(as) {
				return s.Errorf("authorization-server", "%q is not an issuer URL (absolute http(s), no query or fragment)", as)
			}
		}
		return nil
	})
	s.Check(func() error {
		if advertiseURL == "" {
			return nil
		}
		if !mcpbridge.IsAdvertiseURL(advertiseURL) {
			return s.Errorf("advertise-url", "must be an absolute http(s) URL without query, fragment or user info")
		}
		return nil
	})
	s.Require("catalog-addr", func() bool { return catalogAddr == "" })
	s.Require("executor-addr", func() bool { return executorAddr == "" })
	if err := s.Parse(args); err != nil {
		return err
	}
	if resourceURL == "" {
		resourceURL = "http://" + f.HTTPAddr + "/mcp"
	}
	if advertiseURL == "" {
		advertiseURL = "http://" + f.HTTPAddr
	}
	if len(authServers) == 0 {
		authServers = defaultAuthorizationServers(f.OIDCIssuer, f.Issuers)
	}
	log := f.Logger(io.Stderr, "mcpbridge")
	var cl clicore.Closers
	defer cl.Close()
	metrics, err := f.Tracing(ctx, io, "mcpbridge", log, &cl)
	if err != nil {
		return err
	}
	set, err := mf.Load()
	if err != nil {
		return err
	}
	auth, users, err := f.Verifiers(ctx)
	if err != nil {
		return err
	}
	dial, err := f.ServiceDialer(identity.MCPBridgeService, set.Digest(), &cl)
	if err != nil {
		return err
	}
	catalogConn, err := dial.Service(catalogAddr)
	if err != nil {
		return err
	}
	executorConn, err := dial.Service(executorAddr)
	if err != nil {
		return err
	}
	deps := Deps{
		Catalog: catalogConn, Executor: executorConn,
		Manifest: set, Verifier: users,
		ResourceURL: resourceURL, AuthorizationServers: authServers, AdvertiseURL: advertiseURL,
		IdleTimeout: idleTimeout, SessionTimeout: sessionTimeout, StateKey: []byte(stateSecret.Reveal()), Logger: log,
		Edge: edge, MaxSessions: maxSessions,
	}
	if auditAddr != "" {
		if deps.Audit, err = dial.Service(auditAddr); err != nil {
			return err
		}
	}
	if !stateSecret.Set() {
		deps.StateKey = deriveStateKey([]byte(f.ServiceSecret.Reveal()))
	}
	if confirm != "" {
		if deps.Confirm, err = dial.Service(confirm); err != nil {
			return err
		}
	}
	svc, err := Build(deps, &cl)
	if err != nil {
		return err
	}
	if au, err := url.Parse(advertiseURL); err == nil && (au.Hostname() == "" || net.ParseIP(au.Hostname()).IsUnspecified()) {
		log.Warn("the advertise URL names no address the other replicas can reach: set --advertise-url when running more than one replica", "advertise", advertiseURL)
	}
	log.Info("MCP endpoint", "resource", resourceURL, "advertise", advertiseURL, "catalog", catalogAddr, "executor", executorAddr, "confirm", confirm, "audit", auditAddr)
	return f.Serve(ctx, server.Config{Name: "mcpbridge", Auth: auth, Logger: log, Metrics: metrics, ManifestDigest: set.Digest()}, svc.Register, svc.Start)
}

// defaultAuthorizationServers is what the bridge's protected-resource
// metadata names when --authorization-server is not given: the OIDC issuer
// that signs users' tokens, else the accepted issuers that are URLs (an
// issuer such as "mandate-dev" names no server a client could find).
func defaultAuthorizationServers(oidcIssuer string, issuers []string) []string {
	if oidcIssuer != "" {
		return []string{oidcIssuer}
	}
	var out []string
	for _, iss := range issuers {
		if mcpbridge.IsIssuerURL(iss) {
			out = append(out, iss)
		}
	}
	return out
}

// deriveStateKey is the default requestState key of the MCP bridge: an
// HMAC-SHA256 of a label under the service secret, so that every replica
// sharing the service secret agrees on it and the key is never the service
// secret itself.
func deriveStateKey(serviceSecret []byte) []byte {
	h := hmac.New(sha256.New, serviceSecret)
	h.Write([]byte("mandate.dev/mcpbridge/request-state-key/v1"))
	return h.Sum(nil)
}

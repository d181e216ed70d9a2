package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/services/executor"
	execmem "github.com/mandate-dev/mandate/services/executor/memory"
	execpg "github.com/mandate-dev/mandate/services/executor/postgres"
)

// parseBackends reads "pkg.Service=host:port,…".
func parseBackends(list []string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range list {
		svc, addr, ok := strings.Cut(item, "=")
		if !ok || svc == "" || addr == "" {
			return nil, fmt.Errorf("%q is not service=address", item)
		}
		out[svc] = addr
	}
	return out, nil
}

func runExecutor(ctx context.Context, args []string, io IO) error {
	var (
		f                      serviceFlags
		mf                     manifestFlags
		ef                     eventsFlags
		backends               []string
		auditAddr, confirmAddr string
		confirmSideEffects     bool
		idemTTL, deadline      time.Duration
		leaseMargin            time.Duration
		streamMaxAge           time.Duration
		reconcileAfter         time.Duration
		reconcileEvery         time.Duration
	)
	s := config.New("executor", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	f.declare(s, "127.0.0.1:9092", "127.0.0.1:8082")
	mf.declare(s)
	ef.declare(s)
	s.Strings(&backends, "backend", nil, "backend per proto service: examples.helpdesk.v1.HelpdeskService=127.0.0.1:9191")
	s.String(&auditAddr, "audit-addr", "127.0.0.1:9094", "gRPC address of the audit service")
	s.String(&confirmAddr, "confirm-addr", "127.0.0.1:9093", "gRPC address of the confirm service")
	s.Bool(&confirmSideEffects, "confirm-side-effects", false, "require confirmation for every command that declares side effects")
	s.Duration(&idemTTL, "idempotency-ttl", 24*time.Hour, "how long idempotency keys are remembered")
	s.Duration(&deadline, "default-deadline", 30*time.Second, "backend deadline for commands that declare none")
	s.Duration(&reconcileAfter, "reconcile-after", 2*time.Minute, "age after which an intent without outcome (its executor died) is settled from the backend's receipt; must exceed the longest call")
	s.Duration(&reconcileEvery, "reconcile-interval", 30*time.Second, "how often intents without outcome are settled from receipts")
	s.Duration(&streamMaxAge, "audit-stream-max-age", executor.DefaultAuditStreamMaxAge, "how long the executor appends on one stream to the audit service before it opens the next, so that a balancer spreads the streams over the audit replicas")
	s.Duration(&leaseMargin, "lease-margin", time.Minute, "how long past its deadline an idempotency key stays claimed by a call that gave no outcome (its executor died) before a retry asks the backend's receipt")
	var backendMap map[string]string
	s.Check(func() error {
		var err error
		if backendMap, err = parseBackends(backends); err != nil {
			return s.Errorf("backend", "%v", err)
		}
		if len(backendMap) == 0 {
			return s.Errorf("backend", "is required: name the address of every command's service")
		}
		return nil
	})
	if err := s.Parse(args); err != nil {
		return err
	}
	log := f.logger(io.Stderr, "executor")
	var cl closers
	defer cl.close()
	metrics, err := f.tracing(ctx, io, "executor", log, &cl)
	if err != nil {
		return err
	}
	set, err := mf.load()
	if err != nil {
		return err
	}
	for _, c := range set.Commands() {
		if _, ok := backendMap[c.RPC.Service]; !ok && c.Published() {
			return errors.New("--backend names no address for " + c.RPC.Service + ", which serves " + c.Code)
		}
	}
	auth, err := f.authenticator(ctx)
	if err != nil {
		return err
	}
	dial, err := f.serviceDialer(executor.ServiceName, &cl)
	if err != nil {
		return err
	}
	conns := map[string]grpc.ClientConnInterface{}
	for svc, addr := range backendMap {
		c, err := dial(addr)
		if err != nil {
			return err
		}
		conns[svc] = c
	}
	auditConn, err := dial(auditAddr)
	if err != nil {
		return err
	}
	confirmConn, err := dial(confirmAddr)
	if err != nil {
		return err
	}
	pool, err := f.pool(ctx, &cl)
	if err != nil {
		return err
	}
	var store executor.Store
	if pool != nil {
		store = execpg.New(pool, execpg.Options{})
	} else {
		store = execmem.New(execmem.Options{})
	}
	svc, err := buildExecutor(executorDeps{
		Manifest: set, Directory: f.directory(pool, &cl), Store: store,
		Audit: auditConn, Confirm: confirmConn, Backends: conns,
		SettleIntents: true, ReconcileAfter: reconcileAfter, ReconcileInterval: reconcileEvery,
		ConfirmSideEffects: confirmSideEffects, IdempotencyTTL: idemTTL, DefaultDeadline: deadline, LeaseMargin: leaseMargin, AuditStreamMaxAge: streamMaxAge,
		Events: ef, Logger: log,
	}, &cl)
	if err != nil {
		return err
	}
	srv, err := server.New(server.Config{Name: "mandate.v1.ExecutorService", GRPCAddr: f.grpcAddr, HTTPAddr: f.httpAddr,
		Auth: auth, Logger: log, Metrics: metrics, GRPCOptions: svc.serverOptions()})
	if err != nil {
		return err
	}
	svc.register(srv)
	var p processGroup
	svc.start(&p)
	p.serve(srv.Run)
	return p.run(ctx)
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandate-dev/mandate/examples/policy"
	"github.com/mandate-dev/mandate/internal/identity"
)

// Secrets of the separate-process topology: a throwaway deployment on
// loopback, gone when the run ends.
const (
	topoDevSecret     = "bench-dev-secret-0123456789abcdef0123456789"
	topoServiceSecret = "bench-svc-secret-0123456789abcdef0123456789"
	defaultDatabase   = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
)

type config struct {
	calls1, calls16 int
	rounds          int
	commands        []command
	protocols       []string
	topology        string // auto, on, off
	databaseURL     string
	auditWindow     time.Duration
	profileDir      string
	keep            bool
	auditOnly       bool
	timeline        int
}

func parseFlags(args []string) (config, error) {
	var c config
	var protocols, commands string
	fs := flag.NewFlagSet("mandate-bench", flag.ContinueOnError)
	fs.StringVar(&commands, "commands", "search,write", "what the calls do, comma-separated: search (ticket.search) and write (expense.report.create, a fresh idempotency key per call)")
	fs.IntVar(&c.calls1, "calls-1", 500, "calls measured with 1 caller")
	fs.IntVar(&c.calls16, "calls-16", 2000, "calls measured with 16 callers")
	fs.IntVar(&c.rounds, "rounds", 3, "measure each load shape this many times, the reference and every governed shape in turn; the ratio printed is the median round's")
	fs.StringVar(&protocols, "protocols", "2026-07-28,2025-11-25", "MCP revisions the client asks for, comma-separated (the first is the go-sdk client's default)")
	fs.StringVar(&c.topology, "topology", "auto", "separate processes over Postgres: auto (when a server answers), on, off")
	fs.StringVar(&c.databaseURL, "database-url", "", "Postgres for the topology (default $MANDATE_TEST_DATABASE_URL, else "+defaultDatabase+"); a fresh database is created and dropped")
	fs.DurationVar(&c.auditWindow, "audit", 5*time.Second, "run audit appends against pgbench for this long each, in every round (0: skip); needs the database")
	fs.StringVar(&c.profileDir, "profile", "", "write a CPU profile and allocation profiles (.allocs, .allocs.base) of every server for every measured run into this directory (go tool pprof)")
	fs.BoolVar(&c.keep, "keep-logs", false, "keep the servers' logs (their directory is printed)")
	fs.BoolVar(&c.auditOnly, "audit-only", false, "run only the audit comparison (-audit long each), no MCP load")
	fs.IntVar(&c.timeline, "timeline", 50, "after the load, trace this many calls made one at a time through the separate topology and print where a call's time goes, span by span (0: skip)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.profileDir != "" {
		abs, err := filepath.Abs(c.profileDir)
		if err != nil {
			return c, err
		}
		if err := os.MkdirAll(abs, 0o750); err != nil {
			return c, err
		}
		c.profileDir = abs
	}
	if c.calls1 < 1 || c.calls16 < 16 {
		return c, errors.New("-calls-1 must be at least 1 and -calls-16 at least 16")
	}
	if c.rounds < 1 {
		return c, errors.New("-rounds must be at least 1")
	}
	if c.timeline < 0 {
		return c, errors.New("-timeline must not be negative")
	}
	if c.topology != "auto" && c.topology != "on" && c.topology != "off" {
		return c, fmt.Errorf("-topology %q: want auto, on or off", c.topology)
	}
	c.protocols = strings.Split(protocols, ",")
	var err error
	if c.commands, err = parseCommands(commands); err != nil {
		return c, err
	}
	if c.databaseURL == "" {
		c.databaseURL = os.Getenv("MANDATE_TEST_DATABASE_URL")
	}
	if c.databaseURL == "" {
		c.databaseURL = defaultDatabase
	}
	return c, nil
}

// row is one load shape: the reference and each governed topology under it.
type row struct {
	protocol string
	callers  int
	ref      measurement            // every round's calls together
	governed map[string]measurement // by shape name, every round's calls together
	ratios   map[string][]float64   // by shape name: governed / ungoverned throughput, one per round

	// The separate topology's own ungoverned reference (see
	// runReference), measured right before it in every round.
	overService    measurement
	overRatios     []float64 // separate topology / overService, one per round
	overOfInMemory []float64 // overService / ref, one per round
}

// ratio is the median of a shape's per-round throughput ratios, and the
// range when there was more than one round.
func (r row) ratio(shape string) string { return medianRange(r.ratios[shape]) }

// medianRange prints the median of vs and, for more than one value, the
// lowest and highest: "0.85 (0.78–0.95)".
func medianRange(vs []float64) string {
	rs := slices.Sorted(slices.Values(vs))
	if len(rs) == 0 {
		return "–"
	}
	med := median(rs)
	if len(rs) == 1 {
		return fmt.Sprintf("%.2f", med)
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f)", med, rs[0], rs[len(rs)-1])
}

const (
	shapeDev  = "mandate dev"
	shapeTopo = "separate processes + Postgres"
)

func run(ctx context.Context, cfg config, out io.Writer) (err error) {
	dir, err := os.MkdirTemp("", "mandate-bench-")
	if err != nil {
		return err
	}
	if cfg.keep {
		fmt.Fprintf(out, "logs: %s\n", dir)
	} else {
		defer func() { _ = os.RemoveAll(dir) }()
	}
	f := &fleet{dir: dir, env: append(os.Environ(), "MANDATE_LOG_LEVEL=error", profileDirEnv+"="+cfg.profileDir)}
	defer func() { err = errors.Join(err, f.stop()) }()
	if cfg.auditOnly {
		return runAuditOnly(ctx, cfg, f, out)
	}

	ref, err := f.reference(ctx, "reference", "")
	if err != nil {
		return err
	}
	reference := target{name: "reference", endpoint: "http://" + ref.httpAddr + "/mcp", procs: []*proc{ref}}
	dev, err := startDev(ctx, f)
	if err != nil {
		return err
	}
	targets := map[string]target{shapeDev: dev}
	shapes := []string{shapeDev}
	var overService *target // the separate topology's ungoverned reference
	store, note, err := database(ctx, cfg, f)
	switch {
	case err != nil:
		return err
	case note != "":
		fmt.Fprintln(out, note)
	default:
		if targets[shapeTopo], err = startTopology(ctx, f, store); err != nil {
			return err
		}
		shapes = append(shapes, shapeTopo)
		if overService, err = startOverService(ctx, f, targets[shapeTopo]); err != nil {
			return err
		}
	}

	idle, err := idleCPU(ctx, append([]string{"reference"}, shapes...), append([]target{reference}, mapTargets(targets, shapes)...))
	if err != nil {
		return err
	}

	// One section per command: every load shape of it, then its tables.
	rowsOf := make([][]row, len(cfg.commands))
	for c, cmd := range cfg.commands {
		if rowsOf[c], err = measure(ctx, cfg, cmd, reference, targets, shapes, overService); err != nil {
			return err
		}
		printTable(out, cmd, shapes, rowsOf[c])
		printOverService(out, cmd, rowsOf[c])
	}
	fmt.Fprintf(out, "\nIdle, before the load: %s.\n", idle)
	if err := printMemory(ctx, out, f); err != nil {
		return err
	}
	// What the targets are read from, command by command.
	inputs := make([]targetInputs, len(cfg.commands))
	for c := range cfg.commands {
		inputs[c] = targetInputs{rows: rowsOf[c], protocol: cfg.protocols[0], noTopology: noTopology(cfg, store), noCommit: "-timeline 0"}
		if store.url == "" {
			inputs[c].noCommit = "no separate topology to trace"
		}
	}
	if store.url != "" {
		if err := afterLoad(ctx, cfg, f, store, inputs, out); err != nil {
			return err
		}
	}
	for c, cmd := range cfg.commands {
		printTargets(out, cmd, inputs[c])
	}
	return nil
}

// afterLoad runs what follows the load on the database: the timeline of
// each command, whose audit stage is one commit for the targets (it sets
// inputs' commit), and the audit comparison.
func afterLoad(ctx context.Context, cfg config, f *fleet, store benchDB, inputs []targetInputs, out io.Writer) error {
	// The servers are stopped first: idle, they still take CPU and
	// connections from whichever contender they share the machine with.
	if err := f.stopProcs(); err != nil {
		return err
	}
	if cfg.timeline > 0 {
		for c, cmd := range cfg.commands {
			rows, p50, err := traceTimeline(ctx, f, store, cmd, cfg.protocols[0], cfg.timeline)
			if err != nil {
				fmt.Fprintf(out, "\ntimeline of %s: skipped (%v)\n", cmd.tool, err)
				inputs[c].noCommit = "the timeline was skipped"
				continue
			}
			printTimeline(out, cmd, rows, cfg.timeline, p50, cfg.protocols[0])
			if commit, ok := commitOf(rows); ok {
				inputs[c].commit, inputs[c].noCommit = commit, ""
			} else {
				inputs[c].noCommit = "the timeline has no " + auditStageSpan + " span"
			}
		}
	}
	if cfg.auditWindow > 0 {
		r, err := compareAudit(ctx, store.url, f.dir, cfg.auditWindow, cfg.rounds)
		if err != nil {
			fmt.Fprintf(out, "\naudit vs pgbench: skipped (%v)\n", err)
			return nil
		}
		printAudit(out, r, cfg.auditWindow)
	}
	return nil
}

// noTopology says why a run has no separate topology, "" when it has one.
func noTopology(cfg config, store benchDB) string {
	switch {
	case store.url != "":
		return ""
	case cfg.topology == "off":
		return "-topology off"
	default:
		return "no Postgres answered"
	}
}

// measure drives cmd through every load shape — each protocol, at 1 and
// 16 callers — cfg.rounds times, and returns one row per shape.
func measure(ctx context.Context, cfg config, cmd command, reference target, targets map[string]target, shapes []string, overService *target) ([]row, error) {
	var rows []row
	for _, protocol := range cfg.protocols {
		for _, callers := range []int{1, 16} {
			n := cfg.calls1
			if callers == 16 {
				n = cfg.calls16
			}
			r := row{protocol: protocol, callers: callers, governed: map[string]measurement{}, ratios: map[string][]float64{}}
			for round := range cfg.rounds {
				// The reference runs right before the governed servers, so
				// both see the machine in the same state; rounds alternate
				// them, so that a slow spell of the machine falls on one
				// round, not on one side. Only the first round is profiled.
				profile := cfg.profileDir != "" && round == 0
				ref, err := drive(ctx, reference, cmd, protocol, callers, n, profile)
				if err != nil {
					return nil, fmt.Errorf("reference, %s: %w", cmd.tool, err)
				}
				r.ref = r.ref.merge(ref)
				for _, s := range shapes {
					var over measurement
					if s == shapeTopo && overService != nil {
						if over, err = drive(ctx, *overService, cmd, protocol, callers, n, profile); err != nil {
							return nil, fmt.Errorf("reference over the helpdesk service, %s: %w", cmd.tool, err)
						}
						r.overService = r.overService.merge(over)
						r.overOfInMemory = append(r.overOfInMemory, over.rate()/ref.rate())
					}
					m, err := drive(ctx, targets[s], cmd, protocol, callers, n, profile)
					if err != nil {
						return nil, fmt.Errorf("%s, %s: %w", s, cmd.tool, err)
					}
					r.governed[s] = r.governed[s].merge(m)
					r.ratios[s] = append(r.ratios[s], m.rate()/ref.rate())
					if over.calls > 0 {
						r.overRatios = append(r.overRatios, m.rate()/over.rate())
					}
				}
			}
			rows = append(rows, r)
		}
	}
	return rows, nil
}

// runAuditOnly runs the audit comparison alone, on a fresh database.
func runAuditOnly(ctx context.Context, cfg config, f *fleet, out io.Writer) error {
	if cfg.auditWindow <= 0 {
		return errors.New("-audit-only needs -audit > 0")
	}
	cfg.topology = "on"
	store, _, err := database(ctx, cfg, f)
	if err != nil {
		return err
	}
	r, err := compareAudit(ctx, store.url, f.dir, cfg.auditWindow, cfg.rounds)
	if err != nil {
		return err
	}
	printAudit(out, r, cfg.auditWindow)
	return nil
}

func mapTargets(m map[string]target, names []string) []target {
	out := make([]target, len(names))
	for i, n := range names {
		out[i] = m[n]
	}
	return out
}

// idleWindow is how long idleCPU watches servers that nothing calls.
const idleWindow = 2 * time.Second

// idleCPU measures what the servers burn with nothing to do (timers,
// pollers, background loops): that cost is spread over the calls of a slow
// shape, so it explains part of a high CPU per call at one caller.
func idleCPU(ctx context.Context, names []string, ts []target) (string, error) {
	before := make([]stats, len(ts))
	for i, t := range ts {
		s, err := sumStats(ctx, t.procs)
		if err != nil {
			return "", err
		}
		before[i] = s
	}
	select {
	case <-ctx.Done():
		return "", ctx.Err()
	case <-time.After(idleWindow):
	}
	parts := make([]string, len(ts))
	for i, t := range ts {
		s, err := sumStats(ctx, t.procs)
		if err != nil {
			return "", err
		}
		busy := (s.CPU - before[i].CPU) * time.Second / idleWindow
		parts[i] = fmt.Sprintf("%s %s CPU/s", names[i], ms(busy))
	}
	return strings.Join(parts, ", "), nil
}

// startDev runs `mandate dev` and returns its MCP endpoint with the token
// of the demo agent support-bot acting for alice.
func startDev(ctx context.Context, f *fleet) (target, error) {
	tokensFile := filepath.Join(f.dir, "tokens.json")
	// The bench's callers share one principal: no edge rate limit, as the
	// reference has none.
	p, err := f.service(ctx, "dev", "--tokens-file", tokensFile, "--log-level", "error", "--rate-limit", "0")
	if err != nil {
		return target{}, err
	}
	b, err := os.ReadFile(tokensFile) //nolint:gosec // G304: a file in our own temporary directory.
	if err != nil {
		return target{}, err
	}
	var tokens map[string]string
	if err := json.Unmarshal(b, &tokens); err != nil {
		return target{}, fmt.Errorf("tokens file: %w", err)
	}
	tok := tokens["support-bot@alice"]
	if tok == "" {
		return target{}, errors.New("mandate dev wrote no token for support-bot@alice")
	}
	return target{name: "dev", endpoint: "http://" + p.httpAddr + "/mcp", token: tok, procs: []*proc{p}}, nil
}

// benchDB is the fresh database of a run.
type benchDB struct {
	url, name string
}

// database creates the run's own database, migrated and seeded with the
// demo policy, dropped once the servers have stopped. With -topology auto
// and no Postgres answering it returns a note instead.
func database(ctx context.Context, cfg config, f *fleet) (benchDB, string, error) {
	if cfg.topology == "off" {
		return benchDB{}, "separate-process topology: off (-topology off)", nil
	}
	d := benchDB{name: fmt.Sprintf("mandate_bench_%d", os.Getpid())}
	var drop func()
	var err error
	d.url, drop, err = freshDatabase(ctx, cfg.databaseURL, d.name)
	if err != nil {
		if cfg.topology == "auto" {
			return benchDB{}, fmt.Sprintf("separate-process topology: skipped, no Postgres (%v)", err), nil
		}
		return benchDB{}, "", err
	}
	f.after = append(f.after, drop) // once the services have stopped
	// The services refuse to start without a manifest: the sample, by name.
	f.env = append(f.env, "MANDATE_DATABASE_URL="+d.url, "MANDATE_DEV_SECRET="+topoDevSecret, "MANDATE_SERVICE_SECRET="+topoServiceSecret,
		"MANDATE_MANIFEST=sample")
	if err := f.once(ctx, "migrate", "--sample"); err != nil {
		return benchDB{}, "", err
	}
	policyFile := filepath.Join(f.dir, "demo.yaml")
	if err := os.WriteFile(policyFile, policy.Demo, 0o600); err != nil {
		return benchDB{}, "", err
	}
	if err := f.once(ctx, "policy", "apply", "-f", policyFile); err != nil {
		return benchDB{}, "", err
	}
	return d, "", nil
}

// startTopology starts the services as separate processes on d, as
// tests/scenarios_test.go and deploy/compose do.
func startTopology(ctx context.Context, f *fleet, d benchDB) (target, error) {
	svc := map[string]*proc{}
	var err error
	for _, name := range []string{"audit", "helpdesk", "catalog"} {
		if svc[name], err = f.service(ctx, name); err != nil {
			return target{}, err
		}
	}
	// confirm appends its decision rows to audit.
	if svc["confirm"], err = f.service(ctx, "confirm", "--audit-addr", svc["audit"].grpcAddr); err != nil {
		return target{}, err
	}
	if svc["executor"], err = f.service(ctx, "executor",
		"--audit-addr", svc["audit"].grpcAddr,
		"--confirm-addr", svc["confirm"].grpcAddr,
		"--backend", "examples.helpdesk.v1.HelpdeskService="+svc["helpdesk"].grpcAddr+
			",mandate.v1.CatalogService="+svc["catalog"].grpcAddr); err != nil {
		return target{}, err
	}
	if svc["mcpbridge"], err = f.service(ctx, "mcpbridge",
		"--executor-addr", svc["executor"].grpcAddr,
		"--catalog-addr", svc["catalog"].grpcAddr,
		"--confirm-addr", svc["confirm"].grpcAddr,
		"--audit-addr", svc["audit"].grpcAddr,
		"--rate-limit", "0"); err != nil {
		return target{}, err
	}
	tok, err := identity.MintDev([]byte(topoDevSecret), identity.MintRequest{
		Issuer: "mandate-dev", Audience: "mandate", User: "alice", Tenant: "acme", Org: "support",
		Agent: "support-bot", Model: "bench-model", ModelVersion: "1", TTL: time.Hour,
	})
	if err != nil {
		return target{}, err
	}
	var procs []*proc
	for _, name := range []string{"mcpbridge", "executor", "audit", "catalog", "confirm", "helpdesk"} {
		procs = append(procs, svc[name])
	}
	return target{name: "separate", endpoint: "http://" + svc["mcpbridge"].httpAddr + "/mcp", token: tok, procs: procs, database: d.name}, nil
}

// startOverService starts the separate topology's ungoverned reference: a
// plain go-sdk server over the topology's own helpdesk service (see
// runReference). Its calls are charged to it, the helpdesk process and the
// topology's database.
func startOverService(ctx context.Context, f *fleet, topo target) (*target, error) {
	i := slices.IndexFunc(topo.procs, func(p *proc) bool { return p.name == "helpdesk" })
	if i < 0 {
		return nil, errors.New("the topology has no helpdesk service")
	}
	helpdesk := topo.procs[i]
	p, err := f.reference(ctx, "reference-over-service", helpdesk.grpcAddr)
	if err != nil {
		return nil, err
	}
	return &target{name: "reference-over-service", endpoint: "http://" + p.httpAddr + "/mcp", token: topo.token,
		procs: []*proc{p, helpdesk}, database: topo.database}, nil
}

// freshDatabase creates database name next to adminURL's and returns its
// URL and a function that drops it.
func freshDatabase(ctx context.Context, adminURL, name string) (string, func(), error) {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, adminURL)
	if err != nil {
		return "", nil, err
	}
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(cctx, "CREATE DATABASE "+ident); err != nil {
		_ = conn.Close(ctx)
		return "", nil, err
	}
	u, err := url.Parse(adminURL)
	if err != nil {
		_ = conn.Close(ctx)
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = conn.Exec(dctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
		_ = conn.Close(dctx)
	}
	return u.String(), drop, nil
}

// printTable starts cmd's section and writes its first markdown table: a
// line per governed shape and load.
func printTable(out io.Writer, cmd command, shapes []string, rows []row) {
	fmt.Fprintf(out, "\n### %s\n", cmd.tool)
	how := ""
	if cmd.keyed {
		how = "; a fresh idempotency key per call, so every call writes"
	}
	fmt.Fprintf(out, "\n%s over MCP (go-sdk client, loopback%s), %s/%s, %d CPUs, %s\n\n",
		cmd.tool, how, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format(time.DateTime+" UTC"))
	tw := tabwriter.NewWriter(out, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "| shape\t protocol\t callers\t calls\t governed / ungoverned\t calls/s gov vs ref\t p50 gov vs ref\t CPU per call gov vs ref\t allocs per call gov vs ref\t")
	fmt.Fprintln(tw, "|---\t---\t---\t---\t---\t---\t---\t---\t---\t")
	for _, s := range shapes {
		for _, r := range rows {
			g := r.governed[s]
			cpu := fmt.Sprintf("%s vs %s", ms(g.cpuPerCall()), ms(r.ref.cpuPerCall()))
			if g.pgCPU > 0 {
				cpu = fmt.Sprintf("%s + %s Postgres vs %s", ms(g.cpuPerCall()), ms(g.pgPerCall()), ms(r.ref.cpuPerCall()))
			}
			proto := g.protocol
			if r.ref.protocol != g.protocol {
				proto += " (ref " + r.ref.protocol + ")"
			}
			fmt.Fprintf(tw, "| %s\t %s\t %d\t %d\t %s\t %.0f vs %.0f\t %s vs %s\t %s\t %.0f vs %.0f\t\n",
				s, proto, r.callers, g.calls, r.ratio(s), g.rate(), r.ref.rate(),
				ms(g.p50), ms(r.ref.p50), cpu, g.allocsPerCall(), r.ref.allocsPerCall())
		}
	}
	_ = tw.Flush()
	for _, r := range rows {
		g, ok := r.governed[shapeTopo]
		if !ok {
			continue
		}
		fmt.Fprintf(out, "\n%s, %s, callers %d — CPU/allocs per call by process: %s", shapeTopo, g.protocol, r.callers, g.byProcess())
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "\nCPU: user+system time of the server processes over the measured calls (getrusage; Postgres from /proc);")
	fmt.Fprintln(out, "allocs: heap objects (runtime.MemStats.Mallocs) of the same processes. The client's own cost is in neither.")
	if len(rows) > 0 && len(rows[0].ratios[shapes[0]]) > 1 {
		fmt.Fprintf(out, "governed / ungoverned: the median of %d rounds (lowest–highest), each the reference and then every shape;\n", len(rows[0].ratios[shapes[0]]))
		fmt.Fprintln(out, "calls: all rounds'; calls/s, p50, CPU and allocs are over all of them.")
	}
}

// printOverService writes the second table: the separate topology against
// its own ungoverned reference, which calls the same helpdesk service over
// gRPC on the same Postgres. Its last column but one is that reference
// against the in-memory one: what the backend path alone reaches, before
// any governance.
func printOverService(out io.Writer, cmd command, rows []row) {
	if !slices.ContainsFunc(rows, func(r row) bool { return r.overService.calls > 0 }) {
		return
	}
	fmt.Fprintf(out, "\n%s, %s against the same backend ungoverned: a plain go-sdk server whose tool calls the topology's helpdesk\n", cmd.tool, shapeTopo)
	fmt.Fprintln(out, "service over gRPC as the executor does (its service token, the caller's token on behalf of), on the same Postgres.")
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "| protocol\t callers\t governed / ungoverned over the service\t ungoverned over the service / in-memory reference\t calls/s gov vs ref\t p50 gov vs ref\t CPU per call gov vs ref\t allocs per call gov vs ref\t")
	fmt.Fprintln(tw, "|---\t---\t---\t---\t---\t---\t---\t---\t")
	for _, r := range rows {
		g, o := r.governed[shapeTopo], r.overService
		if o.calls == 0 {
			continue
		}
		fmt.Fprintf(tw, "| %s\t %d\t %s\t %s\t %.0f vs %.0f\t %s vs %s\t %s + %s Postgres vs %s + %s Postgres\t %.0f vs %.0f\t\n",
			g.protocol, r.callers, medianRange(r.overRatios), medianRange(r.overOfInMemory), g.rate(), o.rate(),
			ms(g.p50), ms(o.p50), ms(g.cpuPerCall()), ms(g.pgPerCall()), ms(o.cpuPerCall()), ms(o.pgPerCall()),
			g.allocsPerCall(), o.allocsPerCall())
	}
	_ = tw.Flush()
	for _, r := range rows {
		o := r.overService
		if o.calls == 0 {
			continue
		}
		fmt.Fprintf(out, "\nungoverned over the service, %s, callers %d — CPU/allocs per call by process: %s", o.protocol, r.callers, o.byProcess())
	}
	fmt.Fprintln(out)
}

// byProcess prints each process's CPU and allocations per call, then the
// database's CPU per call: "executor 0.62 ms/402, …, Postgres 0.77 ms".
func (m measurement) byProcess() string {
	parts := make([]string, 0, len(m.byProc)+1)
	for _, c := range m.byProc {
		parts = append(parts, fmt.Sprintf("%s %s/%.0f", c.name, ms(c.cpu/time.Duration(m.calls)), float64(c.mallocs)/float64(m.calls)))
	}
	parts = append(parts, "Postgres "+ms(m.pgPerCall()))
	return strings.Join(parts, ", ")
}

// printMemory reports every server's resident set after the run.
func printMemory(ctx context.Context, out io.Writer, f *fleet) error {
	var parts []string
	for _, p := range f.procs {
		if p.stopped {
			continue
		}
		s, err := p.stats(ctx)
		if err != nil {
			return err
		}
		parts = append(parts, fmt.Sprintf("%s %.0f MiB", p.name, float64(s.RSSKiB)/1024))
	}
	fmt.Fprintf(out, "RSS after the run: %s\n", strings.Join(parts, ", "))
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

package catalog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/tooldesc"
)

// OpsReadPermission is what reading the whole manifest, any command's slice
// and (unless the manifest declares otherwise for ops.review) the review
// takes.
const OpsReadPermission = "ops.read"

// ReviewCommand is the code of the review as a governed command.
const ReviewCommand = "ops.review"

// maxMemo bounds the memo of visible sets; it holds one entry per distinct
// (features, permissions) combination, which real directories keep small.
const maxMemo = 4096

// Config wires a Catalog.
type Config struct {
	// Manifest is the loaded manifest. Required.
	Manifest *manifest.Set
	// Directory is the policy directory. Required. The Catalog keeps its own
	// directory.Cache over it and watches it for changes.
	Directory directory.Store
	// CacheTTL bounds how long a resolution is served from memory when a
	// change announcement is lost (default: the directory.Cache default).
	CacheTTL time.Duration
	// ConfirmSideEffects is the deployment's --confirm-side-effects, which
	// the executor enforces (executor.Config.ConfirmSideEffects): every
	// command with declared side effects requires confirmation. The tool
	// descriptors and the review state it, so that what an agent is told
	// agrees with what the executor does; give both the same value.
	ConfirmSideEffects bool
	// TrustedServices lists the Mandate services (service token names, e.g.
	// "executor") whose relayed calls to ops.review are served. Empty means
	// any Mandate service.
	TrustedServices []string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Tool is one command as the catalog lists it. Tools are built once per
// Catalog and shared: callers must not modify them.
type Tool struct {
	// Command is the declaration.
	Command *manifest.Command
	// Descriptor is the MCP tool descriptor (tooldesc.FromCommand).
	Descriptor tooldesc.Tool
	// JSON is Descriptor as canonical compact JSON.
	JSON []byte
}

// NewTool projects a command into the tool the catalog lists in a
// deployment with options o: its MCP descriptor and that descriptor's
// canonical JSON. A client that holds the same manifest as the catalog (the
// MCP bridge) rebuilds the catalog's tools with it.
func NewTool(cmd *manifest.Command, o tooldesc.Options) (*Tool, error) {
	desc := tooldesc.FromCommand(cmd, o)
	js, err := manifest.Canonical(desc, false)
	if err != nil {
		return nil, fmt.Errorf("catalog: tool descriptor of %s: %w", cmd.Code, err)
	}
	return &Tool{Command: cmd, Descriptor: desc, JSON: js}, nil
}

// Name is the tool name, which is the command code.
func (t *Tool) Name() string { return t.Command.Code }

// ToolSet is what one principal may see.
type ToolSet struct {
	// Active is false when the directory says the principal may do nothing;
	// Tools is then empty.
	Active bool
	// Reason says why the principal is inactive (a directory.Reason*
	// constant); empty when active.
	Reason string
	// Tools are the visible tools, sorted by name. The slice is shared
	// between principals with the same permissions: do not modify it.
	Tools []*Tool
	// ManifestDigest names the manifest the tools come from.
	ManifestDigest string
}

// Names returns the tool names, sorted.
func (ts ToolSet) Names() []string {
	out := make([]string, len(ts.Tools))
	for i, t := range ts.Tools {
		out[i] = t.Name()
	}
	return out
}

// Catalog serves the tools, the manifest and its review to principals. It
// is safe for concurrent use. Close releases its directory watch.
type Catalog struct {
	set     *manifest.Set
	cache   *directory.Cache
	hub     *hub
	log     *slog.Logger
	trusted []string
	opts    tooldesc.Options

	tools       map[string]*Tool // every command of the manifest, drafts included
	published   []*Tool          // published commands, sorted by code
	slices      map[string][]byte
	findings    []Finding
	prompt      string
	reviewPerms []string

	memoMu sync.Mutex
	memo   map[string][]*Tool
}

// New validates cfg, projects every command into its tool descriptor, cuts
// the manifest into per-command slices, reviews the manifest and starts
// watching the directory. Call Close when done.
func New(cfg Config) (*Catalog, error) {
	switch {
	case cfg.Manifest == nil:
		return nil, errors.New("catalog: Config.Manifest is required")
	case cfg.Directory == nil:
		return nil, errors.New("catalog: Config.Directory is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Catalog{
		set:     cfg.Manifest,
		hub:     newHub(),
		log:     cfg.Logger,
		trusted: slices.Clone(cfg.TrustedServices),
		opts:    tooldesc.Options{ConfirmSideEffects: cfg.ConfirmSideEffects},
		tools:   map[string]*Tool{},
		memo:    map[string][]*Tool{},
	}
	for _, cmd := range cfg.Manifest.Commands() {
		t, err := NewTool(cmd, c.opts)
		if err != nil {
			return nil, err
		}
		c.tools[cmd.Code] = t
		if cmd.Published() {
			c.published = append(c.published, t)
		}
	}
	var err error
	if c.slices, err = commandSlices(cfg.Manifest.Bytes()); err != nil {
		return nil, fmt.Errorf("catalog: %w", err)
	}
	c.findings = Review(cfg.Manifest.Manifest(), c.opts)
	c.prompt = ToPrompt(cfg.Manifest.Manifest(), c.opts)
	c.reviewPerms = []string{OpsReadPermission}
	if cmd, ok := cfg.Manifest.ByCode(ReviewCommand); ok {
		c.reviewPerms = cmd.Permissions
	}
	// Started last: nothing above can fail after the watch is running.
	c.cache = directory.NewCache(cfg.Directory, directory.CacheOptions{TTL: cfg.CacheTTL, OnInvalidate: c.hub.notify})
	return c, nil
}

// Close stops watching the directory. Open Watch streams end when their
// context does; they stop receiving changes now.
func (c *Catalog) Close() { c.cache.Close() }

// ManifestDigest returns the digest of the catalog's manifest.
func (c *Catalog) ManifestDigest() string { return c.set.Digest() }

// Tools returns the tools p may see. An inactive principal gets an inactive,
// empty set, not an error; the error is reserved for directory failures.
func (c *Catalog) Tools(ctx context.Context, p identity.Principal) (ToolSet, error) {
	res, err := c.resolve(ctx, p)
	if err != nil {
		return ToolSet{}, err
	}
	return c.toolSet(res), nil
}

// Tool returns one tool p may see, or refuses with command.not_found.
func (c *Catalog) Tool(ctx context.Context, p identity.Principal, code string) (*Tool, error) {
	res, err := c.resolve(ctx, p)
	if err != nil {
		return nil, err
	}
	t, ok := c.tools[code]
	if !ok || !Visible(t.Command, res) {
		return nil, notFound()
	}
	return t, nil
}

// Manifest returns the manifest verbatim to an active holder of
// OpsReadPermission: it holds the schemas of every command, including those
// the caller may not run.
func (c *Catalog) Manifest(ctx context.Context, p identity.Principal) ([]byte, error) {
	res, err := c.resolve(ctx, p)
	if err != nil {
		return nil, err
	}
	if err := requireAll(res, []string{OpsReadPermission}, "reading the whole manifest"); err != nil {
		return nil, err
	}
	return c.set.Bytes(), nil
}

// CommandSlice returns the command's entry of the manifest, byte for byte,
// to a caller who may see the command or holds OpsReadPermission; anyone
// else gets command.not_found.
func (c *Catalog) CommandSlice(ctx context.Context, p identity.Principal, code string) ([]byte, error) {
	res, err := c.resolve(ctx, p)
	if err != nil {
		return nil, err
	}
	t, ok := c.tools[code]
	if !ok || (!Visible(t.Command, res) && !res.HasPermission(OpsReadPermission)) {
		return nil, notFound()
	}
	return c.slices[code], nil
}

// Report is the review of the catalog's manifest.
type Report struct {
	// Findings, sorted as Review sorts them.
	Findings []Finding
	// ManifestDigest names the reviewed manifest.
	ManifestDigest string
	// Prompt is ToPrompt of the manifest, when narration was asked for.
	Prompt string
}

// Review returns the review to a caller relayed by a Mandate service (the
// executor runs ops.review through the pipeline; a direct call would skip
// the audit trail) who holds the permissions ops.review declares.
func (c *Catalog) Review(ctx context.Context, p identity.Principal, narrate bool) (Report, error) {
	if p.Via == "" || (len(c.trusted) > 0 && !slices.Contains(c.trusted, p.Via)) {
		return Report{}, notViaExecutor()
	}
	res, err := c.resolve(ctx, p)
	if err != nil {
		return Report{}, err
	}
	if err := requireAll(res, c.reviewPerms, ReviewCommand); err != nil {
		return Report{}, err
	}
	r := Report{Findings: slices.Clone(c.findings), ManifestDigest: c.set.Digest()}
	if narrate {
		r.Prompt = c.prompt
	}
	return r, nil
}

// resolve asks the directory about p; an error is a directory failure.
func (c *Catalog) resolve(ctx context.Context, p identity.Principal) (directory.Resolution, error) {
	res, err := c.cache.Resolve(ctx, p.Tenant, p.UserID, p.AgentID)
	res = res.Admit(p.IssuedAt)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return res, ctxErr
		}
		c.log.ErrorContext(ctx, "directory lookup failed", "tenant", p.Tenant, "error", err)
		return res, directoryUnavailable(err)
	}
	return res, nil
}

func requireAll(res directory.Resolution, perms []string, what string) error {
	if !res.Active {
		return inactive(res.Reason)
	}
	for _, perm := range perms {
		if !res.HasPermission(perm) {
			return permissionDenied(perm, what)
		}
	}
	return nil
}

// Visible is the catalog's rule, the pipeline's too
// (directory.Resolution.MayCall): an active principal sees a command when
// it is published, its tenant has the command's required feature, and its
// user holds every permission the command declares.
func Visible(cmd *manifest.Command, res directory.Resolution) bool { return res.MayCall(cmd) }

// toolSet derives the visible set from a resolution. The set depends only
// on the resolution's features and permissions, so it is memoised by them:
// principals holding the same roles share an entry, and an entry can never
// go stale.
func (c *Catalog) toolSet(res directory.Resolution) ToolSet {
	ts := ToolSet{Active: res.Active, Reason: res.Reason, ManifestDigest: c.set.Digest()}
	if !res.Active {
		return ts
	}
	key := strings.Join(res.Features, "\x00") + "\x01" + strings.Join(res.Permissions, "\x00")
	c.memoMu.Lock()
	tools, ok := c.memo[key]
	c.memoMu.Unlock()
	if !ok {
		tools = []*Tool{}
		for _, t := range c.published {
			if Visible(t.Command, res) {
				tools = append(tools, t)
			}
		}
		c.memoMu.Lock()
		if len(c.memo) >= maxMemo {
			clear(c.memo)
		}
		c.memo[key] = tools
		c.memoMu.Unlock()
	}
	ts.Tools = tools
	return ts
}

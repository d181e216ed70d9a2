package api

import (
	"context"
	"errors"
	"log/slog"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/catalog"
)

// ContentTypeJSON is the media type of the manifest and its slices.
const ContentTypeJSON = "application/json"

// Service implements mandate.v1.CatalogService.
type Service struct {
	mandatev1.UnimplementedCatalogServiceServer
	cat *catalog.Catalog
	log *slog.Logger
}

// New returns the service over the catalog domain.
func New(c *catalog.Catalog, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	return &Service{cat: c, log: log}
}

// Register adds the service to a gRPC server.
func (s *Service) Register(g grpc.ServiceRegistrar) { mandatev1.RegisterCatalogServiceServer(g, s) }

// Gateway registers the REST routes; pass it to server.HandleGateway.
func Gateway(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
	return mandatev1.RegisterCatalogServiceHandler(ctx, mux, conn)
}

func principal(ctx context.Context) (identity.Principal, error) {
	p, ok := identity.FromContext(ctx)
	if !ok {
		return p, failure.New(identity.Stage, failure.CodeAuthenticationMissingCredentials, "no principal")
	}
	return p, nil
}

// ListTools returns the caller's tools; an inactive caller gets none.
func (s *Service) ListTools(ctx context.Context, _ *mandatev1.ListToolsRequest) (*mandatev1.ListToolsResponse, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	ts, err := s.cat.Tools(ctx, p)
	if err != nil {
		return nil, s.mapErr(ctx, "list tools", err)
	}
	return &mandatev1.ListToolsResponse{
		Tools: toolsToProto(ts.Tools), ManifestDigest: ts.ManifestDigest,
		PrincipalActive: ts.Active, InactiveReason: ts.Reason,
	}, nil
}

// GetTool returns one of the caller's tools.
func (s *Service) GetTool(ctx context.Context, req *mandatev1.GetToolRequest) (*mandatev1.GetToolResponse, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	t, err := s.cat.Tool(ctx, p, req.GetCode())
	if err != nil {
		return nil, s.mapErr(ctx, "get tool", err)
	}
	return &mandatev1.GetToolResponse{Tool: toolToProto(t), ManifestDigest: s.cat.ManifestDigest()}, nil
}

// GetManifest returns the manifest verbatim.
func (s *Service) GetManifest(ctx context.Context, _ *mandatev1.GetManifestRequest) (*mandatev1.GetManifestResponse, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	raw, err := s.cat.Manifest(ctx, p)
	if err != nil {
		return nil, s.mapErr(ctx, "get manifest", err)
	}
	return &mandatev1.GetManifestResponse{Manifest: raw, Digest: s.cat.ManifestDigest(), ContentType: ContentTypeJSON}, nil
}

// GetCommandSlice returns one command's manifest entry verbatim.
func (s *Service) GetCommandSlice(ctx context.Context, req *mandatev1.GetCommandSliceRequest) (*mandatev1.GetCommandSliceResponse, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	raw, err := s.cat.CommandSlice(ctx, p, req.GetCode())
	if err != nil {
		return nil, s.mapErr(ctx, "get command slice", err)
	}
	return &mandatev1.GetCommandSliceResponse{
		Code: req.GetCode(), Command: raw, ManifestDigest: s.cat.ManifestDigest(), ContentType: ContentTypeJSON,
	}, nil
}

// Review returns the findings over the manifest (the ops.review command).
func (s *Service) Review(ctx context.Context, req *mandatev1.ReviewRequest) (*mandatev1.ReviewResponse, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	r, err := s.cat.Review(ctx, p, req.GetNarrate())
	if err != nil {
		return nil, s.mapErr(ctx, "review", err)
	}
	out := &mandatev1.ReviewResponse{ManifestDigest: r.ManifestDigest, Prompt: r.Prompt, Findings: make([]*mandatev1.Finding, 0, len(r.Findings))}
	for _, f := range r.Findings {
		out.Findings = append(out.Findings, &mandatev1.Finding{
			Rule: f.Rule, Severity: severityToProto(f.Severity), Command: f.Command, Explanation: f.Explanation,
		})
	}
	return out, nil
}

// Watch streams the caller's tool set: a snapshot, then every change.
func (s *Service) Watch(_ *mandatev1.CatalogServiceWatchRequest, stream grpc.ServerStreamingServer[mandatev1.CatalogEvent]) error {
	ctx := stream.Context()
	p, err := principal(ctx)
	if err != nil {
		return err
	}
	var sendErr error
	err = s.cat.Watch(ctx, p, func(e catalog.Event) error {
		sendErr = stream.Send(&mandatev1.CatalogEvent{
			Kind: eventKindToProto(e.Kind), Tools: toolsToProto(e.Set.Tools), Added: e.Added, Removed: e.Removed,
			ManifestDigest: e.Set.ManifestDigest, PrincipalActive: e.Set.Active, InactiveReason: e.Set.Reason,
		})
		return sendErr
	})
	switch {
	case err == nil:
		return nil
	case sendErr != nil:
		return sendErr // the client went away; its status says how
	}
	return s.mapErr(ctx, "watch", err)
}

// mapErr passes refusals through (they carry their stage and code) and
// hides everything else behind a generic error after logging it.
func (s *Service) mapErr(ctx context.Context, op string, err error) error {
	var fe *failure.Error
	switch {
	case errors.As(err, &fe):
		return fe
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return failure.ToStatus(err).Err()
	}
	s.log.ErrorContext(ctx, "catalog "+op+" failed", "error", err)
	return failure.Internal("", err)
}

func toolToProto(t *catalog.Tool) *mandatev1.Tool {
	return &mandatev1.Tool{Name: t.Name(), DescriptorJson: string(t.JSON)}
}

func toolsToProto(ts []*catalog.Tool) []*mandatev1.Tool {
	out := make([]*mandatev1.Tool, len(ts))
	for i, t := range ts {
		out[i] = toolToProto(t)
	}
	return out
}

func severityToProto(s catalog.Severity) mandatev1.FindingSeverity {
	switch s {
	case catalog.SeverityInfo:
		return mandatev1.FindingSeverity_FINDING_SEVERITY_INFO
	case catalog.SeverityWarning:
		return mandatev1.FindingSeverity_FINDING_SEVERITY_WARNING
	case catalog.SeverityCritical:
		return mandatev1.FindingSeverity_FINDING_SEVERITY_CRITICAL
	}
	return mandatev1.FindingSeverity_FINDING_SEVERITY_UNSPECIFIED
}

func eventKindToProto(k catalog.EventKind) mandatev1.CatalogEventKind {
	switch k {
	case catalog.EventSnapshot:
		return mandatev1.CatalogEventKind_CATALOG_EVENT_KIND_SNAPSHOT
	case catalog.EventChanged:
		return mandatev1.CatalogEventKind_CATALOG_EVENT_KIND_CHANGED
	}
	return mandatev1.CatalogEventKind_CATALOG_EVENT_KIND_UNSPECIFIED
}

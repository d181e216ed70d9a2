package api

import (
	"context"
	"encoding/hex"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/services/audit"
)

// Client appends to a remote audit service; it satisfies the executor's
// audit sink. The connection must carry service credentials
// (identity.UnaryClientInterceptor), which forward the caller's token, so
// the audit service files the rows under the caller's tenant.
type Client struct {
	c mandatev1.AuditServiceClient
}

// NewClient returns a client over conn.
func NewClient(conn grpc.ClientConnInterface) *Client {
	return &Client{c: mandatev1.NewAuditServiceClient(conn)}
}

// Append appends records; errors the caller may retry wrap
// audit.ErrUnavailable.
func (c *Client) Append(ctx context.Context, recs ...audit.Record) ([]audit.Stored, error) {
	req := &mandatev1.AppendRequest{}
	for i := range recs {
		req.Records = append(req.Records, recordToProto(&recs[i]))
	}
	resp, err := c.c.Append(ctx, req)
	if err != nil {
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted:
			return nil, fmt.Errorf("%w: %w", audit.ErrUnavailable, err)
		}
		return nil, err
	}
	out := make([]audit.Stored, 0, len(resp.GetRecords()))
	for _, r := range resp.GetRecords() {
		rec, err := fromProto(r)
		if err != nil {
			return nil, err
		}
		rec.Tenant = r.GetTenant()
		prev, _ := hex.DecodeString(r.GetPrevHash())
		hash, _ := hex.DecodeString(r.GetHash())
		out = append(out, audit.Stored{Record: rec, Seq: r.GetSeq(), PrevHash: prev, Hash: hash})
	}
	return out, nil
}

// PendingIntents lists intents of every tenant older than olderThan that
// have no outcome row (the executor's own authority only).
func (c *Client) PendingIntents(ctx context.Context, olderThan time.Duration, limit int) ([]audit.Stored, error) {
	return c.pending(ctx, olderThan, limit, false)
}

// UnresolvedUnknowns lists outcome rows of every tenant older than
// olderThan that say unknown and that no resolution row answers yet.
func (c *Client) UnresolvedUnknowns(ctx context.Context, olderThan time.Duration, limit int) ([]audit.Stored, error) {
	return c.pending(ctx, olderThan, limit, true)
}

func (c *Client) pending(ctx context.Context, olderThan time.Duration, limit int, unknown bool) ([]audit.Stored, error) {
	resp, err := c.c.PendingIntents(ctx, &mandatev1.PendingIntentsRequest{
		OlderThan: durationpb.New(olderThan), Limit: int32(min(limit, 1000)), UnknownOutcomes: unknown, //nolint:gosec // bounded above
	})
	if err != nil {
		return nil, err
	}
	out := make([]audit.Stored, 0, len(resp.GetRecords()))
	for _, r := range resp.GetRecords() {
		rec, err := fromProto(r)
		if err != nil {
			return nil, err
		}
		rec.Tenant = r.GetTenant()
		out = append(out, audit.Stored{Record: rec, Seq: r.GetSeq()})
	}
	return out, nil
}

func recordToProto(r *audit.Record) *mandatev1.AuditRecord {
	p := toProto(&audit.Stored{Record: *r})
	p.Seq, p.PrevHash, p.Hash = 0, "", ""
	if r.Time.IsZero() {
		p.Time = nil
	} else {
		p.Time = timestamppb.New(r.Time)
	}
	if r.Duration > 0 {
		p.Duration = durationpb.New(r.Duration)
	}
	return p
}

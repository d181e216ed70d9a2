package confirm

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Webhook delivery: the store keeps a notice for every challenge opened,
// decided and expired (NoticeStore), written with the change itself; a
// WebhookRelay in every confirm replica claims due notices (one replica at
// a time per notice), posts each to the configured URL signed by the
// Standard Webhooks scheme, and retries with backoff until the receiver
// answers 2xx or the attempts run out. Delivery is at least once: a
// receiver deduplicates by the webhook-id header, the same on every
// attempt. docs/architecture/confirmation.md#webhooks.

// WebhookSecretPrefix starts a Standard Webhooks secret: the rest is the
// HMAC key, base64.
const WebhookSecretPrefix = "whsec_"

// ParseWebhookSecret decodes a Standard Webhooks secret ("whsec_" and the
// base64 of at least 24 random bytes) into its HMAC key.
func ParseWebhookSecret(s string) ([]byte, error) {
	rest, ok := strings.CutPrefix(s, WebhookSecretPrefix)
	if !ok {
		return nil, errors.New("the webhook secret must start with " + WebhookSecretPrefix)
	}
	key, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		return nil, errors.New("the webhook secret after " + WebhookSecretPrefix + " is not base64")
	}
	if len(key) < 24 {
		return nil, fmt.Errorf("the webhook secret holds %d bytes; use at least 24 random bytes", len(key))
	}
	return key, nil
}

// SignWebhook is the webhook-signature header of a delivery by the
// Standard Webhooks scheme: "v1," and the base64 HMAC-SHA256, under key,
// of the id, the timestamp (Unix seconds) and the body joined by dots.
func SignWebhook(key []byte, id string, timestamp int64, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + strconv.FormatInt(timestamp, 10) + "."))
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// VerifyWebhook checks a delivery's headers and body as a receiver does:
// a v1 signature that matches under key, and a timestamp within tolerance
// of now. It is the check the tests (and an adopter's receiver) make.
func VerifyWebhook(key []byte, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("webhook: missing webhook-id, webhook-timestamp or webhook-signature")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("webhook: webhook-timestamp is not Unix seconds")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return errors.New("webhook: webhook-timestamp is too far from now")
	}
	want := SignWebhook(key, id, sec, body)
	for _, s := range strings.Fields(sigs) {
		if hmac.Equal([]byte(s), []byte(want)) {
			return nil
		}
	}
	return errors.New("webhook: no signature matches")
}

// WebhookConfig configures a WebhookRelay.
type WebhookConfig struct {
	// URL receives every notice as a POST; "" delivers nothing (notices
	// are dropped as they come due, so that none piles up).
	URL string
	// Key is the HMAC key (ParseWebhookSecret).
	Key []byte
	// Client posts; nil: a client with a 10 s timeout.
	Client *http.Client
	// Interval is how often the relay looks for due notices and expired
	// challenges (default 1 s).
	Interval time.Duration
	// Lease hides a claimed notice from other replicas while it is being
	// delivered (default 30 s).
	Lease time.Duration
	// MaxAttempts bounds the deliveries of one notice before it is given
	// up (kept, with its reason); default 12.
	MaxAttempts int
	// Backoff is the wait before attempt n+1 after n failed (default:
	// 1 s doubling, at most 10 min).
	Backoff func(failed int) time.Duration
	// Batch bounds the notices claimed per round (default 32).
	Batch int
	// Logger logs deliveries given up and refused; nil: discard.
	Logger *slog.Logger
	// MeterProvider records MetricWebhooks; default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// MetricWebhooks counts the relay's notices by result: delivered (the
// receiver answered 2xx), failed (an attempt to be retried), given_up
// (out of attempts, kept with the reason) and dropped (no URL is set).
const MetricWebhooks = "mandate.confirm.webhooks"

// Webhook results (the result attribute of MetricWebhooks).
const (
	WebhookDelivered = "delivered"
	WebhookFailed    = "failed"
	WebhookGivenUp   = "given_up"
	WebhookDropped   = "dropped"
)

// WebhookRelay delivers the notices of a NoticeStore.
type WebhookRelay struct {
	store NoticeStore
	svc   *Service
	cfg   WebhookConfig
	count metric.Int64Counter
	by    map[string][]metric.AddOption
}

// NewWebhookRelay returns a relay over store; svc renders what a notice
// says about its challenge (title, summary, amounts, approval URL).
func NewWebhookRelay(store NoticeStore, svc *Service, cfg WebhookConfig) *WebhookRelay {
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 30 * time.Second
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 12
	}
	if cfg.Backoff == nil {
		cfg.Backoff = func(failed int) time.Duration {
			d := time.Second << min(failed-1, 20)
			return min(d, 10*time.Minute)
		}
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 32
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	r := &WebhookRelay{store: store, svc: svc, cfg: cfg, by: map[string][]metric.AddOption{}}
	c, err := cfg.MeterProvider.Meter("mandate/confirm").Int64Counter(MetricWebhooks, metric.WithUnit("{notice}"),
		metric.WithDescription("Webhook notices of the confirm service, by result: delivered, failed (to be retried), given_up (out of attempts) or dropped (no URL set)."))
	if err != nil {
		cfg.Logger.Warn("webhook metric unavailable", "error", err)
	}
	r.count = c
	for _, res := range []string{WebhookDelivered, WebhookFailed, WebhookGivenUp, WebhookDropped} {
		r.by[res] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("result", res)))}
	}
	return r
}

// counted adds one notice of result to MetricWebhooks.
func (r *WebhookRelay) counted(ctx context.Context, result string) {
	if r.count != nil {
		r.count.Add(context.WithoutCancel(ctx), 1, r.by[result]...)
	}
}

// Run delivers until ctx ends.
func (r *WebhookRelay) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := r.Once(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("webhook relay: a round failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Once is one round: it records the expiry of challenges nobody decided in
// time, deletes those past the store's retention (Purger), then claims the
// due notices and delivers each. It returns how many
// were delivered.
func (r *WebhookRelay) Once(ctx context.Context) (int, error) {
	if _, err := r.store.ExpireDue(ctx, r.cfg.Batch); err != nil {
		return 0, err
	}
	if p, ok := r.store.(Purger); ok {
		if _, err := p.PurgeExpired(ctx, r.cfg.Batch); err != nil {
			return 0, err
		}
	}
	notices, err := r.store.ClaimNotices(ctx, r.cfg.Batch, r.cfg.Lease)
	if err != nil {
		return 0, err
	}
	delivered := 0
	for _, n := range notices {
		if r.cfg.URL == "" {
			if err := r.store.NoticeDelivered(ctx, n.ID); err != nil {
				return delivered, err
			}
			r.counted(ctx, WebhookDropped)
			continue
		}
		if err := r.deliver(ctx, n); err != nil {
			reason := bounded(err.Error(), 500)
			if n.Attempts+1 >= r.cfg.MaxAttempts {
				r.cfg.Logger.Error("webhook given up", "notice", n.ID, "kind", string(n.Kind), "challenge_id", n.ChallengeID, "attempts", n.Attempts+1, "reason", reason)
				if err := r.store.NoticeGiveUp(ctx, n.ID, reason); err != nil {
					return delivered, err
				}
				r.counted(ctx, WebhookGivenUp)
				continue
			}
			if err := r.store.NoticeFailed(ctx, n.ID, r.cfg.Backoff(n.Attempts+1), reason); err != nil {
				return delivered, err
			}
			r.counted(ctx, WebhookFailed)
			continue
		}
		if err := r.store.NoticeDelivered(ctx, n.ID); err != nil {
			return delivered, err
		}
		r.counted(ctx, WebhookDelivered)
		delivered++
	}
	return delivered, nil
}

// deliver posts one notice, signed.
func (r *WebhookRelay) deliver(ctx context.Context, n Notice) error {
	body, err := json.Marshal(r.payload(n))
	if err != nil {
		return err
	}
	id := "msg_" + n.Tenant + "_" + strconv.FormatInt(n.ID, 10)
	ts := time.Now().Unix()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", SignWebhook(r.cfg.Key, id, ts, body))
	resp, err := r.cfg.Client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("the receiver answered %d", resp.StatusCode)
	}
	return nil
}

// WebhookEvent is the body of a delivery: the Standard Webhooks envelope
// (type, timestamp, data).
type WebhookEvent struct {
	Type      string           `json:"type"`
	Timestamp time.Time        `json:"timestamp"`
	Data      WebhookChallenge `json:"data"`
}

// WebhookChallenge is what a delivery says about its challenge: enough for
// a chat or e-mail bridge to tell the approver that something waits (or
// was decided), never the call's arguments — the amounts shown are the
// prompt's, and a sensitive field is never among them.
type WebhookChallenge struct {
	ChallengeID string `json:"challenge_id"`
	Tenant      string `json:"tenant"`
	Command     string `json:"command"`
	Title       string `json:"title"`
	Summary     string `json:"summary"`
	Risk        string `json:"risk"`
	// Amounts are the money arguments as the approval page shows them.
	Amounts []string `json:"amounts,omitempty"`
	// Reasons are why a human is asked, when declared conditions or
	// limits ask.
	Reasons        []string `json:"reasons,omitempty"`
	RequesterUser  string   `json:"requester_user"`
	RequesterAgent string   `json:"requester_agent,omitempty"`
	// ApproverPermission is who may decide under four eyes; "" when the
	// requesting user decides.
	ApproverPermission string    `json:"approver_permission,omitempty"`
	State              string    `json:"state"`
	CreatedAt          time.Time `json:"created_at"`
	ExpiresAt          time.Time `json:"expires_at"`
	ApprovalURL        string    `json:"approval_url"`
	DecidedBy          string    `json:"decided_by,omitempty"`
	DecidedAt          time.Time `json:"decided_at,omitzero"`
	DecisionChannel    string    `json:"decision_channel,omitempty"`
}

// payload is a notice's body.
func (r *WebhookRelay) payload(n Notice) WebhookEvent {
	c := &n.Challenge
	d := WebhookChallenge{
		ChallengeID: c.ID, Tenant: c.Tenant, Command: c.Command, Title: c.Prompt.Title, Summary: c.Prompt.Summary,
		Risk: c.Risk, Reasons: c.Prompt.Reasons, RequesterUser: c.RequesterUser, RequesterAgent: c.RequesterAgent,
		ApproverPermission: c.Approver.Permission, State: string(c.State), CreatedAt: c.CreatedAt, ExpiresAt: c.ExpiresAt,
		DecidedBy: c.DecidedBy, DecidedAt: c.DecidedAt, DecisionChannel: c.DecisionChannel,
	}
	if r.svc != nil {
		d.Amounts = r.svc.Amounts(c)
		d.ApprovalURL = r.svc.ApprovalURL(c.ID)
	}
	return WebhookEvent{Type: string(n.Kind), Timestamp: n.At.UTC(), Data: d}
}

// bounded cuts s to at most n bytes.
func bounded(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

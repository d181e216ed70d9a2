package confirm_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
)

// TestOpenWithAPreview: the effect lines of a backend's preview are kept in the prompt,
// neutralised, with the preview digest, which the grant carries; lines without a digest, too
// many lines, an empty or too long line and a malformed digest are refused (schema.invalid).
func TestOpenWithAPreview(t *testing.T) {
	f := setup(t, false)
	ctx := context.Background()
	open := func(inv string, effects []string, digest string) (confirm.Challenge, error) {
		return f.svc.Open(ctx, aliceViaExecutor, confirm.OpenRequest{
			Command: "ticket.refund", InvocationDigest: confirmtest.Digest(inv), InvocationID: inv,
			ArgumentsJSON: `{"ticket_id":"T-1"}`, Effects: effects, PreviewDigest: digest,
		})
	}
	digest := confirmtest.Digest("the preview")
	c, err := open("inv-preview-1", []string{"refund 25.00 EUR of 49.90 EUR paid", "bidi \u202e here"}, digest)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"refund 25.00 EUR of 49.90 EUR paid", "bidi ⟦U+202E⟧ here"}; !slices.Equal(c.Prompt.Effects, want) || c.Prompt.PreviewDigest != digest {
		t.Fatalf("prompt effects %q, digest %q", c.Prompt.Effects, c.Prompt.PreviewDigest)
	}
	if _, err := f.svc.Decide(ctx, alice, c.ID, true, confirm.ChannelAPI); err != nil {
		t.Fatal(err)
	}
	g, err := f.svc.Redeem(ctx, aliceViaExecutor, c.ID, c.InvocationDigest, "")
	if err != nil || g.PreviewDigest != digest {
		t.Fatalf("the grant: %+v %v", g, err)
	}

	for name, tc := range map[string]struct {
		effects []string
		digest  string
	}{
		"lines without a digest": {[]string{"refund"}, ""},
		"a malformed digest":     {[]string{"refund"}, "ABC"},
		"an empty line":          {[]string{""}, digest},
		"a long line":            {[]string{strings.Repeat("x", confirm.MaxEffectBytes+1)}, digest},
		"too many lines":         {make([]string, confirm.MaxEffects+1), digest},
	} {
		if _, err := open("inv-"+name, tc.effects, tc.digest); err == nil {
			t.Errorf("%s: opened", name)
		} else {
			wantCode(t, name, err, failure.CodeSchemaInvalid)
		}
	}
	if c, err := open("inv-none", nil, ""); err != nil || c.Prompt.Effects != nil || c.Prompt.PreviewDigest != "" {
		t.Fatalf("without a preview: %+v %v", c.Prompt, err)
	}
}

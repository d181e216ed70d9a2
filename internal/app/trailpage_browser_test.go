package app

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mandate-dev/mandate/internal/browsertest"
	"github.com/mandate-dev/mandate/services/confirm/page"
)

// trailReport is what trailProbe measures.
type trailReport struct {
	InnerWidth, InnerHeight                      int64
	DocScroll, DocClient, BodyScroll, BodyClient int64
	Overflowing                                  []string
	ChainBottom, FilterBottom, FirstRowTop       float64
	Chain, Text, HTML                            string
	Rows                                         int64
}

// trailProbe measures the trail page: the widths of the document and the
// body, every element that reaches past the viewport or overflows its own
// box, where the chain status, the filters and the first row are.
const trailProbe = `(() => {
  const de = document.documentElement, vw = de.clientWidth, over = [];
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect(), cs = getComputedStyle(el);
    if (r.width === 0 && r.height === 0) continue;
    if (r.right > vw + 0.5 || r.left < -0.5 || (el.scrollWidth > el.clientWidth + 1 && cs.overflowX !== 'visible')) {
      over.push(el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') + (el.className ? '.' + el.className : '') +
        ' [' + Math.round(r.left) + ',' + Math.round(r.right) + '] scroll ' + el.scrollWidth + '/' + el.clientWidth);
    }
  }
  const q = s => document.querySelector(s);
  return {
    InnerWidth: window.innerWidth, InnerHeight: window.innerHeight,
    DocScroll: de.scrollWidth, DocClient: de.clientWidth,
    BodyScroll: document.body.scrollWidth, BodyClient: document.body.clientWidth,
    Overflowing: over,
    ChainBottom: q('#chain') ? q('#chain').getBoundingClientRect().bottom : 0,
    FilterBottom: q('#filter') ? q('#filter').getBoundingClientRect().bottom : 0,
    FirstRowTop: q('li.row') ? q('li.row').getBoundingClientRect().top : 0,
    Chain: q('#chain') ? q('#chain').innerText : '',
    Rows: document.querySelectorAll('li.row').length,
    Text: document.body.innerText,
    HTML: de.outerHTML,
  };
})()`

// TestTrailPageInABrowser opens the trail page in headless Chromium at
// desktop and phone widths (1280, 390 and 320 px), with a hostile row on
// the first screen: nothing overflows horizontally, the chain status and
// the filters are on the first screen, the hostile text shows its bidi
// overrides as markers, and filtering by outcome through the form works.
// The screenshots land in the test's temporary directory, or in
// $MANDATE_SCREENSHOTS when set.
func TestTrailPageInABrowser(t *testing.T) {
	bin := browsertest.Chromium(t)
	f := startTrailPage(t, trailOptions{})
	f.seed(t)
	link, err := page.LoginURL(f.base, f.devSecret, DefaultIssuer, "olive", "acme", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	shots := os.Getenv("MANDATE_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o750); err != nil {
		t.Fatal(err)
	}
	ctx := trailBrowser(t, bin)
	if err := chromedp.Do(ctx, chromedp.Navigate(link+"&next=/approve/audit"), chromedp.WaitVisible(chromedp.ID("trail"))); err != nil {
		t.Fatalf("signing in: %v", err)
	}
	for _, w := range []struct {
		name          string
		width, height int64
		mobile        bool
	}{
		{"desktop", 1280, 900, false},
		{"phone390", 390, 844, true},
		{"phone320", 320, 640, true},
	} {
		t.Run(w.name, func(t *testing.T) {
			var opts []chromedp.EmulateViewportOption
			if w.mobile {
				opts = append(opts, chromedp.EmulateMobile, chromedp.EmulatePortrait)
			}
			if err := chromedp.Do(ctx,
				chromedp.EmulateViewport(w.width, w.height, opts...),
				chromedp.Navigate(f.base+page.TrailPath),
				chromedp.WaitVisible(chromedp.ID("chain")),
			); err != nil {
				t.Fatalf("opening the trail page: %v", err)
			}
			r := trailEval(t, ctx)
			// The first screen as the visitor sees it, then the whole page.
			first, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
			if err != nil {
				t.Fatalf("screenshot: %v", err)
			}
			png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
			if err != nil {
				t.Fatalf("screenshot: %v", err)
			}
			path := filepath.Join(shots, "trail-"+w.name+".png")
			if err := os.WriteFile(path, png, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(shots, "trail-"+w.name+"-first-screen.png"), first, 0o600); err != nil {
				t.Fatal(err)
			}
			t.Logf("screenshot: %s; chain ends at %.0f px, Filter at %.0f, the first row starts at %.0f (screen %d px)",
				path, r.ChainBottom, r.FilterBottom, r.FirstRowTop, r.InnerHeight)
			if r.InnerWidth != w.width {
				t.Fatalf("viewport %d px wide, want %d", r.InnerWidth, w.width)
			}
			if r.DocScroll > r.DocClient || r.BodyScroll > r.BodyClient || len(r.Overflowing) > 0 {
				t.Fatalf("horizontal overflow at %d px: document %d > %d, body %d > %d, elements %v",
					w.width, r.DocScroll, r.DocClient, r.BodyScroll, r.BodyClient, r.Overflowing)
			}
			if r.Rows != page.TrailPageSize || !strings.Contains(r.Chain, "Chain verified: all 34 rows are intact.") {
				t.Fatalf("%d rows, chain %q", r.Rows, r.Chain)
			}
			// The first screen: whether the chain holds, the filters, and
			// the newest row begins.
			for what, bottom := range map[string]float64{"the chain status": r.ChainBottom, "the Filter button": r.FilterBottom} {
				if bottom <= 0 || bottom > float64(r.InnerHeight) {
					t.Fatalf("%s ends at %.0f px, below the first screen (%d px tall)", what, bottom, r.InnerHeight)
				}
			}
			if r.FirstRowTop <= 0 || r.FirstRowTop > float64(r.InnerHeight)-40 {
				t.Fatalf("the newest row starts at %.0f px, not on the first screen (%d px tall)", r.FirstRowTop, r.InnerHeight)
			}
			for _, c := range []string{"\u202e", "\u202c", "\u2066", "\u2069", "\u200f"} {
				if strings.Contains(r.Text, c) || strings.Contains(r.HTML, c) {
					t.Fatalf("%q is on the page raw", c)
				}
			}
			if !strings.Contains(r.Text, "⟦U+202E⟧RUE 00.52⟦U+202C⟧") || strings.Contains(r.Text, "CARD-SECRET") {
				t.Fatal("the hostile row is not shown with markers, or its arguments are")
			}
		})
	}
	// Filter through the form: refused rows only.
	if err := chromedp.Do(ctx,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(f.base+page.TrailPath),
		chromedp.WaitVisible(chromedp.ID("filter")),
		chromedp.SetValue(chromedp.CSS(`select[name="outcome"]`), "refused"),
		chromedp.Click(chromedp.ID("filter")),
		chromedp.WaitNotPresent(chromedp.CSS(`li.row[data-outcome="executed"]`)),
	); err != nil {
		t.Fatalf("filtering: %v", err)
	}
	if r := trailEval(t, ctx); r.Rows != 1 || !strings.Contains(r.Text, "authorization.permission_denied") {
		t.Fatalf("filtered by refused: %d rows\n%s", r.Rows, r.Text)
	}
}

func trailEval(t *testing.T, ctx context.Context) trailReport {
	t.Helper()
	r, err := chromedp.Run(ctx, chromedp.Evaluate[trailReport](trailProbe))
	if err != nil {
		t.Fatalf("evaluating the probe: %v", err)
	}
	return r
}

// trailBrowser starts headless Chromium; the returned context ends it, at
// the latest after 90 s.
func trailBrowser(t *testing.T, bin string) context.Context {
	t.Helper()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(bin),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	t.Cleanup(cancelAlloc)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelTab)
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

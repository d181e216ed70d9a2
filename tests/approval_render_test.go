package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mandate-dev/mandate/internal/browsertest"
)

// TestApprovalPageRendersByDeclaration opens the approval page of
// `mandate dev` in headless Chromium for a normal refund and for a hostile
// one (issue 11 §5: the agent's reason carries bidi overrides that make it
// read "25.00 EUR" while amount_minor is 4990), at desktop and phone
// widths, and checks in the DOM that the amount reads as declared, that the
// reason is marked as the agent's text with the overrides shown as markers
// and never present raw, and that nothing overflows horizontally. The
// screenshots land in the test's temporary directory, or in
// $MANDATE_SCREENSHOTS when set.
func TestApprovalPageRendersByDeclaration(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary and a browser")
	}
	chrome := browsertest.Chromium(t)
	d := startDev(t)
	carolLink := signInLink(t, d, "carol")
	bot := d.tokens["finance-bot@carol"]
	if bot == "" {
		t.Fatalf("no finance-bot@carol token in %v", d.tokens)
	}

	const overrides = "\u202eRUE 00.52\u202c \u2066\u200f\u2069"
	cases := []struct {
		name, amount, reason string
		wantMoney            string
		bidi                 bool
	}{
		{"normal", "2500", "Charged twice for order 4411", "25.00 EUR", false},
		// All of what was paid: the helpdesk's preview refuses more before
		// anyone is asked.
		{"hostile", "4990", "Customer agreed to the refund of: " + overrides + " — a very long justification " +
			strings.Repeat("withoutanyspacesatallsothatitmustwrap", 4), "49.90 EUR", true},
	}
	urls := map[string]string{}
	for _, tc := range cases {
		reason, _ := json.Marshal(tc.reason)
		body := `{"input":{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"` + tc.amount + `"},"reason":` +
			string(reason) + `,"cardholder_reference":"CH4242424242"}}`
		code, res := do(t, http.MethodPost, d.base+"/v1/commands/ticket.refund:execute", bot, body)
		if code != http.StatusUnprocessableEntity || res["code"] != "confirmation.required" {
			t.Fatalf("%s refund: %d %v", tc.name, code, res)
		}
		approvalURL, _ := res["approval_url"].(string)
		if approvalURL == "" {
			t.Fatalf("%s refund: no approval URL in %v", tc.name, res)
		}
		urls[tc.name] = approvalURL
	}

	shots := os.Getenv("MANDATE_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o750); err != nil {
		t.Fatal(err)
	}
	browser := headlessChromium(t, chrome, 120*time.Second)
	if err := chromedp.Do(browser, chromedp.Navigate(carolLink), chromedp.WaitVisible(chromedp.ID("pending"))); err != nil {
		t.Fatalf("carol signing in: %v", err)
	}

	widths := []struct {
		name          string
		width, height int64
		mobile        bool
	}{
		{"desktop", 1280, 900, false},
		{"phone390", 390, 844, true},
		{"phone320", 320, 640, true},
	}
	for _, tc := range cases {
		for _, w := range widths {
			t.Run(tc.name+"/"+w.name, func(t *testing.T) {
				var opts []chromedp.EmulateViewportOption
				if w.mobile {
					opts = append(opts, chromedp.EmulateMobile, chromedp.EmulatePortrait)
				}
				if err := chromedp.Do(browser,
					chromedp.EmulateViewport(w.width, w.height, opts...),
					chromedp.Navigate(urls[tc.name]),
					chromedp.WaitVisible(chromedp.ID("fields")),
				); err != nil {
					t.Fatalf("opening the approval page: %v", err)
				}
				r := evalJSON[renderReport](t, browser, renderProbe)
				path := filepath.Join(shots, "approval-"+tc.name+"-"+w.name+".png")
				png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
				if err != nil {
					t.Fatalf("screenshot: %v", err)
				}
				if err := os.WriteFile(path, png, 0o600); err != nil {
					t.Fatal(err)
				}
				t.Logf("screenshot: %s", path)

				if r.InnerWidth != w.width {
					t.Fatalf("viewport %d px wide, want %d", r.InnerWidth, w.width)
				}
				if r.DocScroll > r.DocClient || r.BodyScroll > r.BodyClient || len(r.Overflowing) > 0 {
					t.Fatalf("horizontal overflow at %d px: document %d > %d, body %d > %d, elements %v",
						w.width, r.DocScroll, r.DocClient, r.BodyScroll, r.BodyClient, r.Overflowing)
				}
				if !strings.Contains(r.Amount, tc.wantMoney) || !strings.Contains(r.Amount, tc.amount+" minor units") {
					t.Fatalf("the amount reads %q, want %q and its minor units", r.Amount, tc.wantMoney)
				}
				if !strings.Contains(r.ReasonLabel, "written by the agent finance-bot") || r.ReasonKind != "text" {
					t.Fatalf("the reason is not marked as the agent's text: label %q, kind %q", r.ReasonLabel, r.ReasonKind)
				}
				if r.Withheld != "[withheld]" || strings.Contains(r.Text, "CH4242424242") || strings.Contains(r.HTML, "CH4242424242") {
					t.Fatalf("the card reference: %q", r.Withheld)
				}
				for _, c := range []rune{'\u202e', '\u202c', '\u2066', '\u2069', '\u200f'} {
					if strings.ContainsRune(r.Text, c) || strings.ContainsRune(r.HTML, c) {
						t.Fatalf("U+%04X appears raw in the page", c)
					}
				}
				if tc.bidi {
					for _, marker := range []string{"⟦U+202E⟧RUE 00.52⟦U+202C⟧", "⟦U+2066⟧⟦U+200F⟧⟦U+2069⟧"} {
						if !strings.Contains(r.Reason, marker) || !strings.Contains(r.Text, marker) {
							t.Fatalf("the reason reads %q, want the marker %s", r.Reason, marker)
						}
					}
					// The only "25.00 EUR" on the page is inside the agent's
					// quoted text, and reversed, as sent.
					if strings.Contains(r.Text, "25.00 EUR") {
						t.Fatalf("the page shows 25.00 EUR:\n%s", r.Text)
					}
				} else if r.Reason != tc.reason {
					t.Fatalf("the reason reads %q, want %q", r.Reason, tc.reason)
				}
				// Issue 27 §5: the decision fits the first screen of a
				// phone 390 px wide (and 320, and the desktop): what, how
				// much, who asks, what it will do, Approve and Decline —
				// the details and the agent's text come after.
				t.Logf("decision screen at %d × %d: Approve ends at %.0f px, Decline at %.0f, the amount at %.0f, the effect at %.0f",
					w.width, w.height, r.ApproveBottom, r.DeclineBottom, r.AmountsBottom, r.EffectsBottom)
				for what, bottom := range map[string]float64{"Approve": r.ApproveBottom, "Decline": r.DeclineBottom, "the amount": r.AmountsBottom, "the effect": r.EffectsBottom} {
					if bottom <= 0 || bottom > float64(r.InnerHeight) {
						t.Fatalf("%s ends at %.0f px, below the first screen (%d px tall)", what, bottom, r.InnerHeight)
					}
				}
				if !strings.Contains(r.Hint, "Sends money back to the customer's card") {
					t.Fatalf("the declaration's approver hint is not on the decision screen: %q", r.Hint)
				}
				if !strings.Contains(r.Amounts, tc.wantMoney) || !strings.Contains(r.Asker, "finance-bot, an agent acting for carol") ||
					!strings.Contains(r.ExpiresIn, "expires in") || !strings.Contains(r.Next, "nothing has run yet") {
					t.Fatalf("the decision screen: amounts %q, asker %q, %q, next %q", r.Amounts, r.Asker, r.ExpiresIn, r.Next)
				}
				// Approver-facing wording: the risk explained, no code
				// markup, no example meant for the agent beside the value.
				if !strings.Contains(r.RiskMeaning, "moves money") || strings.Contains(r.Text, "`") || strings.Contains(r.Text, "e.g.") {
					t.Fatalf("risk %q; the page's text holds a backtick or an e.g.:\n%s", r.RiskMeaning, r.Text)
				}
			})
		}
	}
}

// renderReport is what renderProbe measures.
type renderReport struct {
	InnerWidth                                   int64
	DocScroll, DocClient, BodyScroll, BodyClient int64
	Overflowing                                  []string
	Amount, Reason, ReasonLabel, ReasonKind      string
	Withheld, Text, HTML                         string
	// The decision screen: where Approve, Decline, the amounts and the
	// effect lines end, in px from the top, and the viewport's height.
	InnerHeight                                                int64
	ApproveBottom, DeclineBottom, AmountsBottom, EffectsBottom float64
	Amounts, Asker, ExpiresIn, Next, RiskMeaning, Hint         string
}

// renderProbe opens the exact-JSON box, then measures the page: the
// document's and body's widths, every element that overflows its own box
// or reaches past the viewport, and the rendered text of the fields.
const renderProbe = `(() => {
  const exact = document.getElementById('exact'); if (exact) exact.open = true;
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
  const text = s => (q(s) ? q(s).innerText : '');
  return {
    InnerWidth: window.innerWidth,
    DocScroll: de.scrollWidth, DocClient: de.clientWidth,
    BodyScroll: document.body.scrollWidth, BodyClient: document.body.clientWidth,
    Overflowing: over,
    Amount: text('[data-pointer="/amount"] .f-value'),
    Reason: text('[data-pointer="/reason"] .f-agent'),
    ReasonLabel: text('[data-pointer="/reason"] .f-label'),
    ReasonKind: q('[data-pointer="/reason"]') ? q('[data-pointer="/reason"]').dataset.kind : '',
    Withheld: text('[data-pointer="/cardholder_reference"] .f-value'),
    InnerHeight: window.innerHeight,
    ApproveBottom: q('#approve') ? q('#approve').getBoundingClientRect().bottom : 0,
    DeclineBottom: q('#decline') ? q('#decline').getBoundingClientRect().bottom : 0,
    AmountsBottom: q('#amounts') ? q('#amounts').getBoundingClientRect().bottom : 0,
    EffectsBottom: q('#effects') ? q('#effects').getBoundingClientRect().bottom : 0,
    Amounts: text('#amounts'), Asker: text('#asker'), ExpiresIn: text('#expires-in'), Next: text('#next'),
    RiskMeaning: text('#risk-meaning'), Hint: text('#hint'),
    Text: document.body.innerText,
    HTML: de.outerHTML,
  };
})()`

// evalJSON evaluates expr in the page and decodes its value into T.
func evalJSON[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluating the probe: %v", err)
	}
	return v
}

// signInLink waits for the one-time sign-in link `mandate dev` prints for
// user.
func signInLink(t *testing.T, d *devProcess, user string) string {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		sc := bufio.NewScanner(strings.NewReader(d.out.String()))
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == user && strings.Contains(f[1], "/approve/login?t=") {
				return f[1]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sign-in link for %s:\n%s", user, tail(d.out.String(), 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

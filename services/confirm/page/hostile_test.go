package page_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
	"github.com/mandate-dev/mandate/services/confirm/page"
)

// xss is a value that breaks out of every context the page writes into.
const xss = `"><script>alert(1)</script><img src=x onerror='alert(1)'> javascript:alert(1) </textarea>+`

// TestHostileChallengeOnThePage: a challenge whose stored prompt is
// hostile throughout (as one from an older or compromised renderer might
// be), served by the handler: the page and the list are inert and show
// every hostile text as text.
func TestHostileChallengeOnThePage(t *testing.T) {
	f := newFixtureWith(t, nil, sampleCommands(t))
	c, err := f.confirm.Open(context.Background(), botForAlice, confirm.OpenRequest{
		Command: "ticket.refund", InvocationDigest: confirmtest.Digest("inv-xss"), InvocationID: "inv-xss",
		ArgumentsJSON: `{"ticket_id":"T-1","amount":{"currency_code":"EUR","amount_minor":"1"},"reason":"` + strings.ReplaceAll(xss, `"`, `\"`) + `"}`,
	})
	if err != nil {
		t.Fatal(err)
	}
	hostile := c
	hostile.ID, hostile.InvocationID, hostile.InvocationDigest = confirm.NewID(), "inv-xss-2", confirmtest.Digest("inv-xss-2")
	hostile.Prompt = confirm.Prompt{
		Title: "title " + xss, Summary: "summary " + xss, Risk: "risk " + xss, SideEffects: []string{"effect " + xss},
		Reversible: true, Recall: "recall " + xss, Permissions: []string{"perm " + xss},
		ArgumentsJSON: `{"x":"` + strings.ReplaceAll(xss, `"`, `\"`) + `"}`, WithheldFields: []string{"/withheld " + xss},
		RequestedBy: "requester " + xss,
	}
	if _, _, err := f.store.Create(context.Background(), hostile, time.Minute); err != nil {
		t.Fatal(err)
	}
	alice, _ := f.signIn(t, "alice", "acme")
	for _, tc := range []struct {
		name, path string
		ids        map[string]string // element id → text it must hold
	}{
		{"agent's free text", "/approve/" + c.ID, map[string]string{"fields": "Reason written by the agent support-bot\n" + xss}},
		{"stored prompt", "/approve/" + hostile.ID, map[string]string{
			"title": hostile.Prompt.Title, "summary": hostile.Prompt.Summary, "risk": hostile.Prompt.Risk,
			"side-effects": "effect " + xss, "reversible": "yes, with recall " + xss, "permissions": "perm " + xss,
			"requested-by": hostile.Prompt.RequestedBy, "withheld": "/withheld " + xss + " withheld",
			"arguments": `"x": "` + strings.ReplaceAll(xss, `"`, `\"`) + `"`,
		}},
		{"list", "/approve/", map[string]string{"pending": "title " + xss + " — requester " + xss + " · risk risk " + xss}},
	} {
		r := do(t, alice, http.MethodGet, f.srv.URL+tc.path, nil, nil)
		if r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.name, r.status, r.body)
		}
		doc := page.CheckInert(t, tc.name, r.body)
		for id, want := range tc.ids {
			if got := textOf(byID(doc, id)); !strings.Contains(got, want) {
				t.Errorf("%s: #%s reads %q, want it to hold %q", tc.name, id, got, want)
			}
		}
	}
}

// TestHostileRequestPathOnThePage: the one link the page builds from a
// request (Back, on a refused form) stays a path on the page, whatever the
// request's path segment holds.
func TestHostileRequestPathOnThePage(t *testing.T) {
	f := newFixture(t, nil)
	alice, csrf := f.signIn(t, "alice", "acme")
	segment := xss + "/../../evil?x#y"
	for _, tc := range []struct {
		name   string
		form   url.Values
		status int
	}{
		{"unknown decision", url.Values{"decision": {"maybe"}, "csrf": {csrf}}, http.StatusBadRequest},
		{"no CSRF token", url.Values{"decision": {"approve"}}, http.StatusForbidden},
	} {
		r := do(t, alice, http.MethodPost, f.srv.URL+page.Pattern+url.PathEscape(segment), tc.form, nil)
		if r.status != tc.status {
			t.Fatalf("%s: %d %s", tc.name, r.status, r.body)
		}
		doc := page.CheckInert(t, tc.name, r.body)
		back := attrOf(linkNamed(doc, "Back"), "href")
		// One path segment: its / ? # escaped too.
		if u, err := url.Parse(back); err != nil || u.Path != page.Pattern+segment || u.RawQuery != "" || u.Fragment != "" {
			t.Errorf("%s: Back links %q, want %s followed by the escaped segment", tc.name, back, page.Pattern)
		}
	}
}

func byID(doc *html.Node, id string) *html.Node {
	for n := range doc.Descendants() {
		if attrOf(n, "id") == id {
			return n
		}
	}
	return nil
}

func linkNamed(doc *html.Node, text string) *html.Node {
	for n := range doc.Descendants() {
		if n.Type == html.ElementNode && n.Data == "a" && textOf(n) == text {
			return n
		}
	}
	return nil
}

func attrOf(n *html.Node, key string) string {
	if n == nil {
		return ""
	}
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

// textOf is n's text as a browser's textContent reads it.
func textOf(n *html.Node) string {
	if n == nil {
		return ""
	}
	var b strings.Builder
	for d := range n.Descendants() {
		if d.Type == html.TextNode {
			b.WriteString(d.Data)
		}
	}
	return b.String()
}

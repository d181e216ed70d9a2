package page

// This file lays the pages out with htmlWriter (see html.go for why not
// html/template, and for the rules every line here keeps).

// writePage writes the whole document for d.
func writePage(w *htmlWriter, d *pageData) {
	w.markup(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
`)
	if d.Refresh != "" {
		w.markup(`<meta http-equiv="refresh" content="0; url=`)
		w.path(d.Refresh)
		w.markup(`">`)
	}
	w.markup("\n")
	w.element(`<title>`, d.Title, ` · Mandate</title>`+"\n")
	w.markup(pageStyle + `
</head>
<body>
<header><strong>Mandate · approvals</strong>
`)
	if d.TrailLink {
		w.markup(`<nav><a href="/approve/">Approvals</a> <a href="/approve/audit" id="trail-link">Audit trail</a></nav>` + "\n")
	}
	if d.User != "" {
		w.element(`<span>`, d.User, ` (`)
		w.text(d.Tenant)
		w.markup(`)
<form method="post" action="/approve/logout">`)
		writeCSRF(w, d.CSRF)
		w.markup(`<button type="submit" id="sign-out">Sign out</button></form></span>`)
	}
	w.markup("\n</header>\n<main>\n")
	switch d.Page {
	case "challenge":
		writeChallenge(w, d)
		w.markup("\n")
	case "index":
		writeIndex(w, d)
		w.markup("\n")
	case "signin":
		writeSignIn(w, d)
		w.markup("\n")
	case "trail":
		writeTrail(w, d)
		w.markup("\n")
	default:
		writeMessage(w, d)
	}
	w.markup("\n</main>\n</body>\n</html>\n")
}

// writeCSRF writes the hidden field that carries the session's CSRF token.
func writeCSRF(w *htmlWriter, token string) {
	w.element(`<input type="hidden" name="csrf" value="`, token, `">`)
}

func writeSignIn(w *htmlWriter, d *pageData) {
	w.markup(`<div class="card" id="signin">
<h1>Sign in with your link</h1>
<p>To see and decide approval requests, open the one-time sign-in link you were given
(for example the one <code>mandate dev</code> prints, or ask your administrator for one).
Then come back to this page.</p>
`)
	if d.Detail != "" {
		w.element(`<p class="note">`, d.Detail, `</p>`)
	}
	w.markup("\n</div>")
}

func writeMessage(w *htmlWriter, d *pageData) {
	w.element(`<div class="card" id="message">`+"\n<h1>", d.Title, "</h1>\n")
	if d.Detail != "" {
		w.element(`<p>`, d.Detail, `</p>`)
	}
	w.markup("\n")
	if d.Back != "" {
		w.markup(`<p><a href="`)
		w.path(d.Back)
		w.markup(`">Back</a></p>`)
	}
	w.markup("\n</div>")
}

func writeIndex(w *htmlWriter, d *pageData) {
	w.markup(`<div class="card" id="pending">
<h1>Waiting for you</h1>
`)
	if len(d.List) == 0 {
		w.markup(`<p>Nothing is waiting for your decision.</p>`)
	} else {
		writeItems(w, d.List)
	}
	w.markup("\n</div>")
	if len(d.Others) > 0 {
		w.markup(`
<div class="card" id="others">
<h2>Asked for by you, waiting for another approver</h2>
`)
		writeItems(w, d.Others)
		w.markup("\n</div>")
	}
}

// writeItems writes a list of waiting requests: what, who asks, how much,
// the risk and when it expires.
func writeItems(w *htmlWriter, items []listItem) {
	w.markup(`<ul class="list">` + "\n")
	for _, it := range items {
		w.markup(`<li><a href="`)
		w.path(Pattern + it.ID)
		w.element(`">`, it.Title, `</a> — `)
		w.element(``, it.RequestedBy, ``)
		if it.Amount != "" {
			w.element(` · <strong class="amount">`, it.Amount, `</strong>`)
		}
		w.element(` · risk <span class="risk">`, it.Risk, `</span> · <span class="expires">expires `)
		w.element(``, it.ExpiresIn, `</span> <span class="note">(`)
		w.element(``, it.ExpiresAt, ")</span></li>\n")
	}
	w.markup(`</ul>` + "\n")
}

// writeChallenge lays a request out decision first: the first screen of a
// phone holds what is asked, how much, who asks, what the system that runs
// it says it will do, when the request expires and Approve / Decline, with
// what follows each; the details and every argument come after.
func writeChallenge(w *htmlWriter, d *pageData) {
	if c := d.C; c != nil {
		w.element(`<div class="card" id="challenge" data-state="`, c.State, `">`+"\n")
		w.element(`<p class="top"><span class="state state-`, c.State, `" id="state">`)
		w.element(``, c.State, "</span>")
		if c.Pending {
			w.element(` <span class="expires" id="expires-in">expires `, c.ExpiresIn, `</span>`)
		}
		w.markup("</p>\n")
		w.element(`<h1 id="title">`, c.Title, "</h1>\n")
		if c.Hint != "" {
			w.element(`<p id="hint">`, c.Hint, "</p>\n")
		}
		w.element(`<p id="asks">Asked by <strong id="asker">`, c.Asker, "</strong></p>\n")
		if money := c.Money(); len(money) > 0 {
			w.markup(`<ul class="amounts" id="amounts">` + "\n")
			for _, f := range money {
				w.element(`<li><span class="a-label">`, f.Label, `</span> <strong class="a-value" dir="ltr"><bdi>`)
				w.element(``, f.Value, "</bdi></strong></li>\n")
			}
			w.markup("</ul>\n")
		}
		writeEffects(w, c)
		switch {
		case c.CanDecide:
			w.markup(`<div class="actions">` + "\n")
			writeDecision(w, d.CSRF, c.ID, "approve", `<button type="submit" id="approve">Approve</button>`)
			w.markup("\n")
			writeDecision(w, d.CSRF, c.ID, "decline", `<button type="submit" id="decline">Decline</button>`)
			w.markup("\n</div>\n")
		case c.Pending:
			w.element(`<p class="note" id="cannot-decide">`, c.CannotDecide, "</p>\n")
		}
		if c.DecidedBy != "" {
			w.element(`<p id="decision">Decided by `, c.DecidedBy, ` via `)
			w.element(``, c.Channel, ` at `)
			w.element(``, c.DecidedAt, "</p>\n")
		}
		w.element(`<p class="next" id="next">`, c.Next, "</p>\n")
		w.markup("</div>\n")

		w.markup(`<div class="card" id="details">` + "\n<h2>Details</h2>\n")
		w.element(`<p id="summary">`, c.Summary, "</p>\n<dl>\n")
		w.element(`<dt>Requested by</dt><dd id="requested-by">`, c.RequestedBy, "</dd>\n")
		if len(c.Reasons) > 0 {
			w.markup(`<dt>Why you are asked</dt><dd id="reasons">`)
			writeList(w, c.Reasons, "", "", "")
			w.markup("</dd>\n")
		}
		w.element(`<dt>Risk</dt><dd id="risk-level"><span class="risk" id="risk">`, c.Risk, `</span>`)
		if c.RiskMeaning != "" {
			w.element(` <span class="note" id="risk-meaning">— `, c.RiskMeaning, ` (levels run from L0, reads only, to L4, irreversible)</span>`)
		}
		w.markup("</dd>\n")
		w.markup(`<dt>Side effects</dt><dd id="side-effects">`)
		writeList(w, c.SideEffects, "", "", "none declared")
		w.markup("</dd>\n" + `<dt>Can be undone</dt><dd id="reversible">`)
		switch {
		case !c.Reversible:
			w.markup(`no`)
		case c.Recall != "":
			w.element(`yes, with <code>`, c.Recall, `</code>`)
		default:
			w.markup(`yes`)
		}
		w.markup("</dd>\n" + `<dt>Permissions</dt><dd id="permissions">`)
		writeList(w, c.Permissions, "<code>", "</code>", "none")
		w.markup("</dd>\n")
		w.element(`<dt>Who may decide</dt><dd id="approver">`, c.Approver, "</dd>\n")
		w.element(`<dt>Requested at</dt><dd>`, c.CreatedAt, "</dd>\n")
		if c.Pending {
			w.markup(`<dt>Expires at</dt>`)
		} else {
			w.markup(`<dt>Expired or expires at</dt>`)
		}
		w.element(`<dd id="expires">`, c.ExpiresAt, "</dd>\n")
		w.markup("</dl>\n<h2>Arguments</h2>\n")
		writeFields(w, c)
		w.element(`<details id="exact"><summary>Exact arguments as sent (JSON)</summary>
<pre id="arguments">`, c.Arguments, "</pre>\n</details>\n")
		if len(c.Withheld) > 0 {
			w.markup(`<div id="withheld">
<p class="note">These fields are sensitive. Their values were withheld before this request reached the approval service and are not shown here:</p>
<ul>`)
			for _, f := range c.Withheld {
				w.element(`<li class="withheld"><code>`, f, `</code> <em>withheld</em></li>`)
			}
			w.markup("</ul>\n</div>")
		}
		w.markup("\n</div>")
	}
	w.markup("\n" + `<p><a href="/approve/">All requests waiting for you</a></p>`)
}

// writeList writes items separated by commas, each between open and end,
// or none if there are no items.
func writeList(w *htmlWriter, items []string, open, end, none markup) {
	if len(items) == 0 {
		w.markup(none)
		return
	}
	for i, it := range items {
		if i > 0 {
			w.markup(", ")
		}
		w.element(open, it, end)
	}
}

// writeDecision writes the form that posts one decision on challenge id.
func writeDecision(w *htmlWriter, csrf, id string, decision, button markup) {
	w.markup(`<form method="post" action="`)
	w.path(Pattern + id)
	w.markup(`">`)
	writeCSRF(w, csrf)
	w.markup(`<input type="hidden" name="decision" value="` + decision + `">` + button + `</form>`)
}

// writeEffects writes what the call would do, as the command's backend
// previewed it before anyone was asked; nothing when it offers no preview.
func writeEffects(w *htmlWriter, c *challengeView) {
	if len(c.Effects) == 0 {
		return
	}
	w.markup(`<p class="effects-head">What it will do, as the system that runs it reports (checked again when the call runs):</p>
<ul class="effects" id="effects">
`)
	for _, e := range c.Effects {
		w.element(`<li class="effect" dir="ltr"><bdi>`, e, "</bdi></li>\n")
	}
	w.markup("</ul>\n")
}

// writeFields writes the arguments as the declaration reads them.
func writeFields(w *htmlWriter, c *challengeView) {
	if len(c.Fields) == 0 {
		w.markup(`<p id="fields" class="note">This command takes no arguments.</p>`)
	} else {
		w.element(`<p class="note">Each value is read by the command's declaration. Text marked
<span class="tag">written by `, c.Writer, `</span> is free text the caller chose; it is not checked and
cannot change any other value. Hidden or direction-changing characters are shown as ⟦U+…⟧ markers.</p>
<ul class="fields" id="fields">
`)
		for _, f := range c.Fields {
			w.element(`<li class="field kind-`, string(f.Kind), `" data-kind="`)
			w.element(``, string(f.Kind), `" data-pointer="`)
			w.element(``, f.Pointer, `">`+"\n")
			w.element(`<div class="f-label" dir="ltr">`, f.Label, ``)
			if f.AgentText() {
				w.element(` <span class="tag">written by `, c.Writer, `</span>`)
			}
			w.markup("</div>\n")
			if f.AgentText() {
				w.element(`<blockquote class="f-agent" dir="auto">`, f.Value, "</blockquote>\n")
			} else {
				w.element(`<div class="f-value" dir="ltr"><bdi>`, f.Value, `</bdi>`)
				if f.Raw != "" {
					w.element(` <span class="f-raw">(`, f.Raw, `)</span>`)
				}
				w.markup("</div>\n")
			}
			if f.Problem != "" {
				w.element(`<p class="f-problem">⚠ `, f.Problem, "</p>\n")
			}
			if f.Neutralised {
				w.element(`<p class="f-problem">⚠ This value `, c.NeutralisedNote, ".</p>\n")
			}
			if f.Description != "" {
				w.element(`<p class="f-desc">`, f.Description, "</p>\n")
			}
			w.markup("</li>\n")
		}
		w.markup("</ul>\n")
	}
	w.markup("\n")
}

// writeTrail lays the trail page out: the tenant's chain status, the
// filters, the rows newest first, and the way to older rows.
func writeTrail(w *htmlWriter, d *pageData) {
	if t := d.T; t != nil {
		w.element(`<div class="card" id="trail">
<h1>Audit trail</h1>
<p class="note">Every attempt recorded for tenant <strong>`, d.Tenant, `</strong>, newest first. Arguments are not shown here.</p>
`)
		if t.Chain.OK {
			w.element(`<p class="chain chain-ok" id="chain">Chain verified: all `, t.Chain.Checked, " rows are intact.</p>\n")
		} else {
			w.element(`<p class="chain chain-broken" id="chain">Chain broken at row `, t.Chain.Seq, `: `)
			w.element(``, t.Chain.Problem, ` (invocation <code>`)
			w.element(``, t.Chain.Invocation, `</code>, `)
			w.element(``, t.Chain.Phase, `). The `)
			w.element(``, t.Chain.Checked, " rows before it are intact; the trail was changed after it was written. Tell your operator.</p>\n")
		}
		w.markup(`<form method="get" action="/approve/audit" class="filters" id="filters">` + "\n")
		w.element(`<label>Agent <input name="agent" value="`, t.Agent, `" maxlength="256"></label>`+"\n")
		w.element(`<label>Command <input name="command" value="`, t.Command, `" maxlength="256"></label>`+"\n")
		w.markup(`<label>Outcome <select name="outcome"><option value="">any</option>` + "\n")
		for _, o := range t.Outcomes {
			w.element(`<option value="`, o.Value, `"`)
			if o.Selected {
				w.markup(` selected`)
			}
			w.element(`>`, o.Value, "</option>\n")
		}
		w.markup("</select></label>\n")
		w.element(`<label>Approver <input name="approver" value="`, t.Approver, `" maxlength="256"></label>`+"\n")
		if t.Size != "" {
			w.element(`<input type="hidden" name="size" value="`, t.Size, `">`)
		}
		w.markup(`<button type="submit" id="filter">Filter</button> <a href="/approve/audit">Clear</a>
</form>
</div>
<div class="card" id="rows">
`)
		if len(t.Rows) == 0 {
			w.markup(`<p id="no-rows">No rows match.</p>` + "\n")
		} else {
			w.markup(`<ol class="rows">` + "\n")
			for i := range t.Rows {
				writeTrailRow(w, &t.Rows[i])
			}
			w.markup("</ol>\n")
		}
		w.markup(`<div class="pager">` + "\n")
		if t.Older != "" {
			w.markup(`<form method="get" action="/approve/audit">`)
			writeTrailFilters(w, t)
			w.element(`<input type="hidden" name="page" value="`, t.Older, `"><button type="submit" id="older">Older rows</button></form>`+"\n")
		}
		if t.Paged {
			w.markup(`<form method="get" action="/approve/audit">`)
			writeTrailFilters(w, t)
			w.markup(`<button type="submit" id="newest">Newest rows</button></form>` + "\n")
		}
		w.markup("</div>\n</div>")
	}
	w.markup("\n" + `<p><a href="/approve/">All requests waiting for you</a></p>`)
}

// writeTrailFilters writes the filters in force as hidden fields, for the
// forms that move between pages.
func writeTrailFilters(w *htmlWriter, t *trailView) {
	for _, f := range []struct {
		name  markup
		value string
	}{{"agent", t.Agent}, {"command", t.Command}, {"outcome", t.Outcome}, {"approver", t.Approver}, {"size", t.Size}} {
		if f.value != "" {
			w.element(`<input type="hidden" name="`+f.name+`" value="`, f.value, `">`)
		}
	}
}

// writeTrailRow writes one row: what and when, for whom and by which
// agent and model, where it stopped, and the approval that let it through.
func writeTrailRow(w *htmlWriter, r *trailRow) {
	w.element(`<li class="row" data-seq="`, r.Seq, `" data-outcome="`)
	w.element(``, r.Outcome, `">`+"\n")
	w.element(`<div class="r-top"><span class="seq">#`, r.Seq, `</span> <span class="outcome o-`)
	w.element(``, r.Outcome, `">`)
	w.element(``, r.Outcome, `</span> <strong class="r-cmd" dir="ltr"><bdi>`)
	w.element(``, r.Command, `</bdi></strong>`)
	if r.Risk != "" {
		w.element(` <span class="risk">`, r.Risk, `</span>`)
	}
	w.element(` <span class="r-time">`, r.Time, "</span></div>\n")
	w.element(`<div class="r-who">`, r.Phase, ` · for <bdi class="r-user">`)
	w.element(``, r.Who, `</bdi>`)
	if r.Agent != "" {
		w.element(` · agent <bdi class="r-agent">`, r.Agent, `</bdi>`)
	}
	if r.Model != "" {
		w.element(` · model <bdi class="r-model">`, r.Model, `</bdi>`)
	}
	if r.Channel != "" {
		w.element(` · via `, r.Channel, ``)
	}
	w.markup("</div>\n")
	if r.Stage != "" || r.Code != "" {
		w.element(`<div class="r-code">stage <code>`, r.Stage, `</code> · code <code>`)
		w.element(``, r.Code, "</code></div>\n")
	}
	if r.Message != "" {
		w.element(`<div class="r-msg"><bdi>`, r.Message, "</bdi></div>\n")
	}
	if r.Approved {
		w.element(`<div class="r-approval">approved by <bdi class="r-approver">`, r.Approver, `</bdi> · assurance <code class="r-assurance">`)
		w.element(``, r.Assurance, `</code>`)
		if r.AssuranceMeaning != "" {
			w.element(` <span class="note">(`, r.AssuranceMeaning, `)</span>`)
		}
		w.element(` · channel `, r.Via, ``)
		if r.Ceiling != "" {
			w.element(` · trust ceiling <span class="r-ceiling">`, r.Ceiling, `</span>`)
		}
		if r.DecidedAt != "" {
			w.element(` · at `, r.DecidedAt, ``)
		}
		if r.Challenge != "" {
			w.element(` · challenge <code>`, r.Challenge, `</code>`)
		}
		w.markup("</div>\n")
	}
	if r.Decided {
		w.element(`<div class="r-decision">decision asked: <strong>`, r.Verdict, `</strong> · channel `)
		w.element(``, r.DecisionChannel, ` · assurance <code class="r-d-assurance">`)
		w.element(``, r.DecisionAssurance, `</code>`)
		if r.ForInvocation != "" {
			w.element(` · for invocation <code>`, r.ForInvocation, `</code>`)
		}
		w.markup("</div>\n")
	}
	w.element(`<div class="r-id note">invocation <code>`, r.Invocation, `</code>`)
	if r.Subject != "" {
		w.element(` · subject <bdi>`, r.Subject, `</bdi>`)
	}
	w.markup("</div>\n</li>\n")
}

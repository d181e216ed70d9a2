package page

import (
	"bytes"
	"net/url"
	"strings"
)

// The approval page is written by hand with htmlWriter rather than with
// html/template: html/template executes through text/template, which looks
// methods up by names known only at run time (reflect.Value.MethodByName),
// so the linker keeps every exported method of every type in any binary
// that renders a template — megabytes more for the confirm service to map
// while it idles. The page is small and fixed, so the writer keeps
// html/template's guarantees by construction instead:
//
//   - markup is only ever a constant of this package: markup is a type of
//     its own, to which a string value does not convert implicitly, so a
//     dynamic string would have to be converted on purpose to reach it
//     (nowhere in this package is one);
//   - every dynamic value goes through escapeHTML, and only into element
//     text or a double-quoted attribute that is neither an event handler,
//     a style nor a script: the page has no script at all, and its one
//     style element is constant;
//   - URLs are paths under Pattern that pagePath builds, each challenge id
//     escaped as one path segment, so no value chooses a scheme or leaves
//     the page.

// markup is HTML the page's own code wrote: element tags, attribute names,
// constant text. Only constants of this package are markup.
type markup string

// htmlWriter accumulates a page.
type htmlWriter struct{ buf bytes.Buffer }

// markup writes m as it is.
func (w *htmlWriter) markup(m markup) { w.buf.WriteString(string(m)) }

// text writes s escaped, for element text or a double-quoted attribute
// value.
func (w *htmlWriter) text(s string) { w.buf.WriteString(escapeHTML(s)) }

// element writes open, s escaped and then end: w.element(`<h1>`, title, `</h1>`).
func (w *htmlWriter) element(open markup, s string, end markup) {
	w.markup(open)
	w.text(s)
	w.markup(end)
}

// path writes p, a path on this page (see pagePath), for an href, a form's
// action or a refresh.
func (w *htmlWriter) path(p string) { w.text(pagePath(p)) }

// pagePath returns p if it is Pattern, or Pattern followed by one segment
// (a challenge id, or what a request asked for), that segment escaped with
// url.PathEscape. Any other p yields Pattern, the list: a link on the page
// never leaves it, whatever a value holds.
func pagePath(p string) string {
	rest, ok := strings.CutPrefix(p, Pattern)
	if !ok {
		return Pattern
	}
	return Pattern + url.PathEscape(rest)
}

// htmlEscaper escapes text for HTML element text and double-quoted
// attribute values exactly as html/template does in those contexts, so the
// pages read as they did when it rendered them: the five characters that
// can end a text or an attribute, or begin a tag or a character reference
// (& < > " '), and +, which html/template escapes against UTF-7 sniffing.
// NUL, which HTML parsers replace or drop, becomes U+FFFD.
var htmlEscaper = strings.NewReplacer(
	"\x00", "\uFFFD",
	`"`, "&#34;",
	"&", "&amp;",
	"'", "&#39;",
	"+", "&#43;",
	"<", "&lt;",
	">", "&gt;",
)

// escapeHTML escapes s for HTML element text or a double-quoted attribute
// value (see htmlEscaper).
func escapeHTML(s string) string { return htmlEscaper.Replace(s) }

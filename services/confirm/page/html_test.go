package page

import (
	"bytes"
	"fmt"
	"html/template"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/html"

	"github.com/mandate-dev/mandate/services/confirm"
)

// oldTemplate is the html/template the pages were rendered with before
// htmlWriter. It lives on in testdata only, so that the pages can be
// compared with it; html/template is imported by this test alone and is
// not linked into any binary.
var oldTemplate = template.Must(template.ParseFiles("testdata/page.html.tmpl"))

func renderOld(t *testing.T, d *pageData) string {
	t.Helper()
	var buf bytes.Buffer
	if err := oldTemplate.ExecuteTemplate(&buf, "page", d); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

func renderNew(d *pageData) string {
	var w htmlWriter
	writePage(&w, d)
	return w.buf.String()
}

// hostile are values an agent, a tool declaration, a directory or a
// request might smuggle into a page. All are valid UTF-8 without NUL or
// CR, so that an HTML parser gives them back as they were.
var hostile = []string{
	`"><script>alert(1)</script>`,
	`' onmouseover='alert(1)`,
	`" onfocus="alert(1)" autofocus x="`,
	`javascript:alert(1)`,
	` JaVaScRiPt:alert(1)`,
	`</textarea></title></style></pre></bdi></blockquote><script>alert(1)</script>`,
	`<!-- x --><img src=x onerror=alert(1)><svg/onload=alert(1)>`,
	`<![CDATA[ ]]><?xml x?><!DOCTYPE x>`,
	`&lt;script&gt; &amp; &#34; &#x3c; &quot +ADw-script+AD4-`,
	`{{.CSRF}} {{template "page" .}} ${x} #{x}`,
	"\u202eRUE 00.52\u202c \u2066\u200f\u2069 \u2028\u2029 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 日本語 ⚠ \uFFFD \uFDD0 \uFFFE",
	"line one\nline two\t<tab>",
	strings.Repeat(`<b onclick="x">&'+`, 1000),
}

// fill sets every string reachable from v (struct fields, slice elements,
// through pointers) to value(path), every bool to b, and gives every slice
// two elements and every nil pointer a value. It returns the strings set,
// by path. Any other kind fails the test: a new kind of field on a page
// must be added here, and so to the tests below.
func fill(t *testing.T, v reflect.Value, path string, b bool, value func(path string) string, set map[string]string) {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		s := value(path)
		v.SetString(s)
		set[path] = s
	case reflect.Bool:
		v.SetBool(b)
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		fill(t, v.Elem(), path, b, value, set)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			fill(t, v.Index(i), fmt.Sprintf("%s[%d]", path, i), b, value, set)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			fill(t, v.Field(i), path+"."+v.Type().Field(i).Name, b, value, set)
		}
	default:
		t.Fatalf("fill: %s is a %s; teach fill (and so these tests) about it", path, v.Kind())
	}
}

// variant is one way of filling pageData.
type variant struct {
	name string
	d    pageData
	set  map[string]string // the strings in d, by path
}

// challengeID is a valid challenge id (22 base64url characters).
const challengeID = "Ab0_-cdefghijklmnopqrs"

// validPath gives the challenge ids a valid id, Back and Refresh the path
// of that challenge.
func validPath(field string) string {
	if strings.HasSuffix(field, ".ID") {
		return challengeID
	}
	return Pattern + challengeID
}

// variants returns pageData for every page, with every string field set
// by value and every branch of the page taken in one variant or another.
// The challenge ids, Back and Refresh are set by path instead.
func variants(t *testing.T, value func(field string) string, path func(field string) string) []variant {
	t.Helper()
	var out []variant
	for _, page := range []string{"challenge", "index", "signin", "message", "trail"} {
		for _, b := range []bool{false, true} {
			for _, pendingUndecidable := range []bool{false, true} {
				if pendingUndecidable && page != "challenge" {
					continue
				}
				v := variant{name: fmt.Sprintf("%s/bools=%t/pendingUndecidable=%t", page, b, pendingUndecidable), set: map[string]string{}}
				fill(t, reflect.ValueOf(&v.d), "", b, value, v.set)
				v.d.Page = page
				delete(v.set, ".Page")
				// The second field is the caller's free text, the first
				// whatever kind the value says.
				v.d.C.Fields[1].Kind = confirm.KindText
				delete(v.set, ".C.Fields[1].Kind")
				if pendingUndecidable {
					v.d.C.Pending, v.d.C.CanDecide = true, false
				}
				for _, p := range []struct {
					field string
					to    *string
				}{{".Back", &v.d.Back}, {".Refresh", &v.d.Refresh}, {".C.ID", &v.d.C.ID}, {".List[0].ID", &v.d.List[0].ID}, {".List[1].ID", &v.d.List[1].ID},
					{".Others[0].ID", &v.d.Others[0].ID}, {".Others[1].ID", &v.d.Others[1].ID}} {
					*p.to = path(p.field)
					delete(v.set, p.field)
				}
				out = append(out, v)
			}
		}
	}
	return out
}

// TestPagesAreTheOldTemplatesPages: for every page and branch, with every
// text field hostile (NUL and invalid UTF-8 included) and valid paths,
// htmlWriter writes byte for byte what the old html/template did.
func TestPagesAreTheOldTemplatesPages(t *testing.T) {
	payloads := append(slices.Clone(hostile), "plain", "", "nul\x00byte", "invalid \xff\xfe utf-8 \xc3", "\r\ncr lf")
	for _, p := range payloads {
		value := func(field string) string { return p + " @" + field }
		if p == "" {
			value = func(string) string { return "" }
		}
		for _, v := range variants(t, value, validPath) {
			if got, want := renderNew(&v.d), renderOld(t, &v.d); got != want {
				t.Fatalf("%s, payload %.40q: the page differs from html/template's at byte %d:\nnew: %.300q\nold: %.300q",
					v.name, p, firstDiff(got, want), got[firstDiff(got, want):], want[firstDiff(got, want):])
			}
		}
	}
	// Paths as the handlers build them: the list, a challenge, the one
	// segment a request named.
	for _, back := range []string{"", Pattern, Pattern + challengeID, Pattern + "logout"} {
		path := func(field string) string {
			if strings.HasSuffix(field, ".ID") {
				return challengeID
			}
			return back
		}
		for _, v := range variants(t, func(f string) string { return "v" + f }, path) {
			if got, want := renderNew(&v.d), renderOld(t, &v.d); got != want {
				t.Fatalf("%s, path %q: the page differs from html/template's at byte %d", v.name, back, firstDiff(got, want))
			}
		}
	}
}

func firstDiff(a, b string) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

// FuzzEscapeHTML: escapeHTML escapes as html/template does in element
// text.
func FuzzEscapeHTML(f *testing.F) {
	for _, s := range append(slices.Clone(hostile), "", "\x00", "\xff", "a+b", "\uFDD0\uFFFF") {
		f.Add(s)
	}
	text := template.Must(template.New("").Parse(`{{.}}`))
	f.Fuzz(func(t *testing.T, s string) {
		var want bytes.Buffer
		if err := text.Execute(&want, s); err != nil {
			t.Fatal(err)
		}
		if got := escapeHTML(s); got != want.String() {
			t.Fatalf("escapeHTML(%q) = %q, html/template: %q", s, got, want.String())
		}
	})
}

func TestPagePath(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{Pattern, Pattern},
		{Pattern + challengeID, Pattern + challengeID},
		{Pattern + "logout", Pattern + "logout"},
		{Pattern + `a/b?c#d%e f"<>'`, Pattern + "a%2Fb%3Fc%23d%25e%20f%22%3C%3E%27"},
		{Pattern + "../../etc", Pattern + "..%2F..%2Fetc"},
		{"javascript:alert(1)", Pattern},
		{"//evil.example/approve/", Pattern},
		{"https://evil.example" + Pattern, Pattern},
		{"/approvex", Pattern},
		{"", Pattern},
	} {
		if got := pagePath(tc.in); got != tc.want {
			t.Errorf("pagePath(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestPagesKeepHostileValuesInert: every page and branch, every string
// field set to a hostile value (each marked with its field, so that each
// can be found), parsed as a browser would: the page has the same elements
// and attributes as with harmless values, no script element, no event
// handler, every link and form stays on the page, and every value is
// there, as text or attribute value, as it was given.
func TestPagesKeepHostileValuesInert(t *testing.T) {
	for _, p := range hostile {
		value := func(field string) string { return p + " @" + field }
		// Challenge ids are whatever the store holds; Back and Refresh a
		// path under Pattern with a segment a request named, or (never
		// so in the handlers) no path of the page at all.
		pathOf := map[bool]func(string) string{
			true: func(field string) string {
				if strings.HasSuffix(field, ".ID") {
					return value(field)
				}
				return Pattern + value(field)
			},
			false: value,
		}
		for _, path := range pathOf {
			harmless := variants(t, func(string) string { return "x" }, validPath)
			for i, v := range variants(t, value, path) {
				body := renderNew(&v.d)
				doc := CheckInert(t, v.name, body)
				if got, want := skeleton(doc), skeleton(mustParse(t, renderNew(&harmless[i].d))); !slices.Equal(got, want) {
					t.Fatalf("%s, payload %.40q: hostile values changed the page's elements or attributes:\n%v\nwant\n%v", v.name, p, got, want)
				}
				texts := contents(doc)
				for field, s := range v.set {
					if !slices.ContainsFunc(texts, func(t string) bool { return strings.Contains(t, s) }) && shown(v.d.Page, field, &v.d) {
						t.Errorf("%s: %s (%.60q) is not on the page as text", v.name, field, s)
					}
				}
				for _, u := range links(doc) {
					rest, _ := strings.CutPrefix(u, Pattern)
					seg, err := url.PathUnescape(rest)
					ours := seg == "" || seg == "logout" || seg == "audit" || strings.HasPrefix(seg, p+" @")
					if err != nil || !ours {
						t.Errorf("%s: link %.80q is not a path this page built", v.name, u)
					}
				}
			}
		}
	}
}

// shown reports whether the page kind shows field at all with d's flags.
func shown(page, field string, d *pageData) bool {
	switch {
	case field == ".Title" || field == ".User" || field == ".Tenant" || field == ".CSRF":
		return true
	case field == ".Detail":
		return page == "signin" || page == "message"
	case strings.HasPrefix(field, ".List"), strings.HasPrefix(field, ".Others"):
		return page == "index"
	case strings.HasPrefix(field, ".T."):
		return page == "trail" && shownOnTrail(field, d.T)
	case !strings.HasPrefix(field, ".C."):
		return false
	case page != "challenge":
		return false
	}
	c := d.C
	switch field {
	case ".C.Recall":
		return c.Reversible
	case ".C.CannotDecide":
		return c.Pending && !c.CanDecide
	case ".C.ExpiresIn":
		return c.Pending
	case ".C.Fields[1].Raw": // free text has no raw value to show
		return false
	case ".C.NeutralisedNote":
		return c.Fields[0].Neutralised
	}
	return true
}

// shownOnTrail reports whether the trail page shows field of t.
func shownOnTrail(field string, t *trailView) bool {
	switch {
	case strings.HasPrefix(field, ".T.Chain.") && field != ".T.Chain.Checked":
		return !t.Chain.OK
	case strings.HasPrefix(field, ".T.Rows["):
		_, name, _ := strings.Cut(field, "].")
		switch name {
		case "Approver", "Assurance", "AssuranceMeaning", "Via", "Ceiling", "DecidedAt", "Challenge":
			return t.Rows[0].Approved
		case "Verdict", "DecisionChannel", "DecisionAssurance", "ForInvocation":
			return t.Rows[0].Decided
		}
	}
	return true
}

// CheckInert parses body as a browser would and fails t if it holds a
// script element (or any other element that runs or loads something), an
// event handler, a style of its own, or a link with a scheme (javascript:
// or any other) or one that leaves the page. It returns the parsed document.
func CheckInert(t *testing.T, what, body string) *html.Node {
	t.Helper()
	doc := mustParse(t, body)
	for n := range doc.Descendants() {
		if n.Type != html.ElementNode {
			continue
		}
		if n.Data == "script" || n.Data == "iframe" || n.Data == "object" || n.Data == "embed" || n.Data == "img" || n.Data == "svg" {
			t.Errorf("%s: the page holds a <%s> element", what, n.Data)
		}
		if n.Data == "style" && (n.Parent.Data != "head" || n.FirstChild == nil || "<style>"+n.FirstChild.Data+"</style>" != string(pageStyle)) {
			t.Errorf("%s: the page holds a style element other than its own", what)
		}
		for _, a := range n.Attr {
			if strings.HasPrefix(strings.ToLower(a.Key), "on") || a.Key == "style" || a.Key == "src" || a.Key == "formaction" {
				t.Errorf("%s: <%s> has an attribute %s=%.60q", what, n.Data, a.Key, a.Val)
			}
		}
	}
	for _, link := range links(doc) {
		u, err := url.Parse(link)
		if err != nil || u.Scheme != "" || u.Host != "" || u.Opaque != "" || !strings.HasPrefix(link, Pattern) {
			t.Errorf("%s: a link leaves the page: %.80q", what, link)
		}
	}
	return doc
}

func mustParse(t *testing.T, body string) *html.Node {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// links returns every URL of the document: hrefs, form actions and the
// refresh's target.
func links(doc *html.Node) []string {
	var out []string
	for n := range doc.Descendants() {
		for _, a := range n.Attr {
			switch {
			case a.Key == "href" || a.Key == "action":
				out = append(out, a.Val)
			case a.Key == "content" && n.Data == "meta" && attr(n, "http-equiv") == "refresh":
				_, u, _ := strings.Cut(a.Val, "url=")
				out = append(out, u)
			}
		}
	}
	return out
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

// skeleton lists the document's elements in order, each with its
// attributes' names.
func skeleton(doc *html.Node) []string {
	var out []string
	for n := range doc.Descendants() {
		if n.Type != html.ElementNode {
			continue
		}
		e := n.Data
		for _, a := range n.Attr {
			e += " " + a.Key
		}
		out = append(out, e)
	}
	return out
}

// contents returns every text node and attribute value of the document.
func contents(doc *html.Node) []string {
	var out []string
	for n := range doc.Descendants() {
		if n.Type == html.TextNode {
			out = append(out, n.Data)
		}
		for _, a := range n.Attr {
			out = append(out, a.Val)
		}
	}
	return out
}

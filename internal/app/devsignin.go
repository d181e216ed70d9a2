package app

import (
	"html/template"
	"net"
	"net/http"
	"time"

	"github.com/mandate-dev/mandate/services/confirm/page"
)

// DevSignInPath is where `mandate dev` hands out fresh one-time sign-in
// links to the approval pages: the links it prints work once and expire
// after 15 minutes, and its secret is random per run, so without this a
// newcomer who used or lost them is locked out of the approval page.
const DevSignInPath = "/dev/sign-in"

// devSignIn serves DevSignInPath to a browser on this machine only: the
// list of the policy's people, each a link that redirects to a fresh
// one-time sign-in link (?user=NAME, and &tenant=T when a name repeats).
func devSignIn(base string, secret []byte, people []devPrincipal) http.Handler {
	list := template.Must(template.New("signin").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign in · mandate dev</title></head>
<body style="font:16px/1.5 system-ui,sans-serif;max-width:32rem;margin:2rem auto;padding:0 1rem">
<h1>Sign in to the approval pages</h1>
<p>Development sign-in of <code>mandate dev</code>, offered to a browser on this machine only. Each link signs you in once.</p>
<ul>{{range .}}<li><a id="signin-{{.Tenant}}-{{.User}}" href="?user={{.User}}&amp;tenant={{.Tenant}}">{{.User}}</a> ({{.Tenant}})</li>
{{end}}</ul></body></html>`))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			http.Error(w, "the development sign-in works only in a browser on the machine mandate dev runs on", http.StatusForbidden)
			return
		}
		type person struct{ User, Tenant string }
		var humans []person
		user, tenant := r.URL.Query().Get("user"), r.URL.Query().Get("tenant")
		for _, p := range people {
			if p.agent != "" {
				continue
			}
			humans = append(humans, person{p.user, p.tenant})
			if user == p.user && (tenant == "" || tenant == p.tenant) {
				link, err := page.LoginURL(base, secret, DefaultIssuer, p.user, p.tenant, 15*time.Minute)
				if err != nil {
					http.Error(w, "the sign-in link could not be made", http.StatusInternalServerError)
					return
				}
				http.Redirect(w, r, link, http.StatusSeeOther)
				return
			}
		}
		if user != "" {
			http.Error(w, "no person of the policy is called "+user, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_ = list.Execute(w, humans)
	})
}

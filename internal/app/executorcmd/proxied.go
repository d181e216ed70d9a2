package executorcmd

import "github.com/mandate-dev/mandate/internal/manifest"

// ProxiedMethod is server.Config.ProxiedMethod for a server the executor
// is registered on: the governed proxy serves the full method name of
// every command of the manifest, so the RPC metrics name those methods.
func ProxiedMethod(set *manifest.Set) func(fullMethod string) bool {
	return func(fullMethod string) bool {
		_, ok := set.ByMethod(fullMethod)
		return ok
	}
}

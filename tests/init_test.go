package tests

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInitScaffoldRunsInDev: `mandate init DIR --service orders` writes a
// module that, after the three commands it prints (go mod tidy -e, buf
// generate, go build), builds with no edits and runs in `mandate dev`: its
// backend serves the scaffold's create and get through the executor.
func TestInitScaffoldRunsInDev(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a scaffolded module and runs processes")
	}
	root, _ := filepath.Abs("..")
	bin := mandateBinary(t, root)
	dir := filepath.Join(t.TempDir(), "orders")
	out, err := exec.Command(bin, "init", dir, "--service", "orders", "--replace", root).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "go mod tidy -e && buf generate && go build ./...") {
		t.Fatalf("mandate init: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "init", dir, "--service", "orders").CombinedOutput(); err == nil || !strings.Contains(string(out), "not empty") {
		t.Fatalf("init over an existing module: %v\n%s", err, out)
	}
	built := t.TempDir()
	for _, step := range [][]string{
		{"go", "mod", "tidy", "-e"},
		{"go", "tool", "-modfile=" + filepath.Join(root, "tools", "go.mod"), "buf", "generate"},
		{"go", "build", "./..."},
		{"go", "build", "-o", built + "/", "./cmd/orders"},
	} {
		cmd := exec.Command(step[0], step[1:]...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil && step[2] != "tidy" {
			t.Fatalf("%s: %v\n%s", strings.Join(step, " "), err, out)
		}
	}
	for _, f := range []string{"gen/manifest/manifest.json", "third_party/mandate/licenses/protovalidate/LICENSE", "policy.yaml", "README.md"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("the scaffold lacks %s", f)
		}
	}

	addr := startInventory(t, filepath.Join(built, "orders"), serviceSecret, devSecret)
	t.Setenv("MANDATE_SERVICE_SECRET", serviceSecret)
	t.Setenv("MANDATE_DEV_SECRET", devSecret)
	dev := startDev(t,
		"--manifest", filepath.Join(dir, "gen", "manifest", "manifest.json"),
		"--descriptors", filepath.Join(dir, "gen", "manifest", "descriptors.binpb"),
		"--backend", "orders.v1.OrdersService="+addr,
		"--policy", filepath.Join(dir, "policy.yaml"))
	code, body := do(t, http.MethodPost, dev.base+"/v1/commands/orders.item.create:execute", dev.tokens["orders-bot@dana"], `{"input":{"title":"First"}}`)
	res, _ := body["result"].(map[string]any)
	if code != http.StatusOK || res["item_id"] != "I-1" || res["created_by"] != "dana" {
		t.Fatalf("orders.item.create: %d %v", code, body)
	}
	code, body = do(t, http.MethodPost, dev.base+"/v1/commands/orders.item.get:execute", dev.tokens["rick"], `{"input":{"item_id":"I-1"}}`)
	if res, _ := body["result"].(map[string]any); code != http.StatusOK || res["title"] != "First" {
		t.Fatalf("orders.item.get: %d %v", code, body)
	}
	code, body = do(t, http.MethodPost, dev.base+"/v1/commands/orders.item.create:execute", dev.tokens["rick"], `{"input":{"title":"Second"}}`)
	if code != http.StatusForbidden || !strings.Contains(jsonOf(body), "authorization.permission_denied") {
		t.Fatalf("a reader creating: %d %v", code, body)
	}
}

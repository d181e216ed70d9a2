// Command codestable writes the table of codes (internal/failure) into the
// README between its codes:begin and codes:end markers.
//
//	go run ./internal/failure/cmd/codestable -readme README.md
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/mandate-dev/mandate/internal/failure"
)

func main() {
	readme := flag.String("readme", "README.md", "the README to rewrite")
	flag.Parse()
	if err := run(*readme); err != nil {
		fmt.Fprintln(os.Stderr, "codestable:", err)
		os.Exit(1)
	}
}

func run(path string) error {
	old, err := os.ReadFile(path) //nolint:gosec // G304: the README the developer names, rewritten in place.
	if err != nil {
		return err
	}
	updated, err := failure.ReplaceTable(old)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	return os.WriteFile(path, updated, info.Mode().Perm()) //nolint:gosec // G703: the file read above.
}

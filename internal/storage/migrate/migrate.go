package migrate

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
)

// Set is the migrations of one service.
type Set struct {
	// Service names the service and its Postgres schema; it must match [a-z][a-z0-9_]*, at
	// most 57 characters (its version table, goose_<service>, must fit a Postgres identifier).
	Service string
	// FS holds the migration files NNNN_description.sql at its root. Other files are ignored.
	FS fs.FS
}

// Migration is one migration file of a [Set].
type Migration struct {
	// Version is the number prefix of the file name.
	Version int
	// Name is the description part of the file name.
	Name string
	// SQL is the file's content.
	SQL string
	// Checksum is the hex SHA-256 of SQL.
	Checksum string
}

// ErrInvalidSet is returned (wrapped) for a malformed Set: bad service name, bad file name,
// duplicate version.
var ErrInvalidSet = errors.New("invalid migration set")

var (
	serviceRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,56}$`)
	fileRE    = regexp.MustCompile(`^([0-9]{4,})_([a-z0-9_]+)\.sql$`)
)

// Load reads and validates the migrations of s, sorted by version.
func (s Set) Load() ([]Migration, error) {
	if !serviceRE.MatchString(s.Service) {
		return nil, fmt.Errorf("%w: service name %q must match %s", ErrInvalidSet, s.Service, serviceRE)
	}
	if s.FS == nil {
		return nil, fmt.Errorf("%w: %s: no file system", ErrInvalidSet, s.Service)
	}
	entries, err := fs.ReadDir(s.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalidSet, s.Service, err)
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		if e.IsDir() || path.Ext(e.Name()) != ".sql" {
			continue
		}
		m := fileRE.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("%w: %s: file %q is not named NNNN_description.sql", ErrInvalidSet, s.Service, e.Name())
		}
		v, err := strconv.Atoi(m[1])
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("%w: %s: file %q has no positive version", ErrInvalidSet, s.Service, e.Name())
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("%w: %s: files %q and %q share version %d", ErrInvalidSet, s.Service, prev, e.Name(), v)
		}
		seen[v] = e.Name()
		body, err := fs.ReadFile(s.FS, e.Name())
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInvalidSet, s.Service, err)
		}
		sum := sha256.Sum256(body)
		out = append(out, Migration{Version: v, Name: m[2], SQL: string(body), Checksum: hex.EncodeToString(sum[:])})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	return out, nil
}

package migrate_test

import (
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/mandate-dev/mandate/internal/storage/migrate"
)

func TestInvalidSets(t *testing.T) {
	ok := []byte("SELECT 1;")
	tests := []struct {
		name string
		set  migrate.Set
		want string
	}{
		{"bad service", migrate.Set{Service: "Bad-Name", FS: fstest.MapFS{}}, "service name"},
		{"service name too long", migrate.Set{Service: strings.Repeat("s", 58), FS: fstest.MapFS{}}, "service name"},
		{"nil fs", migrate.Set{Service: "svc"}, "no file system"},
		{"bad file name", migrate.Set{Service: "svc", FS: fstest.MapFS{"1_init.sql": {Data: ok}}}, "1_init.sql"},
		{"zero version", migrate.Set{Service: "svc", FS: fstest.MapFS{"0000_init.sql": {Data: ok}}}, "positive version"},
		{"duplicate version", migrate.Set{Service: "svc", FS: fstest.MapFS{"0001_a.sql": {Data: ok}, "0001_b.sql": {Data: ok}}}, "share version 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.set.Load()
			if !errors.Is(err, migrate.ErrInvalidSet) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidSet mentioning %q", err, tt.want)
			}
		})
	}
}

// TestLoadSortsByVersion: files come back in version order, named and
// summed, whatever the order of the directory; other files are ignored.
func TestLoadSortsByVersion(t *testing.T) {
	set := migrate.Set{Service: "svc", FS: fstest.MapFS{
		"0010_later.sql": {Data: []byte("SELECT 10;")},
		"0002_first.sql": {Data: []byte("SELECT 2;")},
		"README.md":      {Data: []byte("not a migration")},
	}}
	migs, err := set.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(migs) != 2 || migs[0].Version != 2 || migs[0].Name != "first" || migs[1].Version != 10 || migs[1].Name != "later" {
		t.Fatalf("loaded %+v, want 0002_first then 0010_later", migs)
	}
	if migs[0].SQL != "SELECT 2;" || len(migs[0].Checksum) != 64 {
		t.Fatalf("first = %+v, want its SQL and hex SHA-256", migs[0])
	}
}

package postgres

import "github.com/mandate-dev/mandate/services/audit"

// BuildQuery exposes the SQL that Query runs, so that benchmarks can EXPLAIN exactly it.
func BuildQuery(f audit.Filter) (string, []any, error) {
	p, err := f.Prepare()
	if err != nil {
		return "", nil, err
	}
	sql, args := buildQuery(&p)
	return sql, args, nil
}

// SQLMoveHeads is the fast path's head move (move_heads), for tests of its contract.
const SQLMoveHeads = sqlMoveHeads

package postgres

// SQL the tests EXPLAIN.
const (
	SQLExecuted = sqlExecuted
	SQLEvents   = sqlEvents
)

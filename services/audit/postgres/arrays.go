package postgres

import (
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The array parameters of the append statements, in a form pgx encodes without allocating.
//
// Given a []string, pgx wraps it in a pgtype.FlatArray and boxes every element into an
// interface to encode it: an allocation per value, which for a row of audit.records is some
// forty. The types below implement pgtype.ArrayGetter over the same slices and hand out each
// element as a pointer to a named type that implements the pgtype valuer of its column type;
// a pointer boxes without allocating, and pgx encodes the valuer exactly as it encodes the
// plain value (the same binary or text form). Passed by pointer, the arrays themselves box for
// free too.
//
// They need the statement's parameter types from the server, which pgx has in the query exec
// modes that describe statements (the default among them); see typedParams.

// typedParams reports whether connections made with cfg describe a statement before running
// it, so that a parameter is encoded for its declared type. In the other modes (exec, simple
// protocol) pgx infers the type from the Go value, which only works for the plain slices.
func typedParams(cfg *pgx.ConnConfig) bool {
	switch cfg.DefaultQueryExecMode {
	case pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec:
		return true
	}
	return false
}

// arrayDims is the one dimension of an array parameter.
type arrayDims [1]pgtype.ArrayDimension

func (d *arrayDims) of(n int) []pgtype.ArrayDimension {
	d[0] = pgtype.ArrayDimension{Length: int32(n), LowerBound: 1} //nolint:gosec // a batch holds far fewer than 2^31 rows
	return d[:]
}

// textArray is a text[] parameter.
type textArray struct {
	vals []string
	dims arrayDims
}

func (a *textArray) Dimensions() []pgtype.ArrayDimension { return a.dims.of(len(a.vals)) }
func (a *textArray) Index(i int) any                     { return (*textValue)(&a.vals[i]) }
func (a *textArray) IndexType() any                      { return (*textValue)(nil) }

// nullTextArray is a text[] parameter whose nil elements are NULL.
type nullTextArray struct {
	vals []*string
	dims arrayDims
}

func (a *nullTextArray) Dimensions() []pgtype.ArrayDimension { return a.dims.of(len(a.vals)) }
func (a *nullTextArray) IndexType() any                      { return (*textValue)(nil) }
func (a *nullTextArray) Index(i int) any {
	if a.vals[i] == nil {
		return nil
	}
	return (*textValue)(a.vals[i])
}

// int8Array is a bigint[] parameter.
type int8Array struct {
	vals []int64
	dims arrayDims
}

func (a *int8Array) Dimensions() []pgtype.ArrayDimension { return a.dims.of(len(a.vals)) }
func (a *int8Array) Index(i int) any                     { return (*int8Value)(&a.vals[i]) }
func (a *int8Array) IndexType() any                      { return (*int8Value)(nil) }

// boolArray is a boolean[] parameter.
type boolArray struct {
	vals []bool
	dims arrayDims
}

func (a *boolArray) Dimensions() []pgtype.ArrayDimension { return a.dims.of(len(a.vals)) }
func (a *boolArray) Index(i int) any                     { return (*boolValue)(&a.vals[i]) }
func (a *boolArray) IndexType() any                      { return (*boolValue)(nil) }

// timeArray is a timestamptz[] parameter.
type timeArray struct {
	vals []time.Time
	dims arrayDims
}

func (a *timeArray) Dimensions() []pgtype.ArrayDimension { return a.dims.of(len(a.vals)) }
func (a *timeArray) Index(i int) any                     { return (*timeValue)(&a.vals[i]) }
func (a *timeArray) IndexType() any                      { return (*timeValue)(nil) }

// nullTimeArray is a timestamptz[] parameter whose nil elements are NULL.
type nullTimeArray struct {
	vals []*time.Time
	dims arrayDims
}

func (a *nullTimeArray) Dimensions() []pgtype.ArrayDimension { return a.dims.of(len(a.vals)) }
func (a *nullTimeArray) IndexType() any                      { return (*timeValue)(nil) }
func (a *nullTimeArray) Index(i int) any {
	if a.vals[i] == nil {
		return nil
	}
	return (*timeValue)(a.vals[i])
}

// byteaArray is a bytea[] parameter; a nil element is NULL, as pgx encodes a nil []byte.
type byteaArray struct {
	vals [][]byte
	dims arrayDims
}

func (a *byteaArray) Dimensions() []pgtype.ArrayDimension { return a.dims.of(len(a.vals)) }
func (a *byteaArray) Index(i int) any                     { return (*byteaValue)(&a.vals[i]) }
func (a *byteaArray) IndexType() any                      { return (*byteaValue)(nil) }

// The element types: each is its Go value, with the pgtype valuer method of its column type.
type (
	textValue  string
	int8Value  int64
	boolValue  bool
	timeValue  time.Time
	byteaValue []byte
)

func (v *textValue) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*v), Valid: true}, nil
}

func (v *int8Value) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*v), Valid: true}, nil
}

func (v *boolValue) BoolValue() (pgtype.Bool, error) {
	return pgtype.Bool{Bool: bool(*v), Valid: true}, nil
}

func (v *timeValue) TimestamptzValue() (pgtype.Timestamptz, error) {
	return pgtype.Timestamptz{Time: time.Time(*v), Valid: true}, nil
}

func (v *byteaValue) BytesValue() ([]byte, error) { return *v, nil }

// The parameters of the statements with a few arrays: what to pass pgx for vals, a typed
// array when typed (one allocation, as boxing the slice would be), else the slice itself.

func textParam(typed bool, vals []string) any {
	if typed {
		return &textArray{vals: vals}
	}
	return vals
}

func int8Param(typed bool, vals []int64) any {
	if typed {
		return &int8Array{vals: vals}
	}
	return vals
}

func timeParam(typed bool, vals []time.Time) any {
	if typed {
		return &timeArray{vals: vals}
	}
	return vals
}

func byteaParam(typed bool, vals [][]byte) any {
	if typed {
		return &byteaArray{vals: vals}
	}
	return vals
}

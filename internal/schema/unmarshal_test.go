package schema_test

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/mandate-dev/mandate/internal/schema"
	"github.com/mandate-dev/mandate/internal/schema/schematest"
)

func TestUnmarshalRefusesWhatPanics(t *testing.T) {
	md, b := schematest.PanickingMap(t)
	if !panics(func() { _ = proto.Unmarshal(b, dynamicpb.NewMessage(md)) }) {
		t.Skip("the protobuf runtime no longer panics on this input; the guard has nothing to catch")
	}
	err := schema.Unmarshal(proto.UnmarshalOptions{}, b, dynamicpb.NewMessage(md))
	if err == nil {
		t.Fatal("a message the runtime cannot decode was accepted")
	}
	t.Log(err)
	// Well-formed input decodes as before.
	if err := schema.Unmarshal(proto.UnmarshalOptions{}, nil, dynamicpb.NewMessage(md)); err != nil {
		t.Fatal(err)
	}
}

func panics(f func()) (p bool) {
	defer func() { p = recover() != nil }()
	f()
	return false
}

package inprocess

import (
	"context"
	"errors"
	"slices"
	"testing"

	"google.golang.org/grpc"
)

// TestChainUnary: interceptors run in order around the handler, each sees
// what the one before passed on, and one that refuses stops the rest.
func TestChainUnary(t *testing.T) {
	var trace []string
	tag := func(name string) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			trace = append(trace, name+":"+info.FullMethod)
			return h(ctx, req.(string)+name)
		}
	}
	errRefused := errors.New("refused")
	refuse := func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		trace = append(trace, "refuse")
		return nil, errRefused
	}
	handler := func(_ context.Context, req any) (any, error) {
		trace = append(trace, "handler")
		return req, nil
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/m"}
	for _, tc := range []struct {
		name      string
		ints      []grpc.UnaryServerInterceptor
		want      any
		wantErr   error
		wantTrace []string
	}{
		{"none", nil, "req", nil, []string{"handler"}},
		{"one", []grpc.UnaryServerInterceptor{tag("a")}, "reqa", nil, []string{"a:/m", "handler"}},
		{"three", []grpc.UnaryServerInterceptor{tag("a"), tag("b"), tag("c")}, "reqabc", nil, []string{"a:/m", "b:/m", "c:/m", "handler"}},
		{"refused in the middle", []grpc.UnaryServerInterceptor{tag("a"), refuse, tag("c")}, nil, errRefused, []string{"a:/m", "refuse"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			trace = nil
			got, err := chainUnary(tc.ints)(context.Background(), "req", info, handler)
			if got != tc.want || !errors.Is(err, tc.wantErr) {
				t.Errorf("got %v, %v; want %v, %v", got, err, tc.want, tc.wantErr)
			}
			if !slices.Equal(trace, tc.wantTrace) {
				t.Errorf("ran %v, want %v", trace, tc.wantTrace)
			}
		})
	}
}

// Command inventoryctl calls the inventory service with its generated gRPC
// client pointed at Mandate's executor, which governs the call as it
// governs an agent's (the executor is a transparent gRPC proxy of the
// backends it knows):
//
//	inventoryctl --addr 127.0.0.1:9090 --token "$TOKEN" query SKU-1
//	inventoryctl --addr … --token … --idempotency-key k1 reserve SKU-1 7 O-1
//	inventoryctl --addr … --token … --grant CHALLENGE write-off SKU-1 2 EUR 1990 "Broken in the warehouse"
//
// It prints the response as JSON, or the refusal's stage and code from the
// mandate.v1.CommandError detail, and exits 1 on a refusal.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"

	inventoryv1 "example.com/inventory/gen/inventory/v1"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9090", "the executor's gRPC address")
	token := flag.String("token", os.Getenv("TOKEN"), "bearer token of the user or agent calling")
	key := flag.String("idempotency-key", "", "idempotency key (metadata idempotency-key)")
	grant := flag.String("grant", "", "approved challenge id (metadata x-mandate-approval-grant)")
	flag.Parse()
	if err := run(*addr, *token, *key, *grant, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "inventoryctl:", err)
		os.Exit(1)
	}
}

func run(addr, token, key, grant string, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: inventoryctl [flags] query SKU | reserve SKU QTY ORDER | release RESERVATION | write-off SKU QTY CURRENCY MINOR REASON")
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	client := inventoryv1.NewInventoryServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	md := metadata.Pairs("authorization", "Bearer "+token)
	if key != "" {
		md.Append("idempotency-key", key)
	}
	if grant != "" {
		md.Append("x-mandate-approval-grant", grant)
	}
	ctx = metadata.NewOutgoingContext(ctx, md)
	num := func(s string) int32 { n, _ := strconv.Atoi(s); return int32(n) } //nolint:gosec // a sample's CLI
	var out proto.Message
	switch {
	case args[0] == "query" && len(args) == 2:
		out, err = client.QueryStock(ctx, &inventoryv1.QueryStockRequest{Sku: args[1]})
	case args[0] == "reserve" && len(args) == 4:
		out, err = client.ReserveStock(ctx, &inventoryv1.ReserveStockRequest{Sku: args[1], Quantity: num(args[2]), OrderId: args[3]})
	case args[0] == "release" && len(args) == 2:
		out, err = client.ReleaseStock(ctx, &inventoryv1.ReleaseStockRequest{ReservationId: args[1]})
	case args[0] == "write-off" && len(args) == 6:
		minor, _ := strconv.ParseInt(args[4], 10, 64)
		out, err = client.WriteOff(ctx, &inventoryv1.WriteOffRequest{Sku: args[1], Quantity: num(args[2]),
			Value: &inventoryv1.Money{CurrencyCode: args[3], AmountMinor: minor}, Reason: args[5]})
	default:
		return fmt.Errorf("unknown command or wrong arguments: %q", args)
	}
	if err != nil {
		for _, d := range status.Convert(err).Details() {
			if ce, ok := d.(*mandatev1.CommandError); ok {
				b, _ := protojson.Marshal(ce)
				fmt.Println(string(b))
				return fmt.Errorf("refused: %s/%s", ce.GetStage(), ce.GetCode())
			}
		}
		return err
	}
	b, err := protojson.Marshal(out)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}

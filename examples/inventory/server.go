package inventory

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"

	"github.com/mandate-dev/mandate/pkg/backend"
	"github.com/mandate-dev/mandate/pkg/receipt"

	inventoryv1 "example.com/inventory/gen/inventory/v1"
)

// Seed is the stock every tenant starts with.
var Seed = map[string]int32{"SKU-1": 100, "SKU-2": 5}

type tenantStock struct {
	onHand, reserved map[string]int32
	reservations     map[string]*inventoryv1.Reservation
	next             int
}

// Server implements inventoryv1.InventoryServiceServer over memory.
type Server struct {
	inventoryv1.UnimplementedInventoryServiceServer

	mu       sync.Mutex
	tenants  map[string]*tenantStock
	receipts *receipt.Memory
	// WriteOffs counts write-offs that ran, so a test can prove none did.
	writeOffs int
}

// New returns a Server with the seed stock in every tenant.
func New() *Server {
	return &Server{tenants: map[string]*tenantStock{}, receipts: receipt.NewMemory()}
}

// Register registers the inventory service and its ReceiptService on s.
func (s *Server) Register(srv grpc.ServiceRegistrar) error {
	inventoryv1.RegisterInventoryServiceServer(srv, s)
	h, err := receipt.NewHandler(receipt.HandlerConfig[receipt.MemoryTx]{Store: s.receipts, InTx: s.receipts.InTx})
	if err != nil {
		return err
	}
	h.Register(srv)
	return nil
}

// WriteOffs reports how many write-offs ran.
func (s *Server) WriteOffs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writeOffs
}

// tenant returns the caller's tenant's stock; callers hold mu.
func (s *Server) tenant(c backend.Caller) *tenantStock {
	t := s.tenants[c.Tenant]
	if t == nil {
		t = &tenantStock{onHand: map[string]int32{}, reserved: map[string]int32{}, reservations: map[string]*inventoryv1.Reservation{}}
		for sku, n := range Seed {
			t.onHand[sku] = n
		}
		s.tenants[c.Tenant] = t
	}
	return t
}

func unknownSKU(sku string) error {
	return backend.Refuse(backend.StageStateCheck, "stock.unknown_sku", "no SKU "+sku+" in this tenant's stock")
}

// QueryStock implements stock.query.
func (s *Server) QueryStock(ctx context.Context, req *inventoryv1.QueryStockRequest) (*inventoryv1.Stock, error) {
	c, err := backend.CallerFrom(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tenant(c)
	n, ok := t.onHand[req.GetSku()]
	if !ok {
		return nil, unknownSKU(req.GetSku())
	}
	return &inventoryv1.Stock{Sku: req.GetSku(), OnHand: n, Reserved: t.reserved[req.GetSku()]}, nil
}

// inTx runs fn for the caller in one in-memory transaction (the receipt's
// and the effect's), under the server's lock.
func (s *Server) inTx(ctx context.Context, fn func(c backend.Caller, t *tenantStock, tx receipt.MemoryTx) error) error {
	c, err := backend.CallerFrom(ctx)
	if err != nil {
		return err
	}
	return s.receipts.InTx(ctx, func(tx receipt.MemoryTx) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		return fn(c, s.tenant(c), tx)
	})
}

// ReserveStock implements stock.reserve: at most once per invocation.
func (s *Server) ReserveStock(ctx context.Context, req *inventoryv1.ReserveStockRequest) (*inventoryv1.Reservation, error) {
	var out *inventoryv1.Reservation
	err := s.inTx(ctx, func(c backend.Caller, t *tenantStock, tx receipt.MemoryTx) error {
		var err error
		out, err = receipt.Effect(ctx, tx, s.receipts, inventoryv1.InventoryService_ReserveStock_FullMethodName, c.InvocationID, func() (*inventoryv1.Reservation, error) {
			sku := req.GetSku()
			onHand, ok := t.onHand[sku]
			if !ok {
				return nil, unknownSKU(sku)
			}
			if free := onHand - t.reserved[sku]; req.GetQuantity() > free {
				return nil, backend.Refuse(backend.StagePreInvariant, "stock.insufficient", fmt.Sprintf("%d units of %s are free, %d were asked for", free, sku, req.GetQuantity()))
			}
			t.next++
			r := &inventoryv1.Reservation{ReservationId: fmt.Sprintf("R-%d", t.next), Sku: sku, Quantity: req.GetQuantity(), OrderId: req.GetOrderId(), Active: true}
			t.reserved[sku] += r.Quantity
			t.reservations[r.ReservationId] = r
			tx.OnRollback(func() { t.reserved[sku] -= r.Quantity; delete(t.reservations, r.ReservationId) })
			return r, nil
		})
		return err
	})
	return out, err
}

// ReleaseStock implements stock.release, the recall of stock.reserve.
func (s *Server) ReleaseStock(ctx context.Context, req *inventoryv1.ReleaseStockRequest) (*inventoryv1.Reservation, error) {
	var out *inventoryv1.Reservation
	err := s.inTx(ctx, func(c backend.Caller, t *tenantStock, tx receipt.MemoryTx) error {
		var err error
		out, err = receipt.Effect(ctx, tx, s.receipts, inventoryv1.InventoryService_ReleaseStock_FullMethodName, c.InvocationID, func() (*inventoryv1.Reservation, error) {
			r, ok := t.reservations[req.GetReservationId()]
			switch {
			case !ok:
				return nil, backend.Refuse(backend.StageStateCheck, "reservation.not_found", "no reservation "+req.GetReservationId())
			case !r.Active:
				return nil, backend.Refuse(backend.StageStateCheck, "reservation.released", "reservation "+r.ReservationId+" was released already")
			}
			r.Active = false
			t.reserved[r.Sku] -= r.Quantity
			tx.OnRollback(func() { r.Active = true; t.reserved[r.Sku] += r.Quantity })
			return &inventoryv1.Reservation{ReservationId: r.ReservationId, Sku: r.Sku, Quantity: r.Quantity, OrderId: r.OrderId, Active: false}, nil
		})
		return err
	})
	return out, err
}

// WriteOff implements stock.write_off.
func (s *Server) WriteOff(ctx context.Context, req *inventoryv1.WriteOffRequest) (*inventoryv1.WriteOffResult, error) {
	var out *inventoryv1.WriteOffResult
	err := s.inTx(ctx, func(c backend.Caller, t *tenantStock, tx receipt.MemoryTx) error {
		var err error
		out, err = receipt.Effect(ctx, tx, s.receipts, inventoryv1.InventoryService_WriteOff_FullMethodName, c.InvocationID, func() (*inventoryv1.WriteOffResult, error) {
			sku := req.GetSku()
			onHand, ok := t.onHand[sku]
			if !ok {
				return nil, unknownSKU(sku)
			}
			if free := onHand - t.reserved[sku]; req.GetQuantity() > free {
				return nil, backend.Refuse(backend.StagePreInvariant, "stock.insufficient", fmt.Sprintf("%d units of %s are free to write off, not %d", free, sku, req.GetQuantity()))
			}
			t.onHand[sku] -= req.GetQuantity()
			s.writeOffs++
			tx.OnRollback(func() { t.onHand[sku] += req.GetQuantity(); s.writeOffs-- })
			t.next++
			return &inventoryv1.WriteOffResult{WriteOffId: fmt.Sprintf("WO-%d", t.next), Sku: sku, Quantity: req.GetQuantity(), OnHand: t.onHand[sku]}, nil
		})
		return err
	})
	return out, err
}

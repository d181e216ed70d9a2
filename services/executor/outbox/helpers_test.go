package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mandate-dev/mandate/services/executor/outbox"
)

// sharedURL is the NATS server of the dev and CI machines.
const sharedURL = "nats://127.0.0.1:4222"

// sharedNATS returns sharedURL when a JetStream server answers there. It skips the test when
// none does, unless MANDATE_REQUIRE_POSTGRES=1 (CI, which runs NATS too) makes that a failure.
func sharedNATS(t *testing.T) string {
	t.Helper()
	nc, err := nats.Connect(sharedURL, nats.Timeout(time.Second))
	if err == nil {
		var js jetstream.JetStream
		if js, err = jetstream.New(nc); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err = js.AccountInfo(ctx)
			cancel()
		}
		nc.Close()
	}
	if err != nil {
		if os.Getenv("MANDATE_REQUIRE_POSTGRES") == "1" {
			t.Fatalf("NATS JetStream at %s does not answer (%v); MANDATE_REQUIRE_POSTGRES=1 requires it", sharedURL, err)
		}
		t.Skipf("NATS JetStream at %s does not answer (%v): start nats-server -js to run this test", sharedURL, err)
	}
	return sharedURL
}

// names returns a stream name and a subject prefix of the test's own, so that tests on one
// server never see each other's events.
func names(t *testing.T) (stream, prefix string) {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	return "MANDATE_TEST_" + strings.ToUpper(id), "mt" + id
}

// deleteStream removes stream from the server at url when the test ends.
func deleteStream(t *testing.T, url, stream string) {
	t.Cleanup(func() {
		nc, err := nats.Connect(url, nats.Timeout(time.Second))
		if err != nil {
			t.Logf("deleting stream %s: %v", stream, err)
			return
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, stream); err != nil {
			t.Logf("deleting stream %s: %v", stream, err)
		}
	})
}

// embedded is a nats-server of the test's own, which it can stop and start again on the same
// port and store directory: a broker outage without touching the shared server.
type embedded struct {
	t    *testing.T
	port int
	dir  string
	srv  *server.Server
}

func startEmbedded(t *testing.T) *embedded {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	e := &embedded{t: t, port: port, dir: t.TempDir()}
	e.start()
	t.Cleanup(e.stop)
	return e
}

func (e *embedded) url() string { return "nats://127.0.0.1:" + strconv.Itoa(e.port) }

func (e *embedded) start() {
	e.t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: e.port, JetStream: true, StoreDir: e.dir,
		NoLog: true, NoSigs: true})
	if err != nil {
		e.t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		e.t.Fatal("embedded nats-server did not start")
	}
	e.srv = srv
}

func (e *embedded) stop() {
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
		e.srv = nil
	}
}

// received is one message read back from a stream.
type received struct {
	subject, msgID string
	ev             outbox.CloudEvent
	raw            map[string]any
}

// readAll reads every message of stream under filter, in stream order.
func readAll(t *testing.T, url, stream, filter string) []received {
	t.Helper()
	nc, err := nats.Connect(url, nats.Timeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		t.Fatal(err)
	}
	var out []received
	for {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			r := received{subject: m.Subject(), msgID: m.Headers().Get(jetstream.MsgIDHeader)}
			if err := json.Unmarshal(m.Data(), &r.ev); err != nil {
				t.Fatalf("message %s is not a CloudEvent: %v: %s", m.Subject(), err, m.Data())
			}
			if err := json.Unmarshal(m.Data(), &r.raw); err != nil {
				t.Fatal(err)
			}
			out = append(out, r)
		}
		if err := batch.Error(); err != nil && !strings.Contains(err.Error(), "timeout") {
			t.Fatalf("fetching: %v", err)
		}
		if n == 0 {
			return out
		}
	}
}

// checkOrdered asserts that got holds, for each tenant, the events 1..want[tenant] exactly once
// and in seq order, each with its invocation id as CloudEvent id and message id.
func checkOrdered(t *testing.T, got []received, want map[string]int64) {
	t.Helper()
	next := map[string]int64{}
	for _, r := range got {
		e := r.ev
		if e.ID != r.msgID || e.ID != e.Data.InvocationID {
			t.Fatalf("event %s/%d: id %q, Nats-Msg-Id %q, invocation %q; want all three equal", e.Tenant, e.Seq, e.ID, r.msgID, e.Data.InvocationID)
		}
		next[e.Tenant]++
		if e.Seq != next[e.Tenant] {
			t.Fatalf("%s: got seq %d where %d was due: out of commit order or duplicated", e.Tenant, e.Seq, next[e.Tenant])
		}
	}
	for tenant, n := range want {
		if next[tenant] != n {
			t.Errorf("%s: %d events delivered, want %d", tenant, next[tenant], n)
		}
	}
	if len(got) != int(sum(want)) {
		t.Errorf("%d messages in the stream, want %d", len(got), sum(want))
	}
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

func inv(tenant string, i int) string { return fmt.Sprintf("%s-inv-%04d", tenant, i) }

package postgres_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/services/executor"
)

// BenchmarkSpendStores is the measurement behind keeping declared limits
// in Postgres rather than in Redis (docs/architecture/limits.md): one keyed
// call's claim of its idempotency key with its spend, three ways, in turn:
//
//	reserve        the claim alone (Postgres), the cost without a limit;
//	postgres       the claim and the spend in one statement and one commit
//	               (ReserveSpending), which is what the executor does;
//	redis          the claim (Postgres), then the spend as one Lua script
//	               in Redis (the same arithmetic: lapsed spends dropped,
//	               the holder's own spend replaced, the bucket's total).
//
// Redis is the one on MANDATE_REDIS_ADDR (default 127.0.0.1:6379); the
// benchmark skips without one. The script's Redis has its own persistence
// settings, which the benchmark reports and does not change. Run with
//
//	go test ./services/executor/postgres -run '^$' -bench SpendStores -benchtime 2000x
func BenchmarkSpendStores(b *testing.B) {
	addr := os.Getenv("MANDATE_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	rc, err := dialRESP(addr)
	if err != nil {
		b.Skipf("no Redis at %s: %v", addr, err)
	}
	b.Cleanup(func() { _ = rc.conn.Close() })
	for _, k := range []string{"appendonly", "appendfsync"} {
		v, err := rc.do("CONFIG", "GET", k)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("redis %v", v)
	}
	sha, err := rc.do("SCRIPT", "LOAD", spendScript)
	if err != nil {
		b.Fatal(err)
	}

	st := benchStore(b)
	ctx := context.Background()
	run := fmt.Sprint(time.Now().UnixNano())
	n := 0
	next := func() (executor.IdemKey, executor.Reservation, string) {
		n++
		k := fmt.Sprintf("k-%s-%d", run, n)
		return executor.IdemKey{Tenant: "acme", User: "carol", Command: "ticket.refund", Key: k},
			executor.Reservation{Digest: "d", InvocationID: "inv-" + k, TTL: time.Hour}, "key:" + k
	}
	item := executor.SpendItem{Bucket: "bench-" + run, Amount: 1, Max: 1 << 40, Window: time.Hour}
	zset, amounts, total := "mandate-bench:"+run+":z", "mandate-bench:"+run+":h", "mandate-bench:"+run+":t"
	b.Cleanup(func() { _, _ = rc.do("DEL", zset, amounts, total) })

	variants := []struct {
		name string
		run  func() error
	}{
		{"reserve", func() error {
			key, r, _ := next()
			_, err := st.Reserve(ctx, key, r)
			return err
		}},
		{"postgres", func() error {
			key, r, _ := next()
			sp := executor.Spending{Tenant: "acme", Key: &key, Items: []executor.SpendItem{item}}
			_, bal, err := st.ReserveSpending(ctx, key, r, sp)
			if err == nil && (bal == nil || !bal[0].Fits) {
				err = fmt.Errorf("balances %v", bal)
			}
			return err
		}},
		{"redis", func() error {
			key, r, h := next()
			if _, err := st.Reserve(ctx, key, r); err != nil {
				return err
			}
			out, err := rc.do("EVALSHA", sha.(string), "3", zset, amounts, total,
				strconv.FormatInt(time.Now().UnixMicro(), 10), strconv.FormatInt(item.Window.Microseconds(), 10), h,
				strconv.FormatInt(item.Amount, 10), strconv.FormatInt(item.Max, 10))
			if res, ok := out.([]any); err == nil && (!ok || len(res) != 2 || res[1] != int64(1)) {
				err = fmt.Errorf("the script answered %v", out)
			}
			return err
		}},
	}
	// The three run in turn, call by call, so that a machine that gets
	// busier slows them alike; each reports its mean.
	spent := make([]time.Duration, len(variants))
	for i := 0; b.Loop(); i++ {
		v := i % len(variants)
		t0 := time.Now()
		if err := variants[v].run(); err != nil {
			b.Fatalf("%s: %v", variants[v].name, err)
		}
		spent[v] += time.Since(t0)
	}
	per := float64(b.N) / float64(len(variants))
	for i, v := range variants {
		b.ReportMetric(float64(spent[i].Microseconds())/per, v.name+"-µs")
	}
	b.ReportMetric(float64(spent[1]-spent[0])/float64(spent[2]-spent[0]), "postgres/redis-added")
}

// spendScript is Spend for one bucket in Redis: a sorted set of holders by
// lapse time, a hash of their amounts and the bucket's running total.
const spendScript = `
local now = tonumber(ARGV[1])
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
local gone = 0
for _, h in ipairs(lapsed) do
  gone = gone + tonumber(redis.call('HGET', KEYS[2], h) or '0')
  redis.call('HDEL', KEYS[2], h)
end
if #lapsed > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) end
local total = tonumber(redis.call('GET', KEYS[3]) or '0') - gone
local own = tonumber(redis.call('HGET', KEYS[2], ARGV[3]) or '0')
local amount = tonumber(ARGV[4])
local fits = total - own + amount <= tonumber(ARGV[5])
if fits then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
  redis.call('HSET', KEYS[2], ARGV[3], amount)
  total = total - own + amount
end
redis.call('SET', KEYS[3], total)
return {total, fits and 1 or 0}
`

// respConn is the least of a RESP2 client the benchmark needs: one
// command at a time, replies of every RESP2 type.
type respConn struct {
	conn net.Conn
	r    *bufio.Reader
}

func dialRESP(addr string) (*respConn, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	rc := &respConn{conn: c, r: bufio.NewReader(c)}
	if _, err := rc.do("PING"); err != nil {
		_ = c.Close()
		return nil, err
	}
	return rc, nil
}

func (c *respConn) do(args ...string) (any, error) {
	buf := []byte("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		buf = append(buf, "$"+strconv.Itoa(len(a))+"\r\n"+a+"\r\n"...)
	}
	if _, err := c.conn.Write(buf); err != nil {
		return nil, err
	}
	return c.read()
}

func (c *respConn) read() (any, error) {
	line, err := c.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 {
		return nil, fmt.Errorf("short reply %q", line)
	}
	kind, body := line[0], line[1:len(line)-2]
	switch kind {
	case '+':
		return body, nil
	case '-':
		return nil, fmt.Errorf("redis: %s", body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, b); err != nil {
			return nil, err
		}
		return string(b[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = c.read(); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown reply %q", line)
}

package limiter

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
)

// stallRun drives one limiter with the DEFAULT timeout and breaker at about 50 requests
// a second for a tenant of capacity 20 refilled at 0.01/s: 100 ms healthy (the bucket
// still nearly full, so the fallback starts with most of its tokens), then stall() for
// 3 s, then resume() and 2 s more. It returns what was admitted in total. The
// invariant: at most C + R*t = 20 + 0.06, so at most 21 with a token of slack.
func stallRun(t *testing.T, l *Redis, stall, resume func()) int {
	t.Helper()
	r := Request{Tenant: "stall", Route: "r", Limit: regions.Limit{Capacity: 20, RefillPerSecond: 0.01}}
	admitted := 0
	run := func(d time.Duration) {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		end := time.Now().Add(d)
		for n := 0; n < 1000 && time.Now().Before(end); n++ {
			if mustDecide(t, l, r).Allowed {
				admitted++
			}
			<-tick.C
		}
	}
	run(100 * time.Millisecond)
	stall()
	run(3 * time.Second)
	resume()
	run(2 * time.Second)
	return admitted
}

// TestStallKeepsDebt (issue 14 item 1): a Redis frozen by SIGSTOP for 3 s must not hand
// out a second bucket. Calls that time out (their EVALSHA written or not; a HELLO on a
// fresh connection times out as a bare os.ErrDeadlineExceeded) got no reply, so they did
// not count: the fallback's debt they carried stays owed.
func TestStallKeepsDebt(t *testing.T) {
	p := testenv.Redis(t)
	l := newTestRedis(t, newClient(t, p), Options{})
	if err := l.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	n := stallRun(t, l, func() {
		if err := p.Pause(); err != nil {
			t.Fatal(err)
		}
	}, func() {
		if err := p.Resume(); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { _ = p.Resume() })
	if n > 21 {
		t.Fatalf("admitted %d through a 3 s SIGSTOP of Redis, want at most 21 (capacity 20, refill 0.01/s)", n)
	}
	t.Logf("admitted %d (bound 21)", n)
}

// TestBlackHoleKeepsDebt: the same through a TCP proxy that accepts connections but
// never answers (a sidecar in front of a dead Redis, a partition): no call gets a reply,
// every new connection's HELLO times out.
func TestBlackHoleKeepsDebt(t *testing.T) {
	p := testenv.Redis(t)
	bh := startBlackHole(t, p.Addr())
	rdb := newClient(t, &testenv.Process{Host: "127.0.0.1", Port: bh.port()})
	l := newTestRedis(t, rdb, Options{})
	if err := l.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	n := stallRun(t, l, func() { bh.set(true) }, func() { bh.set(false) })
	if n > 21 {
		t.Fatalf("admitted %d through a 3 s black hole in front of Redis, want at most 21", n)
	}
	t.Logf("admitted %d (bound 21)", n)
}

// blackHole is a loopback TCP proxy that forwards to target, or, while dropping, accepts
// and reads everything and forwards nothing in either direction.
type blackHole struct {
	ln       net.Listener
	target   string
	dropping atomic.Bool
	mu       sync.Mutex
	conns    []net.Conn
	wg       sync.WaitGroup
}

func startBlackHole(t *testing.T, target string) *blackHole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackHole{ln: ln, target: target}
	b.wg.Add(1)
	go b.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			_ = c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	return b
}

func (b *blackHole) port() int         { return b.ln.Addr().(*net.TCPAddr).Port }
func (b *blackHole) set(dropping bool) { b.dropping.Store(dropping) }

func (b *blackHole) track(cs ...net.Conn) {
	b.mu.Lock()
	b.conns = append(b.conns, cs...)
	b.mu.Unlock()
}

func (b *blackHole) accept() {
	defer b.wg.Done()
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", b.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		b.track(c, s)
		b.wg.Add(2)
		go b.pipe(s, c)
		go b.pipe(c, s)
	}
}

// pipe copies from src to dst unless dropping, when it reads and discards.
func (b *blackHole) pipe(dst, src net.Conn) {
	defer b.wg.Done()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !b.dropping.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

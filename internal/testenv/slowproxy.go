package testenv

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// SlowProxy is a loopback TCP proxy for fault tests: it forwards bytes both ways and holds
// every chunk the server sends for the current delay before passing it on, so a server
// behind it answers late (a slow Redis) without being paused. Requests go through at
// once; chunks keep their order. SetDelay(0) makes it a plain proxy.
//
// SetBlackHole(true) makes it a black hole, as a sidecar or TCP load balancer in front
// of a dead server is: new connections are accepted and never answered, and what the
// client sends on any connection is read and dropped. A connection that dropped a byte
// stays a black hole until it closes (its client and server would disagree on what was
// sent); connections opened after SetBlackHole(false) are forwarded again.
type SlowProxy struct {
	ln        net.Listener
	target    string
	delay     atomic.Int64 // ns
	blackHole atomic.Bool

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// StartSlowProxy listens on a free loopback port and forwards every connection to target
// (host:port, which must be a loopback address).
func StartSlowProxy(target string) (*SlowProxy, error) {
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return nil, fmt.Errorf("slow proxy: target %q: %w", target, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("slow proxy: target %q is not a loopback address", target)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("slow proxy: %w", err)
	}
	p := &SlowProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *SlowProxy) Addr() string { return p.ln.Addr().String() }

// SetDelay sets how long each chunk from the server is held; it applies to chunks read
// from now on.
func (p *SlowProxy) SetDelay(d time.Duration) { p.delay.Store(int64(max(d, 0))) }

// Delay is the current delay.
func (p *SlowProxy) Delay() time.Duration { return time.Duration(p.delay.Load()) }

// SetBlackHole turns the black hole on or off (see SlowProxy).
func (p *SlowProxy) SetBlackHole(on bool) { p.blackHole.Store(on) }

// BlackHole reports whether the proxy is a black hole now.
func (p *SlowProxy) BlackHole() bool { return p.blackHole.Load() }

// Close stops accepting, closes every connection and waits for the proxy's goroutines
// (at most the current delay, for a chunk already being held).
func (p *SlowProxy) Close() error {
	p.mu.Lock()
	p.closed = true
	err := p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// track registers c for Close; it reports false (and closes c) once the proxy is closed.
func (p *SlowProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *SlowProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *SlowProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// chunk is server output waiting for its time.
type chunk struct {
	b   []byte
	due time.Time
}

// serve forwards one connection: client->server directly, server->client through a
// queue that releases each chunk at its due time. When either side ends, both close.
func (p *SlowProxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	if p.blackHole.Load() {
		_, _ = io.Copy(io.Discard, client) // accepted, never answered, until it closes
		return
	}
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)

	var wg sync.WaitGroup
	var dropped atomic.Bool // this connection is a black hole for good
	queue := make(chan chunk, 1024)
	wg.Go(func() { // client -> server, or nowhere while a black hole
		defer server.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				if p.blackHole.Load() {
					dropped.Store(true)
				}
				if !dropped.Load() {
					if _, werr := server.Write(buf[:n]); werr != nil {
						return
					}
				}
			}
			if err != nil {
				return
			}
		}
	})
	wg.Go(func() { // server -> queue
		defer close(queue)
		for {
			buf := make([]byte, 32<<10)
			n, err := server.Read(buf)
			if n > 0 {
				queue <- chunk{b: buf[:n], due: time.Now().Add(p.Delay())}
			}
			if err != nil {
				return
			}
		}
	})
	// queue -> client, each chunk at its time.
	for c := range queue {
		if wait := time.Until(c.due); wait > 0 {
			time.Sleep(wait)
		}
		if dropped.Load() || p.blackHole.Load() {
			continue // a black hole answers nothing
		}
		if _, err := client.Write(c.b); err != nil {
			break
		}
	}
	_ = client.Close()
	_ = server.Close()
	for range queue { // let the reader finish
	}
	wg.Wait()
}

// Proxies are SlowProxy fronts by name (a region, a gateway id), for a stack that puts one
// between its gateways and Redis. Front is safe for concurrent use; the zero value works.
type Proxies struct {
	mu sync.Mutex
	m  map[string]*SlowProxy
}

// Front starts a proxy to addr under name and returns its address.
func (ps *Proxies) Front(name, addr string) (string, error) {
	p, err := StartSlowProxy(addr)
	if err != nil {
		return "", err
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.m == nil {
		ps.m = map[string]*SlowProxy{}
	}
	ps.m[name] = p
	return p.Addr(), nil
}

// Get is the proxy started under name, or nil.
func (ps *Proxies) Get(name string) *SlowProxy {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.m[name]
}

// Close closes every proxy.
func (ps *Proxies) Close() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, p := range ps.m {
		_ = p.Close()
	}
}

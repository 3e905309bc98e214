package limiter

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/lua"
)

// batcher sends concurrent decisions to Redis together, as few script calls as the keys
// allow: one call for the whole batch on a single Redis, one per hash slot on a cluster
// (pipelined together), one per decision on a Ring (whose shards no slot tells apart).
//
// There is no collection window and no goroutine of its own. Up to maxInFlight calls may
// be out at once. A decision that finds a free slot goes out at once, on its caller's
// goroutine, as one plain EVALSHA: with one caller, a decision costs what it cost
// without the batcher, one round trip. A decision that finds every slot busy joins the
// queue; when a slot's round trip ends and the queue is not empty, that slot sends
// everything queued (up to maxBatch decisions) on a goroutine that keeps sending until
// the queue is empty and then exits. So Redis always has work while callers wait, and
// the batch follows the load: 1 at low concurrency, up to maxBatch under load. One
// script call for many decisions pays Redis's per-call cost (parsing, the script's
// setup, TIME) once: that, not the token bucket, is most of what a decision costs it.
//
// Invariant, under mu: a free slot means an empty queue. A slot that frees up with a
// non-empty queue is never released; it goes on sending.
//
// Each decision keeps its own deadline (Options.Timeout from when it was asked): a caller
// whose decision is not answered in time abandons it and the decision comes from the
// fallback, as without the batcher; a decision abandoned while still queued is not sent.
type batcher struct {
	rdb         pipeliner
	runner      runner
	timeout     time.Duration
	maxBatch    int
	maxInFlight int
	grouping    grouping
	m           *redisMetrics

	mu       sync.Mutex
	queue    []*call
	inflight int
}

// grouping is how decisions may share a script call.
type grouping uint8

const (
	groupAll     grouping = iota // one Redis: any decisions share a call
	groupBySlot                  // a Redis Cluster: decisions of one hash slot share a call
	groupNothing                 // a Ring: one call per decision, pipelined
)

// groupingOf is how decisions may share a call on rdb.
func groupingOf(rdb any) grouping {
	switch rdb.(type) {
	case *redis.ClusterClient:
		return groupBySlot
	case *redis.Ring:
		return groupNothing
	}
	return groupAll
}

// pipeliner is what the batcher needs of a go-redis client: *redis.Client,
// *redis.ClusterClient, *redis.Ring and redis.UniversalClient all have it.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// runner is what the batcher needs of the limiter: a lone decision sent at once, on the
// caller's goroutine, and word that Redis has lost the scripts (reload them out of band).
type runner interface {
	direct(ctx context.Context, d lua.Decision) (lua.Outcome, bool, error)
	lostScripts()
}

// call states.
const (
	callWaiting   int32 = iota // queued
	callSent                   // in a batch on its way to Redis
	callAnswered               // the sender wrote the answer and will signal done
	callAbandoned              // the caller gave up; the sender must not signal
)

// call is one queued decision and, once answered, its outcome.
type call struct {
	d     lua.Decision
	state atomic.Int32
	out   lua.Outcome
	err   error
	done  chan struct{} // buffered: the sender never blocks on it
	timer *time.Timer
}

var callPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &call{done: make(chan struct{}, 1), timer: t}
}}

func newBatcher(r runner, rdb pipeliner, timeout time.Duration, maxBatch, maxInFlight int, m *redisMetrics) *batcher {
	return &batcher{
		rdb: rdb, runner: r, timeout: timeout,
		maxBatch: maxBatch, maxInFlight: maxInFlight, grouping: groupingOf(rdb), m: m,
		queue: make([]*call, 0, maxBatch),
	}
}

// do decides d. ctx is the caller's; the decision is also bounded by the batcher's
// timeout from now. timedOut reports that it ran out of time.
func (b *batcher) do(ctx context.Context, d lua.Decision) (out lua.Outcome, timedOut bool, err error) {
	b.mu.Lock()
	if b.inflight < b.maxInFlight { // the queue is empty: go now, alone
		b.inflight++
		b.mu.Unlock()
		o, to, err := b.runner.direct(ctx, d)
		b.mu.Lock()
		b.releaseLocked()
		b.mu.Unlock()
		return o, to, err
	}
	c := callPool.Get().(*call)
	c.d = d
	c.state.Store(callWaiting)
	b.queue = append(b.queue, c)
	b.mu.Unlock()

	c.timer.Reset(b.timeout)
	select {
	case <-c.done:
		c.timer.Stop()
	case <-c.timer.C:
		// c is not reused after it is abandoned: a sender may hold it.
		if c.state.CompareAndSwap(callWaiting, callAbandoned) || c.state.CompareAndSwap(callSent, callAbandoned) {
			return lua.Outcome{}, true, errCallTimeout
		}
		<-c.done // answered just in time
	case <-ctx.Done():
		c.timer.Stop()
		if c.state.CompareAndSwap(callWaiting, callAbandoned) || c.state.CompareAndSwap(callSent, callAbandoned) {
			return lua.Outcome{}, false, ctx.Err()
		}
		<-c.done
	}
	out, timedOut, err = c.out, isTimeout(c.err), c.err
	c.d, c.out, c.err = lua.Decision{}, lua.Outcome{}, nil
	callPool.Put(c)
	return out, timedOut, err
}

// isTimeout reports whether err says a deadline passed: the batch's context, or the
// socket deadline go-redis derives from it.
func isTimeout(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// errCallTimeout is the error of a queued decision not answered within the timeout.
var errCallTimeout = errors.New("redis call not answered within the limiter timeout")

// releaseLocked ends one slot's round trip: with decisions queued, the slot sends them
// next on a goroutine of its own; otherwise it is freed.
func (b *batcher) releaseLocked() {
	if len(b.queue) == 0 {
		b.inflight--
		return
	}
	batch := b.takeLocked(make([]*call, 0, b.maxBatch))
	go b.send(batch)
}

// takeLocked moves up to maxBatch queued decisions into batch, oldest first.
func (b *batcher) takeLocked(batch []*call) []*call {
	n := min(len(b.queue), b.maxBatch)
	batch = append(batch[:0], b.queue[:n]...)
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	return batch
}

// send sends batch, answers its decisions, and goes on with whatever was queued
// meanwhile until the queue is empty; then it frees its slot and returns.
func (b *batcher) send(batch []*call) {
	var s sender
	for {
		s.exec(b, batch)
		clear(batch)
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.inflight--
			b.mu.Unlock()
			return
		}
		batch = b.takeLocked(batch)
		b.mu.Unlock()
	}
}

// sender is one sending goroutine's reusable buffers.
type sender struct {
	groups []group
	cmds   []*redis.Cmd
	outs   []lua.Outcome
}

// group is the decisions of one script call.
type group struct {
	slot  uint16
	calls []*call
	batch lua.Batch
}

// exec sends the decisions of batch that are still wanted, grouped into script calls,
// in one pipeline, then answers them. Calls that failed with NOSCRIPT (Redis restarted
// or flushed its scripts) go again as EVAL in one more round trip, if the timeout leaves
// time for it, and the scripts are reloaded out of band, so later calls find them even
// when this one cannot.
func (s *sender) exec(b *batcher, batch []*call) {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	for i := range s.groups {
		s.groups[i].calls = s.groups[i].calls[:0]
		s.groups[i].batch.Reset()
	}
	s.groups = s.groups[:0]
	sent := 0
	for _, c := range batch {
		if !c.state.CompareAndSwap(callWaiting, callSent) {
			continue // abandoned while queued: not sent
		}
		s.add(b.grouping, c)
		sent++
	}
	if sent == 0 {
		return
	}
	pipe := b.rdb.Pipeline()
	s.cmds = s.cmds[:0]
	for i := range s.groups {
		cmd := s.groups[i].batch.Cmd(ctx)
		s.cmds = append(s.cmds, cmd)
		_ = pipe.Process(ctx, cmd)
	}
	b.m.pipelines.Inc()
	b.m.pipelined.Add(float64(sent))
	_, _ = pipe.Exec(ctx) // each command carries its own error; read below

	retry := false
	for i, cmd := range s.cmds {
		if lua.IsNoScript(cmd.Err()) {
			s.cmds[i] = s.groups[i].batch.EvalCmd(ctx)
			_ = pipe.Process(ctx, s.cmds[i])
			retry = true
		}
	}
	if retry {
		b.runner.lostScripts()
		_, _ = pipe.Exec(ctx)
	}
	for i, cmd := range s.cmds {
		g := &s.groups[i]
		var err error
		s.outs, err = g.batch.Read(cmd, s.outs[:0])
		for j, c := range g.calls {
			if err == nil {
				c.out = s.outs[j]
			}
			c.err = err
			if c.state.CompareAndSwap(callSent, callAnswered) {
				c.done <- struct{}{}
			}
		}
	}
}

// add puts c into the script call it may share.
func (s *sender) add(g grouping, c *call) {
	sl := uint16(0)
	switch g {
	case groupBySlot:
		sl = slot(c.d.Buckets[0].Key)
	case groupNothing:
		s.groups = append(s.groups, group{})
		s.last(c)
		return
	}
	for i := range s.groups {
		if s.groups[i].slot == sl {
			s.groups[i].calls = append(s.groups[i].calls, c)
			s.groups[i].batch.Add(c.d)
			return
		}
	}
	if len(s.groups) < cap(s.groups) {
		s.groups = s.groups[:len(s.groups)+1] // reuse a group's buffers
	} else {
		s.groups = append(s.groups, group{})
	}
	s.groups[len(s.groups)-1].slot = sl
	s.last(c)
}

func (s *sender) last(c *call) {
	g := &s.groups[len(s.groups)-1]
	g.calls = append(g.calls[:0], c)
	g.batch.Reset()
	g.batch.Add(c.d)
}

// direct decides d as one plain EVALSHA bounded by the timeout, on the caller's
// context. After NOSCRIPT it reloads the scripts out of band and retries with EVAL in
// what is left of the timeout. timedOut reports that the call ran out of time.
func (l *Redis) direct(ctx context.Context, d lua.Decision) (lua.Outcome, bool, error) {
	cctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	var b lua.Batch
	b.Add(d)
	cmd := b.Cmd(cctx)
	_ = l.rdb.Process(cctx, cmd)
	if lua.IsNoScript(cmd.Err()) {
		l.lostScripts()
		cmd = b.EvalCmd(cctx)
		_ = l.rdb.Process(cctx, cmd)
	}
	out, err := b.Read(cmd, make([]lua.Outcome, 0, 1))
	if err != nil {
		return lua.Outcome{}, cctx.Err() != nil, err
	}
	return out[0], false, nil
}

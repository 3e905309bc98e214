package limiter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

// pipeliner is what the batcher needs of a go-redis client: *redis.Client,
// *redis.ClusterClient, *redis.Ring and redis.UniversalClient all have it.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// batcher sends concurrent script calls to Redis together.
//
// There is no collection window and no goroutine of its own. Up to maxInFlight calls
// or pipelines may be out at once. A call that finds a free slot goes out at once, on
// its caller's goroutine, as one plain EVALSHA: with one caller, a decision costs what
// it cost without the batcher. A call that finds every slot busy joins the queue; when
// a slot's round trip ends and the queue is not empty, that slot sends everything
// queued (up to maxBatch calls) as one pipeline, on a goroutine that keeps sending until
// the queue is empty and then exits. So Redis always has work while callers wait, and
// the batch size follows the load: 1 at low concurrency, up to maxBatch under load.
// (A fixed collection window with one batch in flight leaves Redis idle while it waits,
// about 0.7x of what it can do.)
//
// Invariant, under mu: a free slot means an empty queue. A slot that frees up with a
// non-empty queue is never released; it goes on sending.
//
// Each call keeps its own deadline (Options.Timeout from when it was asked): a caller
// whose call is not answered in time abandons it and the decision comes from the
// fallback, as without the batcher; a call abandoned while still queued is not sent.
type batcher struct {
	rdb         pipeliner
	runner      runner
	timeout     time.Duration
	maxBatch    int
	maxInFlight int
	m           *redisMetrics

	mu       sync.Mutex
	queue    []*call
	inflight int
}

// runner is what the batcher needs of the limiter: a lone call sent at once, on the
// caller's goroutine, and word that Redis has lost the scripts (reload them out of band).
type runner interface {
	direct(ctx context.Context, op lua.Script, key lua.Ref, lim regions.Limit, n, debt int64) (answer, error)
	lostScripts()
}

// call states.
const (
	callWaiting   int32 = iota // queued
	callSent                   // in a pipeline on its way to Redis
	callAnswered               // the sender wrote the answer and will signal done
	callAbandoned              // the caller gave up; the sender must not signal
)

// call is one queued script call and, once answered, its answer.
type call struct {
	op   lua.Script
	key  lua.Ref
	lim  regions.Limit
	n    int64
	debt int64

	state   atomic.Int32
	granted int64
	res     lua.Result
	err     error
	done    chan struct{} // buffered: the sender never blocks on it
	timer   *time.Timer
}

var callPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &call{done: make(chan struct{}, 1), timer: t}
}}

func newBatcher(r runner, rdb pipeliner, timeout time.Duration, maxBatch, maxInFlight int, m *redisMetrics) *batcher {
	return &batcher{
		rdb: rdb, runner: r, timeout: timeout,
		maxBatch: maxBatch, maxInFlight: maxInFlight, m: m,
		queue: make([]*call, 0, maxBatch),
	}
}

// answer is what a script call returned.
type answer struct {
	granted  int64 // tokens taken: for a Take, n when allowed
	res      lua.Result
	timedOut bool // the call ran out of time (with an error)
}

// do runs one Take or Lease call. ctx is the caller's; the call is also bounded by the
// batcher's timeout from now.
func (b *batcher) do(ctx context.Context, op lua.Script, key lua.Ref, lim regions.Limit, n, debt int64) (answer, error) {
	b.mu.Lock()
	if b.inflight < b.maxInFlight { // the queue is empty: go now, alone
		b.inflight++
		b.mu.Unlock()
		a, err := b.runner.direct(ctx, op, key, lim, n, debt)
		b.mu.Lock()
		b.releaseLocked()
		b.mu.Unlock()
		return a, err
	}
	c := callPool.Get().(*call)
	c.op, c.key, c.lim, c.n, c.debt = op, key, lim, n, debt
	c.state.Store(callWaiting)
	b.queue = append(b.queue, c)
	b.mu.Unlock()

	c.timer.Reset(b.timeout)
	select {
	case <-c.done:
		c.timer.Stop()
	case <-c.timer.C:
		// c is not reused after it is abandoned: a sender may hold it.
		if c.state.CompareAndSwap(callWaiting, callAbandoned) {
			return answer{timedOut: true}, errCallTimeout // never sent
		}
		if c.state.CompareAndSwap(callSent, callAbandoned) {
			return answer{timedOut: true}, errCallTimeout
		}
		<-c.done // answered just in time
	case <-ctx.Done():
		c.timer.Stop()
		if c.state.CompareAndSwap(callWaiting, callAbandoned) {
			return answer{}, ctx.Err()
		}
		if c.state.CompareAndSwap(callSent, callAbandoned) {
			return answer{}, ctx.Err()
		}
		<-c.done
	}
	a, err := answer{granted: c.granted, res: c.res, timedOut: isTimeout(c.err)}, c.err
	c.key, c.err = lua.Ref{}, nil
	callPool.Put(c)
	return a, err
}

// isTimeout reports whether err says a deadline passed: the pipeline's context, or the
// socket deadline go-redis derives from it.
func isTimeout(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// errCallTimeout is the error of a queued call not answered within the timeout.
var errCallTimeout = errors.New("redis call not answered within the limiter timeout")

// releaseLocked ends one slot's round trip: with calls queued, the slot sends them
// next on a goroutine of its own; otherwise it is freed.
func (b *batcher) releaseLocked() {
	if len(b.queue) == 0 {
		b.inflight--
		return
	}
	batch := b.takeLocked(make([]*call, 0, b.maxBatch))
	go b.send(batch)
}

// takeLocked moves up to maxBatch queued calls into batch, oldest first.
func (b *batcher) takeLocked(batch []*call) []*call {
	n := min(len(b.queue), b.maxBatch)
	batch = append(batch[:0], b.queue[:n]...)
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	return batch
}

// send sends batch as one pipeline, answers its calls, and goes on with whatever was
// queued meanwhile until the queue is empty; then it frees its slot and returns.
func (b *batcher) send(batch []*call) {
	cmds := make([]*redis.Cmd, 0, b.maxBatch)
	for {
		cmds = b.exec(batch, cmds[:0])
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

// exec runs the calls of batch that are still wanted in one pipeline, then answers
// them. Calls that failed with NOSCRIPT (Redis restarted or flushed its scripts) go
// again as EVAL in one more round trip, if the timeout leaves time for it, and the
// scripts are reloaded out of band, so later calls find them even when this one cannot.
func (b *batcher) exec(batch []*call, cmds []*redis.Cmd) []*redis.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	pipe := b.rdb.Pipeline()
	for _, c := range batch {
		if !c.state.CompareAndSwap(callWaiting, callSent) {
			cmds = append(cmds, nil) // abandoned while queued: not sent
			continue
		}
		cmd := c.op.EvalShaCmd(ctx, c.key, c.lim.Capacity, c.lim.RefillPerSecond, c.n, c.debt)
		cmds = append(cmds, cmd)
		_ = pipe.Process(ctx, cmd)
	}
	sent := pipe.Len()
	if sent == 0 {
		return cmds
	}
	b.m.pipelines.Inc()
	b.m.pipelined.Add(float64(sent))
	_, _ = pipe.Exec(ctx) // each command carries its own error; read below

	retry := false
	for i, cmd := range cmds {
		if cmd != nil && lua.IsNoScript(cmd.Err()) {
			c := batch[i]
			cmds[i] = c.op.EvalCmd(ctx, c.key, c.lim.Capacity, c.lim.RefillPerSecond, c.n, c.debt)
			_ = pipe.Process(ctx, cmds[i])
			retry = true
		}
	}
	if retry {
		b.runner.lostScripts()
		_, _ = pipe.Exec(ctx)
	}

	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		c := batch[i]
		c.granted, c.res, c.err = c.op.Reply(cmd, c.n)
		if c.state.CompareAndSwap(callSent, callAnswered) {
			c.done <- struct{}{}
		}
	}
	return cmds
}

// direct runs one call as a plain EVALSHA bounded by the timeout, on the caller's
// context. After NOSCRIPT it reloads the scripts out of band and retries with EVAL in
// what is left of the timeout.
func (l *Redis) direct(ctx context.Context, op lua.Script, key lua.Ref, lim regions.Limit, n, debt int64) (answer, error) {
	cctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	keys, args := op.Args(key, lim.Capacity, lim.RefillPerSecond, n, debt)
	cmd := l.rdb.EvalSha(cctx, op.Sha(), keys, args...)
	if lua.IsNoScript(cmd.Err()) {
		l.lostScripts()
		cmd = l.rdb.Eval(cctx, op.Source(), keys, args...)
	}
	var (
		a   answer
		err error
	)
	if op == lua.ScriptReturn {
		if err = cmd.Err(); err != nil {
			err = fmt.Errorf("token bucket return %s: %w", key.Key, err)
		}
	} else {
		a.granted, a.res, err = op.Reply(cmd, n)
	}
	a.timedOut = cctx.Err() != nil
	return a, err
}

package limiter

import (
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/quotaplane/quotaplane/regions"
)

// debtTable holds what the fallback admitted and the shared buckets in Redis have yet to
// be charged: per bucket (a tenant's route, a client value of it, or a band of its rule), the tokens owed and
// the limit they were admitted under. It lives apart from the fallback's buckets, which
// are dropped when an episode ends, since a debt lasts until a reply says what Redis
// charged of it, whatever the breaker does meanwhile. It holds at most max buckets: the
// fallback admits nothing for a bucket it could not record a debt for.
type debtTable struct {
	max    int64
	size   atomic.Int64 // buckets owing, so a limiter owing nothing skips the lookup
	seed   maphash.Seed
	shards [localShards]debtShard
}

type debtShard struct {
	mu sync.Mutex
	m  map[bucketID]debt
	_  [48]byte // one cache line each
}

// debt is one bucket's: the tokens owed, and the limit of the request that last added to
// it (what a flush at shutdown charges it under).
type debt struct {
	tokens int64
	lim    regions.Limit
}

// owedBucket is one entry of a drained table.
type owedBucket struct {
	id bucketID
	debt
}

func newDebtTable(max int) *debtTable {
	t := &debtTable{max: int64(max), seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].m = make(map[bucketID]debt)
	}
	return t
}

func (t *debtTable) shard(id bucketID) *debtShard {
	h := maphash.String(t.seed, id.tenant)*0x9e3779b97f4a7c15 ^ maphash.String(t.seed, id.route)
	if id.value != "" {
		h = h*0xbf58476d1ce4e5b9 ^ maphash.String(t.seed, id.value)
	}
	if id.band != "" {
		h = h*0x94d049bb133111eb ^ maphash.String(t.seed, id.band)
	}
	return &t.shards[h>>58]
}

// room reports whether id may owe: it owes already, or the table has room.
func (t *debtTable) room(id bucketID) bool {
	if t.size.Load() < t.max {
		return true
	}
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.m[id]
	return ok
}

// add records tokens more owed by id, admitted under lim.
func (t *debtTable) add(id bucketID, lim regions.Limit, tokens int64) {
	if tokens <= 0 {
		return
	}
	s := t.shard(id)
	s.mu.Lock()
	d, ok := s.m[id]
	s.m[id] = debt{tokens: d.tokens + tokens, lim: lim}
	s.mu.Unlock()
	if !ok {
		t.size.Add(1)
	}
}

// take removes up to n tokens of id's debt and returns them: the caller sends them with a
// call and must settle them (putBack when no reply was read).
func (t *debtTable) take(id bucketID, n int64) int64 {
	if t.size.Load() == 0 {
		return 0 // the usual case: nothing is owed
	}
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.m[id]
	if !ok {
		return 0
	}
	got := min(d.tokens, n)
	if d.tokens -= got; d.tokens > 0 {
		s.m[id] = d
	} else {
		delete(s.m, id)
		t.size.Add(-1)
	}
	return got
}

// drain removes and returns every debt (a flush at shutdown).
func (t *debtTable) drain() []owedBucket {
	var out []owedBucket
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for id, d := range s.m {
			out = append(out, owedBucket{id, d})
		}
		t.size.Add(-int64(len(s.m)))
		clear(s.m)
		s.mu.Unlock()
	}
	return out
}

// total is the tokens owed over every bucket.
func (t *debtTable) total() int64 {
	var n int64
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for _, d := range s.m {
			n += d.tokens
		}
		s.mu.Unlock()
	}
	return n
}

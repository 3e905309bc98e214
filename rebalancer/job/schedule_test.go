package job

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

type tickLog struct {
	mu    sync.Mutex
	ticks map[kind][]time.Duration // offsets from the start
}

func (l *tickLog) count(k kind) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ticks[k])
}

// TestScheduleTicks checks the loop in a synctest bubble: the full run at once and then
// every interval, the check every check interval, nothing once stopped.
func TestScheduleTicks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		log := &tickLog{ticks: map[kind][]time.Duration{}}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- runSchedule(ctx, schedule{
				interval: 5 * time.Minute, check: time.Minute, stopTimeout: time.Second,
				tick: func(_ context.Context, k kind) {
					log.mu.Lock()
					log.ticks[k] = append(log.ticks[k], time.Since(start))
					log.mu.Unlock()
				},
			})
		}()
		time.Sleep(30*time.Minute + 30*time.Second)
		synctest.Wait()
		// Runs at 0, 5, ..., 30 min; checks every minute up to 30.
		if got := log.count(kindRun); got != 7 {
			t.Errorf("runs = %d in 30.5 min, want 7: %v", got, log.ticks[kindRun])
		}
		if got := log.count(kindCheck); got != 30 {
			t.Errorf("checks = %d in 30.5 min, want 30", got)
		}
		if first := log.ticks[kindRun][0]; first != 0 {
			t.Errorf("first run at %s, want at once", first)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		before := log.count(kindRun) + log.count(kindCheck)
		time.Sleep(time.Hour)
		synctest.Wait()
		if after := log.count(kindRun) + log.count(kindCheck); after != before {
			t.Errorf("%d ticks after stop", after-before)
		}
	})
}

type flipElector struct{ leader atomic.Bool }

func (e *flipElector) IsLeader(context.Context) error {
	if e.leader.Load() {
		return nil
	}
	return errors.New("not leader")
}

// TestScheduleOnlyLeaderActs: while the elector refuses, no tick runs and each refusal
// is reported; once it accepts, ticks run.
func TestScheduleOnlyLeaderActs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ran, refused [2]atomic.Int64
		el := &flipElector{}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- runSchedule(ctx, schedule{
				interval: 5 * time.Minute, check: time.Minute, stopTimeout: time.Second, elector: el,
				tick: func(_ context.Context, k kind) { ran[k].Add(1) },
				leader: func(k kind, err error) {
					if err != nil {
						refused[k].Add(1)
					}
				},
			})
		}()
		time.Sleep(10*time.Minute + 30*time.Second)
		synctest.Wait()
		if ran[kindRun].Load()+ran[kindCheck].Load() != 0 {
			t.Fatalf("a follower ran %d runs and %d checks", ran[kindRun].Load(), ran[kindCheck].Load())
		}
		if refused[kindRun].Load() != 3 || refused[kindCheck].Load() != 10 {
			t.Errorf("refusals = %d runs, %d checks; want 3 and 10", refused[kindRun].Load(), refused[kindCheck].Load())
		}
		el.leader.Store(true)
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		if ran[kindRun].Load() != 1 || ran[kindCheck].Load() != 5 {
			t.Errorf("as leader for 5 min: %d runs, %d checks; want 1 and 5", ran[kindRun].Load(), ran[kindCheck].Load())
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

package job

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
)

// Run schedules the full run every Interval (the first at once) and the fast-path check
// every CheckInterval, until ctx is done. Only the leader acts: before every tick the
// Elector is asked, and a refusal is counted as result not_leader — or skipped_database
// when the elector could not reach PostgreSQL (its error wraps ErrDatabaseUnavailable).
// Run returns after the scheduler and any tick in progress have stopped.
func (j *Job) Run(ctx context.Context) error {
	// The watchdog: an overdue tick (Job.StaleAfter) is logged and counted even while
	// the tick that should have ended hangs.
	started := time.Now()
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopWatch()
	wg.Go(func() {
		t := time.NewTicker(max(j.StaleAfter()/4, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case now := <-t.C:
				leading := j.cfg.Elector == nil || j.leading.Load()
				j.watchOverdue(now, started, leading)
			}
		}
	})
	return runSchedule(ctx, schedule{
		interval: j.cfg.Interval,
		check:    j.cfg.CheckInterval,
		elector:  j.cfg.Elector,
		tick: func(ctx context.Context, k kind) {
			_, _ = j.tick(ctx, k) // counted and logged by tick
		},
		leader: func(k kind, err error) {
			if errors.Is(err, ErrDatabaseUnavailable) {
				j.m.leader.Set(0)
				j.leading.Store(false)
				j.m.count(k, ResultSkippedDatabase)
				if !j.lockDBDown.Swap(true) { // logged once per outage
					j.log.Warn("leader lock: postgresql unreachable; ticks skipped until it is back", "err", err)
				}
				return
			}
			if j.lockDBDown.Swap(false) {
				j.log.Info("leader lock: postgresql reachable again")
			}
			if errors.Is(err, ErrLockLost) {
				j.log.Warn("leader lock lost: this rebalancer no longer leads; it tries to take the lock again at the next tick", "err", err)
			}
			if err != nil {
				j.m.leader.Set(0)
				j.leading.Store(false)
				j.m.count(k, ResultNotLeader)
				return
			}
			if !j.leading.Swap(true) {
				j.lastTick.Store(time.Now().UnixNano()) // overdue counts from leading
			}
			j.m.leader.Set(1)
		},
		stopTimeout: j.cfg.ReloadWait + 30*time.Second,
	})
}

// schedule is the loop without the rebalancing, so it can be tested on its own.
type schedule struct {
	interval, check time.Duration
	elector         gocron.Elector // nil: always act
	tick            func(ctx context.Context, k kind)
	// leader is told the elector's answer before each tick (nil elector: not called).
	leader      func(k kind, err error)
	stopTimeout time.Duration
}

type kindKey struct{}

// countingElector asks the real elector and reports its answer per tick kind, which it
// finds in the job's context.
type countingElector struct {
	inner  gocron.Elector
	report func(k kind, err error)
}

func (e countingElector) IsLeader(ctx context.Context) error {
	err := e.inner.IsLeader(ctx)
	k, _ := ctx.Value(kindKey{}).(kind)
	e.report(k, err)
	return err
}

func runSchedule(ctx context.Context, s schedule) error {
	opts := []gocron.SchedulerOption{gocron.WithStopTimeout(s.stopTimeout)}
	if s.elector != nil {
		opts = append(opts, gocron.WithDistributedElector(countingElector{inner: s.elector, report: s.leader}))
	}
	sched, err := gocron.NewScheduler(opts...)
	if err != nil {
		return fmt.Errorf("rebalancer schedule: %w", err)
	}
	add := func(k kind, every time.Duration, extra ...gocron.JobOption) error {
		_, err := sched.NewJob(gocron.DurationJob(every),
			gocron.NewTask(func(ctx context.Context) { s.tick(ctx, k) }),
			append([]gocron.JobOption{
				gocron.WithName("rebalancer-" + k.String()),
				gocron.WithContext(context.WithValue(ctx, kindKey{}, k)),
				gocron.WithSingletonMode(gocron.LimitModeReschedule),
				// The next tick is due an interval after this one completes: ticks never
				// pile up, and the schedule never lands on the instant just run.
				gocron.WithIntervalFromCompletion(),
			}, extra...)...)
		if err != nil {
			return fmt.Errorf("rebalancer schedule %s every %s: %w", k, every, err)
		}
		return nil
	}
	if err := add(kindRun, s.interval, gocron.WithStartAt(gocron.WithStartImmediately())); err != nil {
		_ = sched.Shutdown()
		return err
	}
	if s.check > 0 && s.check < s.interval {
		if err := add(kindCheck, s.check); err != nil {
			_ = sched.Shutdown()
			return err
		}
	}
	sched.Start()
	<-ctx.Done()
	if err := sched.Shutdown(); err != nil {
		return fmt.Errorf("rebalancer schedule: stop: %w", err)
	}
	return nil
}

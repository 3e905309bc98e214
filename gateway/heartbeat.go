package gateway

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/regions/store"
)

// heartbeats record this instance alive in gateway_instance, so that the region's
// gateways know how many share its fallback budget.
type heartbeats struct {
	store  *store.Store
	id     string
	region string
	every  time.Duration
	log    *slog.Logger
	errs   prometheus.Counter
	first  func() // called after the first heartbeat that succeeded
	// xmin is the transaction horizon of the snapshot in force (regions.Snapshot.Xmin),
	// reported with each heartbeat: the acknowledgment other regions' share increases
	// wait for (regions.Snapshot.Pending).
	xmin func() int64
}

// run records the instance alive every interval until ctx ends. Failures are counted,
// and logged when the state changes.
func (h *heartbeats) run(ctx context.Context) {
	t := time.NewTicker(h.every)
	defer t.Stop()
	failing := false
	for {
		err := h.beat(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && h.first != nil:
			h.first()
			h.first = nil
			if failing {
				h.log.Info("heartbeat recovered", "region", h.region, "instance", h.id)
				failing = false
			}
		case err != nil:
			h.errs.Inc()
			if !failing {
				h.log.Warn("heartbeat failed", "region", h.region, "instance", h.id, "err", err)
			}
			failing = true
		case failing:
			h.log.Info("heartbeat recovered", "region", h.region, "instance", h.id)
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (h *heartbeats) beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(h.every, time.Second))
	defer cancel()
	var xmin int64
	if h.xmin != nil {
		xmin = h.xmin()
	}
	return h.store.HeartbeatAt(ctx, h.id, h.region, xmin)
}

// remove deletes the heartbeat on shutdown so the others' fallback shares grow at once
// rather than after the TTL.
func (h *heartbeats) remove(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := h.store.RemoveInstance(rctx, h.id); err != nil {
		h.log.Warn("remove heartbeat failed", "region", h.region, "instance", h.id, "err", err)
	}
}

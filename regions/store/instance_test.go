package store

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestHeartbeatPrunesCrashedInstances: rows of gateways that crashed (never removed) are
// deleted by the heartbeats of their region once unseen for InstanceHorizon; recent rows,
// the beating instance and other regions' rows stay.
func TestHeartbeatPrunesCrashedInstances(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	for _, hb := range [][2]string{{"crashed-1", "us-east"}, {"crashed-2", "us-east"}, {"recent", "us-east"}, {"other-region", "eu-west"}} {
		if err := s.Heartbeat(ctx, hb[0], hb[1]); err != nil {
			t.Fatal(err)
		}
	}
	exec(t, s, `UPDATE gateway_instance SET last_seen = now() - interval '2 hours' WHERE id IN ('crashed-1', 'crashed-2', 'other-region')`)
	exec(t, s, `UPDATE gateway_instance SET last_seen = now() - interval '50 minutes' WHERE id = 'recent'`)

	// One heartbeat in 20 prunes: 500 heartbeats miss with probability (19/20)^500 < 1e-11.
	pruned := false
	for i := 0; i < 500 && !pruned; i++ {
		if err := s.Heartbeat(ctx, "alive", "us-east"); err != nil {
			t.Fatal(err)
		}
		pruned = !slices.Contains(instanceIDs(t, s), "crashed-1")
	}
	if !pruned {
		t.Fatal("500 heartbeats never pruned a row unseen for 2 hours")
	}
	if got, want := instanceIDs(t, s), []string{"other-region", "alive", "recent"}; !slices.Equal(got, want) {
		t.Fatalf("after pruning: %v, want %v", got, want)
	}

	// PruneInstances directly: the recent row goes with a shorter horizon.
	n, err := s.PruneInstances(ctx, "us-east", 30*time.Minute)
	if err != nil || n != 1 {
		t.Fatalf("PruneInstances = %d, %v; want 1 (recent)", n, err)
	}
	if got, want := instanceIDs(t, s), []string{"other-region", "alive"}; !slices.Equal(got, want) {
		t.Fatalf("after PruneInstances: %v, want %v", got, want)
	}
	if _, err := s.PruneInstances(ctx, "us-east", 0); err == nil {
		t.Fatal("PruneInstances with olderThan 0 succeeded")
	}
}

func instanceIDs(t *testing.T, s *Store) []string {
	t.Helper()
	in, err := s.Instances(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, i := range in {
		ids = append(ids, i.ID)
	}
	return ids
}

package lua

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestPipelineCommands: Take and Lease queued on one pipeline answer as the one-call
// methods do; after SCRIPT FLUSH they fail with NOSCRIPT, EvalCmd runs them and
// reloads the script, and EVALSHA works again.
func TestPipelineCommands(t *testing.T) {
	rdb := newRedis(t)
	ctx := context.Background()
	b := NewTokenBucket(rdb)
	if err := b.Load(ctx); err != nil {
		t.Fatal(err)
	}
	keys := Keys{Prefix: "pipe"}
	k1, k2 := keys.Bucket("a", "r"), keys.Bucket("b", "r")

	exec := func(cmds ...redis.Cmder) {
		t.Helper()
		pipe := rdb.Pipeline()
		_ = pipe.BatchProcess(ctx, cmds...)
		_, _ = pipe.Exec(ctx) // the error of the first failed command; each is read below
	}
	take := ScriptTake.EvalShaCmd(ctx, k1, 5, 0.001, 2, 0)
	lease := ScriptLease.EvalShaCmd(ctx, k2, 10, 0.001, 7, 0)
	bad := ScriptTake.EvalShaCmd(ctx, k1, 5, 0.001, 6, 0) // cost above capacity
	exec(take, lease, bad)
	if r, err := TakeReply(take); err != nil || !r.Allowed || r.Remaining != 3 {
		t.Errorf("take: %+v, %v; want allowed with 3 remaining", r, err)
	}
	if n, r, err := LeaseReply(lease); err != nil || n != 7 || r.Remaining != 3 {
		t.Errorf("lease: granted %d, %+v, %v; want 7 granted, 3 remaining", n, r, err)
	}
	if _, err := TakeReply(bad); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("cost above capacity: %v, want ErrInvalidArgument", err)
	}

	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	take = ScriptTake.EvalShaCmd(ctx, k1, 5, 0.001, 1, 0)
	exec(take)
	if _, err := TakeReply(take); !IsNoScript(take.Err()) || err == nil {
		t.Fatalf("after SCRIPT FLUSH: %v, want NOSCRIPT", take.Err())
	}
	take = ScriptTake.EvalCmd(ctx, k1, 5, 0.001, 1, 0)
	exec(take)
	if r, err := TakeReply(take); err != nil || r.Remaining != 2 {
		t.Errorf("EVAL retry: %+v, %v; want allowed with 2 remaining", r, err)
	}
	take = ScriptTake.EvalShaCmd(ctx, k1, 5, 0.001, 1, 0)
	exec(take)
	if r, err := TakeReply(take); err != nil || r.Remaining != 1 {
		t.Errorf("EVALSHA after the EVAL: %+v, %v; want allowed with 1 remaining", r, err)
	}
	if ScriptTake.Sha() == ScriptLease.Sha() || ScriptLease.Sha() == ScriptReturn.Sha() || len(ScriptTake.Sha()) != 40 {
		t.Errorf("script SHAs %q %q %q", ScriptTake.Sha(), ScriptLease.Sha(), ScriptReturn.Sha())
	}
}

package lua

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Script names one of the bucket scripts, for callers that queue calls on a pipeline
// themselves (a batcher) instead of calling TokenBucket's methods one round trip each.
//
// The commands are built, not run: queue them with redis.Pipeliner.Process or
// BatchProcess, run Exec, then read each one with TakeReply or LeaseReply. Arguments are
// not checked here; check them as Take and Lease do (the scripts refuse bad ones with an
// error that the readers wrap in ErrInvalidArgument).
type Script int

const (
	// ScriptTake is token_bucket.lua (Take).
	ScriptTake Script = iota
	// ScriptLease is lease.lua (Lease).
	ScriptLease
	// ScriptReturn is return.lua (Return).
	ScriptReturn
)

func (s Script) script() (*redis.Script, string) {
	switch s {
	case ScriptLease:
		return leaseScript, leaseSrc
	case ScriptReturn:
		return returnScript, returnSrc
	default:
		return takeScript, tokenBucketSrc
	}
}

// Source is the script's text, the argument of EVAL and SCRIPT LOAD.
func (s Script) Source() string {
	_, src := s.script()
	return src
}

// Sha is the SHA1 of the script's text, the argument of EVALSHA.
func (s Script) Sha() string {
	sc, _ := s.script()
	return sc.Hash()
}

// EvalShaCmd builds "EVALSHA sha 1 key capacity refill n [debt]" (n is cost, want or the
// tokens returned; debt, for Take and Lease, the tokens to charge first, left out when 0)
// without running it.
func (s Script) EvalShaCmd(ctx context.Context, key string, capacity int64, refill float64, n, debt int64) *redis.Cmd {
	if debt != 0 {
		return redis.NewCmd(ctx, "evalsha", s.Sha(), 1, key, capacity, refill, n, debt)
	}
	return redis.NewCmd(ctx, "evalsha", s.Sha(), 1, key, capacity, refill, n)
}

// EvalCmd builds the same call as EVAL with the whole script text. Running it also
// loads the script into that server's cache, so it is the retry of an EvalShaCmd that
// failed with NOSCRIPT (a restarted or flushed server, a new cluster node).
func (s Script) EvalCmd(ctx context.Context, key string, capacity int64, refill float64, n, debt int64) *redis.Cmd {
	_, src := s.script()
	if debt != 0 {
		return redis.NewCmd(ctx, "eval", src, 1, key, capacity, refill, n, debt)
	}
	return redis.NewCmd(ctx, "eval", src, 1, key, capacity, refill, n)
}

// IsNoScript reports whether err is Redis's NOSCRIPT reply: the server does not have
// the script cached; retry with EvalCmd.
func IsNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

// TakeReply reads the answer of a run ScriptTake command (see Take).
func TakeReply(cmd *redis.Cmd) (Result, error) {
	key := cmdKey(cmd)
	v, err := cmd.Slice()
	if err != nil {
		return Result{}, scriptError("take", key, err)
	}
	r, err := parse4(v)
	if err != nil {
		return Result{}, fmt.Errorf("token bucket take %s: %w", key, err)
	}
	return Result{
		Allowed:    r[0] == 1,
		Remaining:  r[1],
		RetryAfter: time.Duration(r[2]) * time.Millisecond,
		ResetAfter: time.Duration(r[3]) * time.Millisecond,
	}, nil
}

// LeaseReply reads the answer of a run ScriptLease command (see Lease): the tokens
// granted and the Result.
func LeaseReply(cmd *redis.Cmd) (int64, Result, error) {
	key := cmdKey(cmd)
	v, err := cmd.Slice()
	if err != nil {
		return 0, Result{}, scriptError("lease", key, err)
	}
	r, err := parse4(v)
	if err != nil {
		return 0, Result{}, fmt.Errorf("token bucket lease %s: %w", key, err)
	}
	return r[0], Result{
		Allowed:    r[0] > 0,
		Remaining:  r[1],
		RetryAfter: time.Duration(r[2]) * time.Millisecond,
		ResetAfter: time.Duration(r[3]) * time.Millisecond,
	}, nil
}

// cmdKey is the key of a script command built here, for error messages.
func cmdKey(cmd *redis.Cmd) string {
	if args := cmd.Args(); len(args) > 3 {
		if k, ok := args[3].(string); ok {
			return k
		}
	}
	return "?"
}

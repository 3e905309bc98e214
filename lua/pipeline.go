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

// Args is the one encoder of a script call: the keys and arguments of "EVALSHA sha
// numkeys keys... capacity refill n [debt]" (n is cost, want or the tokens returned;
// debt, for Take and Lease, the tokens to charge first, left out when 0). The rule
// record is a second key when ref has one.
func (s Script) Args(ref Ref, capacity int64, refill float64, n, debt int64) ([]string, []any) {
	keys := []string{ref.Key}
	if ref.Record != "" {
		keys = append(keys, ref.Record)
	}
	args := []any{capacity, refill, n}
	if debt != 0 {
		args = append(args, debt)
	}
	return keys, args
}

// EvalShaCmd builds the EVALSHA of a call (see Args) without running it.
func (s Script) EvalShaCmd(ctx context.Context, ref Ref, capacity int64, refill float64, n, debt int64) *redis.Cmd {
	return redis.NewCmd(ctx, s.cmdArgs("evalsha", s.Sha(), ref, capacity, refill, n, debt)...)
}

// EvalCmd builds the same call as EVAL with the whole script text. Running it also
// loads the script into that server's cache, so it is the retry of an EvalShaCmd that
// failed with NOSCRIPT (a restarted or flushed server, a new cluster node).
func (s Script) EvalCmd(ctx context.Context, ref Ref, capacity int64, refill float64, n, debt int64) *redis.Cmd {
	return redis.NewCmd(ctx, s.cmdArgs("eval", s.Source(), ref, capacity, refill, n, debt)...)
}

func (s Script) cmdArgs(verb, script string, ref Ref, capacity int64, refill float64, n, debt int64) []any {
	keys, args := s.Args(ref, capacity, refill, n, debt)
	out := make([]any, 0, 3+len(keys)+len(args))
	out = append(out, verb, script, len(keys))
	for _, k := range keys {
		out = append(out, k)
	}
	return append(out, args...)
}

// Reply reads the answer of a run Take or Lease command: the tokens taken (a Take's
// cost when allowed, a Lease's grant) and the Result. n is the call's n (the cost).
func (s Script) Reply(cmd *redis.Cmd, n int64) (int64, Result, error) {
	if s == ScriptLease {
		return LeaseReply(cmd)
	}
	res, err := TakeReply(cmd)
	if err != nil || !res.Allowed {
		return 0, res, err
	}
	return n, res, nil
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
	r, err := parse5(v)
	if err != nil {
		return Result{}, fmt.Errorf("token bucket take %s: %w", key, err)
	}
	return Result{
		Allowed:    r[0] == 1,
		Remaining:  r[1],
		RetryAfter: time.Duration(r[2]) * time.Millisecond,
		ResetAfter: time.Duration(r[3]) * time.Millisecond,
		Charged:    r[4],
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
	r, err := parse5(v)
	if err != nil {
		return 0, Result{}, fmt.Errorf("token bucket lease %s: %w", key, err)
	}
	return r[0], Result{
		Allowed:    r[0] > 0,
		Remaining:  r[1],
		RetryAfter: time.Duration(r[2]) * time.Millisecond,
		ResetAfter: time.Duration(r[3]) * time.Millisecond,
		Charged:    r[4],
	}, nil
}

// cmdKey is the key of a script command (EVAL, EVALSHA), for error messages.
func cmdKey(cmd *redis.Cmd) string {
	if args := cmd.Args(); len(args) > 3 {
		switch k := args[3].(type) {
		case string:
			return k
		case []string:
			if len(k) > 0 {
				return k[0]
			}
		}
	}
	return "?"
}

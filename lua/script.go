package lua

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed state.lua
	stateSrc string
	//go:embed decide.lua
	decideBody string
	//go:embed inspect.lua
	inspectBody string

	// Each script is the shared storage code (state.lua) followed by its own body, so
	// each one still loads alone.
	decideSrc  = stateSrc + decideBody
	inspectSrc = stateSrc + inspectBody

	decideScript  = redis.NewScript(decideSrc)
	inspectScript = redis.NewScript(inspectSrc)
)

// DecideSource is the text of decide.lua with state.lua (for SCRIPT LOAD by tools such as
// redis-benchmark, and for EVAL after NOSCRIPT).
func DecideSource() string { return decideSrc }

// DecideSha is the SHA1 of DecideSource, the argument of EVALSHA.
func DecideSha() string { return decideScript.Hash() }

// Load loads the scripts into the script cache of rdb (for a cluster client, of every
// node it reaches), so the first calls after a start need no EVAL.
func Load(ctx context.Context, rdb redis.Scripter) error {
	for _, s := range []*redis.Script{decideScript, inspectScript} {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			return fmt.Errorf("load bucket scripts: %w", err)
		}
	}
	return nil
}

// IsNoScript reports whether err is Redis's NOSCRIPT reply: the server does not have the
// script cached; retry with EVAL (Batch.EvalCmd).
func IsNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

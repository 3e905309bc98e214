package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/quotaplane/quotaplane/regions/store"
)

// limitsDeadline bounds reading and decoding a limits file.
const limitsDeadline = 30 * time.Second

// readLimitsBytes reads path ("-": stdin), at most store.MaxLimitsSize+1 bytes, until ctx ends:
// a stdin that never closes must not hold the command past SIGTERM.
func readLimitsBytes(ctx context.Context, stdin io.Reader, path string) ([]byte, error) {
	type result struct {
		data []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		if path == "-" {
			r.data, r.err = io.ReadAll(io.LimitReader(stdin, store.MaxLimitsSize+1))
			if r.err != nil {
				r.err = fmt.Errorf("read: %w", r.err) // the caller unwraps one level
			}
		} else {
			r.data, r.err = readFileLimited(path)
		}
		done <- r
	}()
	select {
	case r := <-done:
		return r.data, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("reading stopped: %w", context.Cause(ctx))
	}
}

// readFileLimited reads at most store.MaxLimitsSize+1 bytes of path.
func readFileLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, store.MaxLimitsSize+1))
	if err != nil {
		return nil, &os.PathError{Op: "read", Path: path, Err: err}
	}
	return b, nil
}

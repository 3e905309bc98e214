package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// BlastOptions configure Blast.
type BlastOptions struct {
	// Addr is the Redis to load (host:port).
	Addr string
	// Conns connections (default 50), each with Pipe commands in flight (default 16),
	// as redis-benchmark -c and -P.
	Conns, Pipe int
	// Total is the commands to send in all.
	Total int
	// Commands are the commands to cycle through (RESP arrays of bulk strings, see
	// RESPCommand), built before the clock starts so the client does little more than copy
	// bytes. Blast is redis-benchmark for commands redis-benchmark cannot send: binary
	// arguments (a NUL byte ends a C string).
	Commands [][]byte
}

// RESPCommand encodes one command as a RESP array of bulk strings.
func RESPCommand(args ...[]byte) []byte {
	b := []byte("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, "\r\n"...)
		b = append(b, a...)
		b = append(b, "\r\n"...)
	}
	return b
}

// Blast sends o.Total commands over o.Conns connections, o.Pipe in flight on each, and
// waits for every reply. It returns the time it took and the first error reply or
// connection error, if any (a benchmark must not count refused commands).
func Blast(ctx context.Context, o BlastOptions) (time.Duration, error) {
	if o.Conns <= 0 {
		o.Conns = 50
	}
	if o.Pipe <= 0 {
		o.Pipe = 16
	}
	if len(o.Commands) == 0 || o.Total <= 0 {
		return 0, errors.New("blast: no commands")
	}
	conns := make([]net.Conn, o.Conns)
	for i := range conns {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", o.Addr)
		if err != nil {
			for _, c := range conns[:i] {
				_ = c.Close()
			}
			return 0, fmt.Errorf("blast: %w", err)
		}
		conns[i] = c
	}
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	per := (o.Total + o.Conns - 1) / o.Conns
	start := time.Now()
	for ci, c := range conns {
		n := min(per, o.Total-ci*per)
		if n <= 0 {
			break
		}
		wg.Go(func() {
			if deadline, ok := ctx.Deadline(); ok {
				_ = c.SetDeadline(deadline)
			}
			if err := blastConn(c, o, ci*per, n); err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return time.Since(start), firstErr
}

// blastConn sends n commands from offset on c, keeping pipe in flight.
func blastConn(c net.Conn, o BlastOptions, offset, n int) error {
	r := bufio.NewReaderSize(c, 64<<10)
	w := bufio.NewWriterSize(c, 64<<10)
	sent, read := 0, 0
	var replyErr error
	for read < n {
		for sent < n && sent-read < o.Pipe {
			if _, err := w.Write(o.Commands[(offset+sent)%len(o.Commands)]); err != nil {
				return err
			}
			sent++
		}
		if err := w.Flush(); err != nil {
			return err
		}
		for read < sent {
			err := skipReply(r)
			var re replyError
			if errors.As(err, &re) {
				if replyErr == nil {
					replyErr = re
				}
			} else if err != nil {
				return err
			}
			read++
			if r.Buffered() == 0 && sent < n {
				break // refill the pipe before blocking on the next reply
			}
		}
	}
	return replyErr
}

type replyError string

func (e replyError) Error() string { return "redis: " + string(e) }

// skipReply reads one RESP reply and returns a replyError for an error reply.
func skipReply(r *bufio.Reader) error {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return err
	}
	if len(line) < 3 {
		return fmt.Errorf("blast: short reply line %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+', ':':
		return nil
	case '-':
		return replyError(body)
	case '$':
		n, err := strconv.Atoi(string(body))
		if err != nil {
			return err
		}
		if n >= 0 {
			_, err = r.Discard(n + 2)
		}
		return err
	case '*':
		n, err := strconv.Atoi(string(body))
		if err != nil {
			return err
		}
		for range n {
			if err := skipReply(r); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("blast: unexpected reply %q", line)
}

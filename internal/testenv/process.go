package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Process is one server started by this package. Its methods are safe for concurrent use.
type Process struct {
	// Name is the server kind: "redis", "postgres" or "prometheus".
	Name string
	// Host and Port are the loopback address the server listens on.
	Host string
	Port int
	// Dir is the server's throwaway data directory.
	Dir string

	bin  string
	args []string
	env  []string // added to the process's environment
	// stopSig is the graceful-stop signal; SIGTERM when zero. PostgreSQL takes SIGINT
	// (fast shutdown): its SIGTERM waits for every client to disconnect.
	stopSig syscall.Signal
	cred    *syscall.Credential
	ready   func(ctx context.Context) error

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped bool
}

// Addr is host:port.
func (p *Process) Addr() string { return net.JoinHostPort(p.Host, strconv.Itoa(p.Port)) }

// LogPath is the file that holds the server's stdout and stderr.
func (p *Process) LogPath() string { return filepath.Join(p.Dir, p.Name+".log") }

// start runs the binary and waits until ready reports success or ctx ends.
func (p *Process) start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.exited:
		default:
			return fmt.Errorf("start %s: already running", p.Name)
		}
	}
	if err := os.MkdirAll(p.Dir, 0o755); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	logf, err := os.OpenFile(p.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	if p.cred != nil {
		_ = logf.Chown(int(p.cred.Uid), int(p.cred.Gid))
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Dir = p.Dir
	if len(p.env) > 0 {
		cmd.Env = append(os.Environ(), p.env...)
	}
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := spawn(cmd); err != nil {
		logf.Close()
		return fmt.Errorf("start %s (%s): %w", p.Name, p.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	p.cmd, p.exited, p.stopped = cmd, exited, false

	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		err := p.ready(rctx)
		rcancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("start %s: exited before it was ready (log %s): %s", p.Name, p.LogPath(), tail(p.LogPath()))
		case <-ctx.Done():
			p.killLocked()
			return fmt.Errorf("start %s: not ready on %s: %w (log %s)", p.Name, p.Addr(), err, p.LogPath())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop ends the server gracefully (SIGTERM, SIGINT for PostgreSQL; SIGKILL after 10 s) and waits for it.
// Stopping a stopped server does nothing.
func (p *Process) Stop() error {
	sig := p.stopSig
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	return p.signalAndWait(sig, 10*time.Second)
}

// Kill ends the server at once with SIGKILL and waits for it.
func (p *Process) Kill() error { return p.signalAndWait(syscall.SIGKILL, 0) }

// Pause freezes the server (SIGSTOP): connections stay open but nothing is answered.
func (p *Process) Pause() error { return p.signal(syscall.SIGSTOP) }

// Resume undoes Pause (SIGCONT).
func (p *Process) Resume() error { return p.signal(syscall.SIGCONT) }

// Restart starts a stopped server again on the same port and data directory and waits
// until it is ready. A Redis server comes back empty (it keeps nothing on disk).
func (p *Process) Restart(ctx context.Context) error {
	if err := p.Stop(); err != nil {
		return err
	}
	return p.start(ctx)
}

// Running reports whether the server process is alive (paused counts as alive).
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

func (p *Process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return fmt.Errorf("signal %s: not started", p.Name)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s: %w", p.Name, err)
	}
	return nil
}

func (p *Process) signalAndWait(sig syscall.Signal, grace time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	select {
	case <-p.exited:
		return nil
	default:
	}
	// A paused process cannot handle SIGTERM until it is continued.
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	if sig != syscall.SIGKILL {
		_ = p.cmd.Process.Signal(sig)
		select {
		case <-p.exited:
			p.stopped = true
			return nil
		case <-time.After(grace):
		}
	}
	p.killLocked()
	return nil
}

func (p *Process) killLocked() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	// The whole process group: PostgreSQL's backends go with the postmaster.
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.stopped = true
}

// spawner starts every child from one goroutine locked to one OS thread that never
// exits. Pdeathsig is tied to the thread that forked the child, so this makes the kernel
// kill our servers when the test binary or demo exits, however it exits.
var spawner = struct {
	once sync.Once
	reqs chan spawnReq
}{reqs: make(chan spawnReq)}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

func spawn(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		go func() {
			runtime.LockOSThread() // never unlocked: this thread lives as long as the process
			for r := range spawner.reqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	spawner.reqs <- spawnReq{cmd: cmd, done: done}
	return <-done
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lookBinary finds a server binary in PATH or in the extra directories, and otherwise
// returns an error that names the Debian package that provides it.
func lookBinary(name, debianPackage string, extraDirs ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, pattern := range extraDirs {
		matches, _ := filepath.Glob(filepath.Join(pattern, name))
		for i := len(matches) - 1; i >= 0; i-- { // newest version sorts last
			if st, err := os.Stat(matches[i]); err == nil && st.Mode().IsRegular() {
				return matches[i], nil
			}
		}
	}
	return "", fmt.Errorf("%s not found: install the Debian package %s (apt-get install -y %s)", name, debianPackage, debianPackage)
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	const max = 2000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

var errNotReady = errors.New("not ready")

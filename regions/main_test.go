package regions

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

func TestMain(m *testing.M) {
	code := testenv.RunTests(m)
	if code == 0 {
		// Every Reloader.Run and Store must have cleaned up after itself.
		// internal/testenv keeps one OS-thread-locked goroutine that starts servers.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/quotaplane/quotaplane/internal/testenv.spawn.func1.1")); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

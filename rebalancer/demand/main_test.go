package demand_test

import (
	"os"
	"testing"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunTestsNoLeaks(m)) }

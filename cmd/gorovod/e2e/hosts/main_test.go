package hosts

import (
	"os"
	"testing"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
)

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }

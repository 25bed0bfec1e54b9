package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
)

// TestHelpWarnsAboutExposure: the help of the flags that open or hand out
// something sensitive says so.
func TestHelpWarnsAboutExposure(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"run", "--help"}, []string{"unauthenticated", ":9100 binds every interface", "127.0.0.1:9100"}},
	} {
		var out bytes.Buffer
		err := Main(context.Background(), tc.args, Config{Stdout: &out, Stderr: &out})
		if !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%v: %v", tc.args, err)
		}
		text := strings.Join(strings.Fields(out.String()), " ")
		for _, w := range tc.want {
			if !strings.Contains(text, w) {
				t.Errorf("%v does not say %q:\n%s", tc.args, w, out.String())
			}
		}
	}
}

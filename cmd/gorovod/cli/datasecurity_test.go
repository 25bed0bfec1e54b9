package cli

import (
	"flag"
	"io"
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
)

func TestSecurityFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want transport.Security
		bad  bool
	}{
		{nil, transport.SecurityDefault, false},
		{[]string{"--encrypt"}, transport.SecurityEncrypted, false},
		{[]string{"--security", "plain"}, transport.SecurityPlain, false},
		{[]string{"--security", "authenticated"}, transport.SecurityAuthenticated, false},
		{[]string{"--security", "encrypted", "--encrypt"}, transport.SecurityEncrypted, false},
		{[]string{"--security", "plain", "--encrypt"}, 0, true},
		{[]string{"--security", "tls"}, 0, true},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o := securityFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		got, err := o.value()
		if (err != nil) != tc.bad || (!tc.bad && got != tc.want) {
			t.Errorf("%v: %v, %v; want %v (error: %v)", tc.args, got, err, tc.want, tc.bad)
		}
	}
}

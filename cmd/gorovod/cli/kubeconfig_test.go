package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/internal/envconfig"
)

// kubeconfigFile is a kubeconfig with one context per name (cluster at
// https://<name>.test, namespace ns-<name>); current is its current context.
func kubeconfigFile(t *testing.T, dir, file, current string, names ...string) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Config\ncurrent-context: %s\nclusters:\n", current)
	for _, n := range names {
		fmt.Fprintf(&b, "- name: %s\n  cluster:\n    server: https://%s.test\n", n, n)
	}
	b.WriteString("users:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "- name: %s\n  user:\n    token: token-%s\n", n, n)
	}
	b.WriteString("contexts:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "- name: %s\n  context:\n    cluster: %s\n    user: %s\n    namespace: ns-%s\n", n, n, n, n)
	}
	p := filepath.Join(dir, file)
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestResolveKube(t *testing.T) {
	dir := t.TempDir()
	flagFile := kubeconfigFile(t, dir, "flag", "flag", "flag")
	// $KUBECONFIG's files: the first sets the current context; the second
	// adds a context of its own and names another current one, which the
	// first's overrides.
	first := kubeconfigFile(t, dir, "first", "alpha", "alpha")
	second := kubeconfigFile(t, dir, "second", "beta", "beta")
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(filepath.Join(home, ".kube"), 0o700); err != nil {
		t.Fatal(err)
	}
	kubeconfigFile(t, filepath.Join(home, ".kube"), "config", "home", "home")
	noContext := kubeconfigFile(t, dir, "nocontext", "", "nocontext")
	sa := filepath.Join(dir, "serviceaccount")
	if err := os.MkdirAll(sa, 0o700); err != nil {
		t.Fatal(err)
	}
	for f, v := range map[string]string{"token": "pod-token\n", "namespace": "team-pod\n", "ca.crt": "unused"} {
		if err := os.WriteFile(filepath.Join(sa, f), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	missing := filepath.Join(dir, "absent")
	env := func(kv ...string) envconfig.KubeAccess {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		a := envconfig.LoadKubeAccess(func(k string) string { return m[k] })
		a.ServiceAccountDir = sa
		return a
	}
	inPod := []string{envconfig.EnvKubernetesServiceHost, "198.18.0.1", envconfig.EnvKubernetesServicePort, "443"}
	list := func(p ...string) string { return strings.Join(p, string(filepath.ListSeparator)) }
	cases := []struct {
		name             string
		explicit, ctx    string
		access           envconfig.KubeAccess
		host, ns, source string // want; source: a part of it
		err              string // want an error containing it
	}{
		{name: "flag before $KUBECONFIG, home and pod", explicit: flagFile,
			access: env(append([]string{envconfig.EnvKubeconfig, first, envconfig.EnvHome, home}, inPod...)...),
			host:   "https://flag.test", ns: "ns-flag", source: "--kubeconfig"},
		{name: "flag file missing: an error, no fallback", explicit: missing,
			access: env(append([]string{envconfig.EnvKubeconfig, first, envconfig.EnvHome, home}, inPod...)...), err: "absent"},
		{name: "$KUBECONFIG before home", access: env(envconfig.EnvKubeconfig, first, envconfig.EnvHome, home),
			host: "https://alpha.test", ns: "ns-alpha", source: "$KUBECONFIG"},
		{name: "$KUBECONFIG merged: first file's current context wins", access: env(envconfig.EnvKubeconfig, list(first, second)),
			host: "https://alpha.test", ns: "ns-alpha"},
		{name: "$KUBECONFIG merged: the second file's context", ctx: "beta", access: env(envconfig.EnvKubeconfig, list(first, second)),
			host: "https://beta.test", ns: "ns-beta"},
		{name: "$KUBECONFIG merged: order decides", access: env(envconfig.EnvKubeconfig, list(second, first)),
			host: "https://beta.test", ns: "ns-beta"},
		{name: "$KUBECONFIG: missing files skipped", access: env(envconfig.EnvKubeconfig, list(missing, second)),
			host: "https://beta.test", ns: "ns-beta"},
		{name: "$KUBECONFIG set, none exists: home not read, pod used",
			access: env(append([]string{envconfig.EnvKubeconfig, missing, envconfig.EnvHome, home}, inPod...)...),
			host:   "https://198.18.0.1:443", ns: "team-pod", source: "service account"},
		{name: "$KUBECONFIG set, none exists, not in a pod", access: env(envconfig.EnvKubeconfig, missing, envconfig.EnvHome, home),
			err: "no Kubernetes cluster configured"},
		{name: "home", access: env(envconfig.EnvHome, home), host: "https://home.test", ns: "ns-home", source: ".kube/config"},
		{name: "home before pod", access: env(append([]string{envconfig.EnvHome, home}, inPod...)...), host: "https://home.test"},
		{name: "pod", access: env(inPod...), host: "https://198.18.0.1:443", ns: "team-pod"},
		{name: "nothing", access: env(), err: "no Kubernetes cluster configured"},
		{name: "unknown context", ctx: "gamma", access: env(envconfig.EnvKubeconfig, first), err: "gamma"},
		{name: "no current context", access: env(envconfig.EnvKubeconfig, noContext), err: "nocontext"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := resolveKube(c.explicit, c.ctx, c.access)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("got %v (host %v), want an error containing %q", err, r.config, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.config.Host != c.host || (c.ns != "" && r.namespace != c.ns) || !strings.Contains(r.source, c.source) {
				t.Fatalf("got host %s namespace %s source %q, want %s %s %q", r.config.Host, r.namespace, r.source, c.host, c.ns, c.source)
			}
			if strings.HasPrefix(c.host, "https://10.96") && (r.config.BearerToken != "pod-token" || r.config.BearerTokenFile != filepath.Join(sa, "token")) {
				t.Fatalf("in-cluster credentials: %+v", r.config)
			}
		})
	}
}

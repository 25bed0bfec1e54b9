package envconfig

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

func TestRoundTrip(t *testing.T) {
	w := Worker{JobID: "j", Rank: 2, Size: 3, Secret: bytes.Repeat([]byte{7}, 32), Rendezvous: "127.0.0.1:9", ListenAddr: "127.0.0.1:0",
		Security: transport.SecurityEncrypted, TCPLanes: 4}
	env := map[string]string{}
	for _, kv := range w.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	got, err := Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if got.JobID != w.JobID || got.Rank != 2 || got.Size != 3 || !bytes.Equal(got.Secret, w.Secret) || got.Rendezvous != w.Rendezvous ||
		got.Security != transport.SecurityEncrypted || got.TCPLanes != 4 {
		t.Fatalf("got %+v", got)
	}
}

func TestBadEnvironment(t *testing.T) {
	good := map[string]string{EnvJobID: "j", EnvRank: "0", EnvSize: "2", EnvSecret: strings.Repeat("ab", 16), EnvRendezvous: "x:1"}
	cases := map[string]map[string]string{
		"missing":        {EnvRank: ""},
		"rank not int":   {EnvRank: "x"},
		"rank too big":   {EnvRank: "2"},
		"size zero":      {EnvSize: "0"},
		"secret hex":     {EnvSecret: "zz"},
		"secret short":   {EnvSecret: "abcd"},
		"security":       {EnvDataSecurity: "tls"},
		"lanes not int":  {EnvTCPLanes: "many"},
		"lanes negative": {EnvTCPLanes: "-1"},
		"lanes too many": {EnvTCPLanes: "17"},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range good {
				env[k] = v
			}
			for k, v := range change {
				env[k] = v
			}
			if _, err := Load(func(k string) string { return env[k] }); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestElasticRoundTrip(t *testing.T) {
	w := ElasticWorker{JobID: "j", Secret: bytes.Repeat([]byte{9}, 32), Seeds: []string{"127.0.0.1:7946", "127.0.0.1:7947"}, ListenAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1",
		ElasticTimeout: 90 * time.Second, Security: transport.SecurityPlain, TCPLanes: 2, MinWorkers: 3, FirstWorld: 5,
		ProbeTimeout: 2500 * time.Millisecond}
	env := map[string]string{}
	for _, kv := range w.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	got, err := LoadElastic(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if got.JobID != "j" || !bytes.Equal(got.Secret, w.Secret) || strings.Join(got.Seeds, ",") != strings.Join(w.Seeds, ",") ||
		got.ElasticTimeout != 90*time.Second || got.Security != transport.SecurityPlain || got.TCPLanes != 2 || got.MinWorkers != 3 || got.FirstWorld != 5 ||
		got.ProbeTimeout != 2500*time.Millisecond {
		t.Fatalf("got %+v", got)
	}
	env[EnvTCPLanes] = "0x2"
	if _, err := LoadElastic(func(k string) string { return env[k] }); err == nil {
		t.Fatalf("%s=0x2 accepted", EnvTCPLanes)
	}
	delete(env, EnvTCPLanes)
	for _, bad := range []string{"10", "-1s", "soon"} {
		env[EnvElasticTimeout] = bad
		if _, err := LoadElastic(func(k string) string { return env[k] }); err == nil {
			t.Fatalf("%s=%q accepted", EnvElasticTimeout, bad)
		}
	}
	delete(env, EnvElasticTimeout)
	for _, bad := range []string{"2", "0s", "-1s", "soon"} {
		env[EnvProbeTimeout] = bad
		if _, err := LoadElastic(func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), EnvProbeTimeout) {
			t.Fatalf("%s=%q: %v, want an error naming it", EnvProbeTimeout, bad, err)
		}
	}
	delete(env, EnvProbeTimeout)
	if got, err := LoadElastic(func(k string) string { return env[k] }); err != nil || got.ProbeTimeout != 0 {
		t.Fatalf("%s unset: %v, %v; want 0 (the proposer's default)", EnvProbeTimeout, got.ProbeTimeout, err)
	}
	delete(env, EnvSeeds)
	if _, err := LoadElastic(func(k string) string { return env[k] }); err == nil {
		t.Fatal("missing seeds accepted")
	}
	env[EnvSeeds] = " , "
	if _, err := LoadElastic(func(k string) string { return env[k] }); err == nil {
		t.Fatal("empty seed list accepted")
	}
}

// TestElasticMinWorkers: the job's minimum and its first workers a launcher
// hands its workers (EnvMinWorkers, EnvFirstWorld); unset is 0 (the worker's
// own default; not known), anything but a positive integer is refused with
// an error naming the variable.
func TestElasticMinWorkers(t *testing.T) {
	for _, v := range []struct {
		name string
		get  func(ElasticWorker) int
	}{
		{EnvMinWorkers, func(w ElasticWorker) int { return w.MinWorkers }},
		{EnvFirstWorld, func(w ElasticWorker) int { return w.FirstWorld }},
	} {
		for _, tc := range []struct {
			val     string
			want    int
			wantErr bool
		}{
			{val: "", want: 0},
			{val: "1", want: 1},
			{val: "3", want: 3},
			{val: "64", want: 64},
			{val: "0", wantErr: true},
			{val: "-2", wantErr: true},
			{val: "three", wantErr: true},
			{val: "2.5", wantErr: true},
			{val: " 3", wantErr: true},
		} {
			t.Run(v.name+"="+tc.val, func(t *testing.T) {
				env := map[string]string{EnvJobID: "j", EnvSecret: strings.Repeat("ab", 16), EnvSeeds: "127.0.0.1:7946", v.name: tc.val}
				w, err := LoadElastic(func(k string) string { return env[k] })
				switch {
				case tc.wantErr && (err == nil || !strings.Contains(err.Error(), v.name)):
					t.Fatalf("got %+v, %v; want an error naming %s", w, err, v.name)
				case !tc.wantErr && (err != nil || v.get(w) != tc.want):
					t.Fatalf("got %d, %v; want %d", v.get(w), err, tc.want)
				}
			})
		}
	}
}

func TestVisibleDevices(t *testing.T) {
	cases := []struct {
		val  string
		set  bool
		want string
	}{
		{"", false, ""}, {"", true, ""}, {"0", true, "0"}, {"GPU-a, GPU-b,", true, "GPU-a|GPU-b"},
	}
	for _, c := range cases {
		got, set := VisibleDevices(func(string) (string, bool) { return c.val, c.set })
		if set != c.set || strings.Join(got, "|") != c.want {
			t.Errorf("%q/%v: got %v %v", c.val, c.set, got, set)
		}
	}
}

func TestAssignGPUs(t *testing.T) {
	cases := []struct {
		val     string
		want    bool
		wantErr bool
	}{
		{val: "", want: false}, {val: "1", want: true}, {val: "true", want: true},
		{val: "0", want: false}, {val: "false", want: false}, {val: "yes", wantErr: true}, {val: "2", wantErr: true},
	}
	for _, c := range cases {
		got, err := AssignGPUs(func(name string) string {
			if name == EnvAssignGPUs {
				return c.val
			}
			return ""
		})
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("%s=%q: got %v, %v", EnvAssignGPUs, c.val, got, err)
		}
		if err != nil && !strings.Contains(err.Error(), EnvAssignGPUs) {
			t.Errorf("%s=%q: the error %q does not name the variable", EnvAssignGPUs, c.val, err)
		}
	}
}

func TestAddressDefaults(t *testing.T) {
	base := map[string]string{EnvJobID: "j", EnvSecret: strings.Repeat("ab", 16), EnvSeeds: "127.0.0.1:7946"}
	load := func(change map[string]string) (ElasticWorker, error) {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		for k, v := range change {
			env[k] = v
		}
		return LoadElastic(func(k string) string { return env[k] })
	}
	w, err := load(nil)
	if err != nil || w.ListenAddr != "127.0.0.1:0" || w.GossipAddr != "127.0.0.1" {
		t.Errorf("a local driver: %+v, %v", w, err)
	}
	w, err = load(map[string]string{EnvNetworkInterface: "nosuch0,lo", EnvAdvertiseAddr: "198.18.0.7"})
	if err != nil || w.ListenAddr != "127.0.0.1:0" || w.GossipAddr != "127.0.0.1" || w.AdvertiseAddr != "198.18.0.7" {
		t.Errorf("interface lo: %+v, %v", w, err)
	}
	w, err = load(map[string]string{EnvListenAddr: "127.0.0.2:5000", EnvGossipAddr: "127.0.0.3", EnvNetworkInterface: "nosuch0"})
	if err != nil || w.ListenAddr != "127.0.0.2:5000" || w.GossipAddr != "127.0.0.3" {
		t.Errorf("explicit addresses win over the interface: %+v, %v", w, err)
	}
	if _, err := load(map[string]string{EnvNetworkInterface: "nosuch0"}); err == nil || !strings.Contains(err.Error(), EnvNetworkInterface) {
		t.Errorf("a missing interface: %v", err)
	}
	// The new fields survive Environ.
	w = ElasticWorker{JobID: "j", Secret: bytes.Repeat([]byte{1}, 16), Seeds: []string{"127.0.0.1:1"}, NetworkInterface: "lo", AdvertiseAddr: "198.18.0.9"}
	env := map[string]string{}
	for _, kv := range w.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	if env[EnvNetworkInterface] != "lo" || env[EnvAdvertiseAddr] != "198.18.0.9" {
		t.Errorf("Environ: %v", env)
	}
	fixed := Worker{JobID: "j", Size: 1, Secret: bytes.Repeat([]byte{1}, 16), Rendezvous: "127.0.0.1:1", NetworkInterface: "lo"}
	env = map[string]string{}
	for _, kv := range fixed.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	got, err := Load(func(k string) string { return env[k] })
	if err != nil || got.ListenAddr != "127.0.0.1:0" || got.NetworkInterface != "lo" {
		t.Errorf("fixed world: %+v, %v", got, err)
	}
}

func TestLoadKubernetesPod(t *testing.T) {
	full := map[string]string{EnvPodName: "job-driver", EnvPodNamespace: "ml", EnvPodUID: "8d1c", EnvPodIP: "198.18.0.7"}
	cases := []struct {
		name   string
		change map[string]string
		ok     bool
		err    bool
	}{
		{"full", nil, true, false},
		{"no IP yet", map[string]string{EnvPodIP: ""}, true, false},
		{"outside a pod", map[string]string{EnvPodName: ""}, false, false},
		{"no UID", map[string]string{EnvPodUID: ""}, true, true},
		{"no namespace", map[string]string{EnvPodNamespace: ""}, true, true},
	}
	for _, c := range cases {
		env := map[string]string{}
		for k, v := range full {
			env[k] = v
		}
		for k, v := range c.change {
			env[k] = v
		}
		p, ok, err := LoadKubernetesPod(func(k string) string { return env[k] })
		if ok != c.ok || (err != nil) != c.err {
			t.Errorf("%s: ok %v err %v", c.name, ok, err)
		}
		if c.name == "full" && p != (KubernetesPod{"job-driver", "ml", "8d1c", "198.18.0.7"}) {
			t.Errorf("full: %+v", p)
		}
	}
}

func TestWithoutSecrets(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{nil, []string{}},
		{[]string{"A=1", EnvSecret + "=ab", "B=2"}, []string{"A=1", "B=2"}},
		{[]string{EnvSecret + "=", EnvSecret + "=x", EnvSecret}, []string{}},
		{[]string{EnvSecret + "X=1", "X" + EnvSecret + "=2"}, []string{EnvSecret + "X=1", "X" + EnvSecret + "=2"}},
	} {
		if got := WithoutSecrets(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("WithoutSecrets(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestLoadKubeAccess(t *testing.T) {
	cases := []struct {
		name      string
		env       map[string]string
		want      []string
		home      string
		inCluster bool
	}{
		{"nothing", nil, nil, "", false},
		{"home only", map[string]string{EnvHome: "/home/u"}, nil, "/home/u/.kube/config", false},
		{"list merged in order", map[string]string{EnvKubeconfig: "/a:/b", EnvHome: "/h"}, []string{"/a", "/b"}, "/h/.kube/config", false},
		{"empty and repeated entries dropped", map[string]string{EnvKubeconfig: ":/a::/b:/a:"}, []string{"/a", "/b"}, "", false},
		{"only separators", map[string]string{EnvKubeconfig: "::"}, nil, "", false},
		{"in cluster", map[string]string{EnvKubernetesServiceHost: "198.18.0.1", EnvKubernetesServicePort: "443"}, nil, "", true},
		{"host without port", map[string]string{EnvKubernetesServiceHost: "198.18.0.1"}, nil, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := LoadKubeAccess(func(v string) string { return c.env[v] })
			if !slices.Equal(k.Kubeconfigs, c.want) || k.HomeKubeconfig != c.home || k.InCluster() != c.inCluster || k.ServiceAccountDir != ServiceAccountDir {
				t.Fatalf("got %+v (in cluster %v), want files %q home %q in cluster %v", k, k.InCluster(), c.want, c.home, c.inCluster)
			}
		})
	}
}

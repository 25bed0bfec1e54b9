package simulator

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadModels(t *testing.T) {
	builtin := map[string]ModelConfig{"cifar10": {MaxEpochs: 100}, "ncf": {MaxEpochs: 10, MaxReplicas: 1}}
	for _, tc := range []struct {
		name  string
		files map[string]string // path under the traces directory → contents
		apps  []string
		want  map[string]ModelConfig
		// wantErr, when set, must appear in the error, and so must the
		// file named by wantFile.
		wantErr, wantFile string
	}{
		{name: "built-in", apps: []string{"cifar10", "ncf"}, want: builtin},
		{name: "none named", want: map[string]ModelConfig{}},
		{
			name:  "own model",
			files: map[string]string{"synthetic/model.json": `{"max_epochs": 50, "max_local_bsz": 32, "fixed_batch": 24, "max_replicas": 4}`},
			apps:  []string{"synthetic", "cifar10", "synthetic"},
			want:  map[string]ModelConfig{"synthetic": {MaxEpochs: 50, MaxLocalBatch: 32, FixedBatch: 24, MaxReplicas: 4}, "cifar10": {MaxEpochs: 100}},
		},
		{
			name:  "model.json wins over a built-in model",
			files: map[string]string{"cifar10/model.json": `{"max_epochs": 5}`},
			apps:  []string{"cifar10"},
			want:  map[string]ModelConfig{"cifar10": {MaxEpochs: 5}},
		},
		{
			name:    "neither",
			files:   map[string]string{"mnist/placements.csv": "placement,local_bsz,step_time,sync_time\n"},
			apps:    []string{"mnist"},
			wantErr: `application "mnist": no model.json in `, wantFile: "mnist",
		},
		{name: "lists the built-in models", apps: []string{"gpt"}, wantErr: "not one of the built-in models (cifar10, ncf)"},
		{name: "bad JSON", files: map[string]string{"m/model.json": `{"max_epochs": 5`}, apps: []string{"m"}, wantErr: "not a model configuration", wantFile: "m/model.json"},
		{name: "not an object", files: map[string]string{"m/model.json": `[50]`}, apps: []string{"m"}, wantErr: "cannot unmarshal", wantFile: "m/model.json"},
		{name: "unknown field", files: map[string]string{"m/model.json": `{"max_epochs": 5, "epochs": 3}`}, apps: []string{"m"}, wantErr: `unknown field "epochs"`, wantFile: "m/model.json"},
		{name: "fractional", files: map[string]string{"m/model.json": `{"max_epochs": 2.5}`}, apps: []string{"m"}, wantErr: "max_epochs", wantFile: "m/model.json"},
		{name: "two objects", files: map[string]string{"m/model.json": `{"max_epochs": 5} {}`}, apps: []string{"m"}, wantErr: "data after the JSON object", wantFile: "m/model.json"},
		{name: "no max_epochs", files: map[string]string{"m/model.json": `{"fixed_batch": 24}`}, apps: []string{"m"}, wantErr: "max_epochs 0 must be ≥ 1", wantFile: "m/model.json"},
		{name: "null", files: map[string]string{"m/model.json": `null`}, apps: []string{"m"}, wantErr: "max_epochs 0 must be ≥ 1", wantFile: "m/model.json"},
		{name: "negative", files: map[string]string{"m/model.json": `{"max_epochs": 5, "max_replicas": -1}`}, apps: []string{"m"}, wantErr: "must be ≥ 0", wantFile: "m/model.json"},
		{name: "too large", files: map[string]string{"m/model.json": `{"max_epochs": 5}` + strings.Repeat(" ", 64<<10)}, apps: []string{"m"}, wantErr: "larger than 64 KiB", wantFile: "m/model.json"},
		{name: "a directory", files: map[string]string{"m/model.json/x": ""}, apps: []string{"m"}, wantErr: `application "m"`, wantFile: "m/model.json"},
		{name: "outside the directory", apps: []string{"../cifar10"}, wantErr: "not a directory name"},
		{name: "a path", apps: []string{"a/b"}, wantErr: "not a directory name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, contents := range tc.files {
				path := filepath.Join(dir, filepath.FromSlash(name))
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(contents), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := LoadModels(dir, tc.apps, builtin)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				if file := filepath.Join(dir, filepath.FromSlash(tc.wantFile)); tc.wantFile != "" && !strings.Contains(err.Error(), file) {
					t.Fatalf("error %q does not name %s", err, file)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for name, w := range tc.want {
				if g, ok := got[name]; !ok || g != w {
					t.Errorf("%s: %+v, want %+v", name, g, w)
				}
			}
		})
	}
}

func FuzzParseModelConfig(f *testing.F) {
	f.Add(`{"max_epochs": 50, "max_local_bsz": 0, "fixed_batch": 24, "max_replicas": 0}`)
	f.Add(`{"max_epochs": 1e3}`)
	f.Fuzz(func(t *testing.T, in string) {
		cfg, err := ParseModelConfig(strings.NewReader(in))
		if err != nil {
			return
		}
		if cfg.MaxEpochs < 1 || cfg.MaxLocalBatch < 0 || cfg.FixedBatch < 0 || cfg.MaxReplicas < 0 {
			t.Fatalf("accepted an invalid configuration %+v", cfg)
		}
	})
}

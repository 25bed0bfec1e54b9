package simulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ModelFile is the file in an application's trace directory that holds its
// ModelConfig as JSON.
const ModelFile = "model.json"

// maxModelFileBytes bounds what is read of a model file: a handful of
// numbers, so anything larger is not one.
const maxModelFileBytes = 64 << 10

// LoadModels returns the configuration of each application in apps: the
// ModelConfig in dir/<application>/model.json when there is one (it wins
// over a built-in model of the same name), else builtin's entry (usually
// DefaultModels), else an error.
func LoadModels(dir string, apps []string, builtin map[string]ModelConfig) (map[string]ModelConfig, error) {
	out := make(map[string]ModelConfig, len(apps))
	for _, app := range apps {
		if _, done := out[app]; done {
			continue
		}
		// The name comes from a workload and becomes a path: it must name
		// a directory inside dir.
		if !filepath.IsLocal(app) || strings.ContainsAny(app, `/\`) {
			return nil, fmt.Errorf("application %q: not a directory name", app)
		}
		appDir := filepath.Join(dir, app)
		cfg, err := ReadModelFile(filepath.Join(appDir, ModelFile))
		switch {
		case err == nil:
			out[app] = cfg
		case errors.Is(err, fs.ErrNotExist):
			cfg, ok := builtin[app]
			if !ok {
				return nil, fmt.Errorf("application %q: no %s in %s, and not one of the built-in models (%s)",
					app, ModelFile, appDir, strings.Join(sortedNames(builtin), ", "))
			}
			out[app] = cfg
		default:
			return nil, fmt.Errorf("application %q: %w", app, err)
		}
	}
	return out, nil
}

func sortedNames(models map[string]ModelConfig) []string {
	names := make([]string, 0, len(models))
	for name := range models {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// ReadModelFile reads one application's model file (see ParseModelConfig).
// A missing file's error wraps fs.ErrNotExist.
func ReadModelFile(path string) (ModelConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return ModelConfig{}, err
	}
	defer f.Close()
	cfg, err := ParseModelConfig(f)
	if err != nil {
		return ModelConfig{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// ParseModelConfig parses a ModelConfig from JSON: one object with the
// fields max_epochs (≥ 1), max_local_bsz, fixed_batch and max_replicas (each
// ≥ 0, 0 meaning unset), and nothing else.
func ParseModelConfig(r io.Reader) (ModelConfig, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxModelFileBytes+1))
	if err != nil {
		return ModelConfig{}, err
	}
	if len(data) > maxModelFileBytes {
		return ModelConfig{}, fmt.Errorf("larger than %d KiB", maxModelFileBytes>>10)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var cfg ModelConfig
	if err := dec.Decode(&cfg); err != nil {
		return ModelConfig{}, fmt.Errorf("not a model configuration: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return ModelConfig{}, errors.New("not a model configuration: data after the JSON object")
	}
	switch {
	case cfg.MaxEpochs < 1:
		return ModelConfig{}, fmt.Errorf("max_epochs %d must be ≥ 1", cfg.MaxEpochs)
	case cfg.MaxLocalBatch < 0, cfg.FixedBatch < 0, cfg.MaxReplicas < 0:
		return ModelConfig{}, fmt.Errorf("max_local_bsz %d, fixed_batch %d and max_replicas %d must be ≥ 0",
			cfg.MaxLocalBatch, cfg.FixedBatch, cfg.MaxReplicas)
	}
	return cfg, nil
}

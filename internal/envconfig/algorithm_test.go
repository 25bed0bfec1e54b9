package envconfig

import "testing"

func TestLoadAlgorithms(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		want    Algorithms
		wantErr bool
	}{
		{env: nil, want: Algorithms{}},
		{env: map[string]string{EnvAllreduceAlgorithm: "rd"}, want: Algorithms{Allreduce: "rd"}},
		{env: map[string]string{EnvHorovodHierarchicalAllreduce: "1"}, want: Algorithms{Allreduce: "hierarchical"}},
		{env: map[string]string{EnvHorovodHierarchicalAllreduce: "0", EnvHorovodHierarchicalAllgather: "1"}, want: Algorithms{Allreduce: "ring", Allgather: "hierarchical"}},
		{env: map[string]string{EnvHorovodHierarchicalAllreduce: "1", EnvAllreduceAlgorithm: "ring"}, want: Algorithms{Allreduce: "ring"}},
		{env: map[string]string{EnvAllgatherAlgorithm: "hierarchical"}, want: Algorithms{Allgather: "hierarchical"}},
		{env: map[string]string{EnvHorovodHierarchicalAllgather: "maybe"}, wantErr: true},
	} {
		got, err := LoadAlgorithms(func(k string) string { return tc.env[k] })
		if (err != nil) != tc.wantErr || (err == nil && got != tc.want) {
			t.Errorf("%v: got %+v, %v; want %+v (error %v)", tc.env, got, err, tc.want, tc.wantErr)
		}
	}
}

package simulator

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseWorkload(t *testing.T) {
	jobs, err := ParseWorkload(strings.NewReader("name,time,application,num_replicas,batch_size\n" +
		"cifar10-0,107,cifar10,6,2048\nncf-1,135.5,ncf,1,32768\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []WorkloadJob{
		{Name: "cifar10-0", Submitted: 107 * time.Second, Model: "cifar10", Replicas: 6, BatchSize: 2048},
		{Name: "ncf-1", Submitted: 135500 * time.Millisecond, Model: "ncf", Replicas: 1, BatchSize: 32768},
	}
	if len(jobs) != len(want) {
		t.Fatalf("got %d jobs", len(jobs))
	}
	for i := range want {
		if jobs[i] != want[i] {
			t.Errorf("job %d: %+v, want %+v", i, jobs[i], want[i])
		}
	}
	const header = "name,time,application,num_replicas,batch_size\n"
	for _, tc := range []struct {
		name, in, want string
	}{
		{"no header", "", "header"},
		{"missing column", "name,time,application,num_replicas\na,1,ncf,1\n", `no column "batch_size"`},
		{"no jobs", header, "no jobs"},
		{"negative time", header + "a,-1,ncf,1,8\n", "time"},
		{"time not a number", header + "a,soon,ncf,1,8\n", "time"},
		{"zero replicas", header + "a,1,ncf,0,8\n", "num_replicas"},
		{"fractional batch", header + "a,1,ncf,1,8.5\n", "batch_size"},
		{"duplicate", header + "a,1,ncf,1,8\na,2,ncf,1,8\n", "twice"},
		{"empty name", header + ",1,ncf,1,8\n", "empty"},
		{"ragged", header + "a,1,ncf,1\n", "wrong number of fields"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseWorkload(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestParseWorkloadOptionalColumns(t *testing.T) {
	const header = "name,time,application,num_replicas,batch_size,epochs,max_replicas\n"
	for _, tc := range []struct {
		name, in string
		want     []WorkloadJob // when nil, an error containing wantErr
		wantErr  string
	}{
		{name: "both", in: header + "a,0,synthetic,2,64,3,4\n",
			want: []WorkloadJob{{Name: "a", Model: "synthetic", Replicas: 2, BatchSize: 64, Epochs: 3, MaxReplicas: 4}}},
		{name: "empty is the model's", in: header + "a,0,synthetic,2,64,,\nb,1,synthetic,1,64,5,\n",
			want: []WorkloadJob{{Name: "a", Model: "synthetic", Replicas: 2, BatchSize: 64},
				{Name: "b", Submitted: time.Second, Model: "synthetic", Replicas: 1, BatchSize: 64, Epochs: 5}}},
		{name: "one of them, any order", in: "max_replicas,name,time,application,num_replicas,batch_size\n1,a,0,ncf,1,8\n",
			want: []WorkloadJob{{Name: "a", Model: "ncf", Replicas: 1, BatchSize: 8, MaxReplicas: 1}}},
		{name: "zero epochs", in: header + "a,0,ncf,1,8,1,1\nb,0,ncf,1,8,0,1\n", wantErr: `line 3: epochs "0"`},
		{name: "fractional epochs", in: header + "a,0,ncf,1,8,2.5,1\n", wantErr: `line 2: epochs "2.5"`},
		{name: "negative max_replicas", in: header + "a,0,ncf,1,8,2,-1\n", wantErr: `line 2: max_replicas "-1"`},
		{name: "max_replicas not a number", in: header + "a,0,ncf,1,8,2,all\n", wantErr: `line 2: max_replicas "all"`},
		{name: "min_replicas", in: "name,time,application,num_replicas,batch_size,min_replicas,max_replicas\na,0,ncf,4,8,2,4\nb,0,ncf,4,8,,\n",
			want: []WorkloadJob{{Name: "a", Model: "ncf", Replicas: 4, BatchSize: 8, MinReplicas: 2, MaxReplicas: 4}, {Name: "b", Model: "ncf", Replicas: 4, BatchSize: 8}}},
		{name: "min_replicas above max_replicas", in: "name,time,application,num_replicas,batch_size,min_replicas,max_replicas\na,0,ncf,4,8,3,2\n", wantErr: "line 2: min_replicas 3 above max_replicas 2"},
		{name: "zero min_replicas", in: "name,time,application,num_replicas,batch_size,min_replicas\na,0,ncf,4,8,0\n", wantErr: `line 2: min_replicas "0"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			jobs, err := ParseWorkload(strings.NewReader(tc.in))
			if tc.want == nil {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(jobs, tc.want) {
				t.Fatalf("got %+v, want %+v", jobs, tc.want)
			}
		})
	}
}

func TestApplications(t *testing.T) {
	jobs := []WorkloadJob{{Model: "ncf"}, {Model: "cifar10"}, {Model: "ncf"}, {Model: "bert"}}
	if got, want := Applications(jobs), []string{"bert", "cifar10", "ncf"}; !slices.Equal(got, want) {
		t.Fatalf("Applications = %q, want %q", got, want)
	}
}

func FuzzParseWorkload(f *testing.F) {
	f.Add("name,time,application,num_replicas,batch_size\ncifar10-0,107,cifar10,6,2048\n")
	f.Add("batch_size,name,application,time,num_replicas\n8,a,ncf,1e3,1\n")
	f.Add("name,time,application,num_replicas,batch_size,epochs,max_replicas\na,0,ncf,1,8,,2\n")
	f.Fuzz(func(t *testing.T, in string) {
		jobs, err := ParseWorkload(strings.NewReader(in))
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, j := range jobs {
			if j.Name == "" || j.Model == "" || j.Submitted < 0 || j.Replicas < 1 || j.BatchSize < 1 ||
				j.Epochs < 0 || j.MaxReplicas < 0 || seen[j.Name] {
				t.Fatalf("accepted an invalid job %+v", j)
			}
			seen[j.Name] = true
		}
	})
}

func TestReadWorkloads(t *testing.T) {
	dir := polluxDir(t)
	// Relative load scales the number of jobs arriving in the same hours.
	for load, n := range map[string]int{"workloads": 160, "workloads-0.5": 80, "workloads-1.5": 240, "workloads-2.0": 320} {
		for _, w := range []string{"workload-1.csv", "workload-2.csv", "workload-3.csv", "workload-4.csv"} {
			jobs, err := ReadWorkloadFile(filepath.Join(dir, load, w))
			if err != nil {
				t.Fatal(err)
			}
			if len(jobs) != n {
				t.Errorf("%s/%s: %d jobs, want %d", load, w, len(jobs), n)
			}
		}
	}
}

package job_test

import (
	"context"
	"fmt"
	"os"

	"github.com/gorovod/gorovod/job"
)

// Run a job of two workers from Go: the runner starts the driver, launches
// the workers on this host and returns once they have all exited. A sink sees
// everything the job does as it happens.
func Example() {
	// The worker command: any trainer built on package sync. (Here it is
	// this test binary, which trains 20 steps when started as a worker.)
	trainer := []string{os.Args[0]}
	worlds := 0
	outcome, err := job.Run(context.Background(), job.Config{
		Argv:       trainer,
		Workers:    2,
		MinWorkers: 2, // the first world waits for both
		Sinks: []job.Sink{job.SinkFunc(func(e job.Event) {
			if _, ok := e.(job.WorldChanged); ok {
				worlds++
			}
		})},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("training finished:", outcome.TrainingFinished)
	fmt.Println("workers finished:", outcome.Count(job.Finished))
	fmt.Println("workers in the last world:", len(outcome.World.Members))
	fmt.Println("a world formed:", worlds > 0)
	// Output:
	// training finished: true
	// workers finished: 2
	// workers in the last world: 2
	// a world formed: true
}

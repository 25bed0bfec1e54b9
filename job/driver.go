package job

import (
	"context"

	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// Driver is what the runner needs of the job's driver, the proposer of its
// world epochs: *driver.Driver implements it (Config.StartDriver starts one).
type Driver interface {
	// GossipAddr is the address workers join the job through.
	GossipAddr() string
	// Current is the newest proposed world.
	Current() epoch.World
	// Finished is closed once a member of the current world reported that
	// training is over.
	Finished() <-chan struct{}
	// Unfinished lists the members of the current world that have not
	// reported the end of training.
	Unfinished() []string
	// Remove takes a worker out of the job for good.
	Remove(name string)
	// RemoveLost takes a worker out of the job for good because the job
	// lost it (the connection to its host broke): a failure of the
	// current world is explained by it (driver.Driver.RemoveLost).
	RemoveLost(name string)
	// Exited tells the driver that a worker's process ended (the launcher
	// saw it exit): its death is known, not suspected, and the survivors
	// form the next world without its vote (epoch.CheckQuorum).
	Exited(name string)
	// SetMinWorkers changes the fewest members a world may have from now
	// on (the driver starts with driver.Config.MinWorkers).
	SetMinWorkers(n int)
	// SetFirstWorld changes the voters of the job's first world (the
	// driver starts with driver.Config.FirstWorld): its first workers less
	// those that exited before any world formed.
	SetFirstWorld(n int)
	// Workers lists the workers alive in the driver's view.
	Workers() []driver.WorkerInfo
	Close() error
}

func startDriver(ctx context.Context, cfg driver.Config) (Driver, error) {
	d, err := driver.Start(ctx, cfg)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return d, nil
}

// Command podhelper is the program in the images of cluster/kube's kubelet
// test: "pause" is the pod sandbox (it waits for SIGTERM); "worker" stands in
// for a trainer: it prints what it learned from its environment and, on
// SIGTERM, leaves with exit code 143 as a trainer does when preempted —
// after PODHELPER_TERM_DELAY (a Go duration) when set, as a trainer that
// finishes its step first.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	if len(os.Args) > 1 && os.Args[1] == "pause" {
		<-term
		return
	}
	host, _ := os.Hostname()
	fmt.Printf("ready %s %d\n", host, os.Getpid())
	for _, v := range []string{"GOROVOD_POD_NAME", "GOROVOD_SECRET", "GOROVOD_SEEDS", "GOROVOD_LAUNCH_INDEX"} {
		fmt.Printf("env %s=%s\n", v, os.Getenv(v))
	}
	<-term
	fmt.Println("term")
	if d, err := time.ParseDuration(os.Getenv("PODHELPER_TERM_DELAY")); err == nil {
		time.Sleep(d) // the step it finishes before leaving
	}
	os.Exit(128 + int(syscall.SIGTERM))
}

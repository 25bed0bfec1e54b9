// Command fakedriver stands in for `gorovod run --gorovodjob=JOB` in the
// driver pods of cluster/kube/service's kubelet test: "pause" is the pod
// sandbox (it waits for SIGTERM); otherwise it prints its arguments and the
// downward API's variables and exits 0, or, for a job whose name starts with
// "fail", writes a reason to the termination log and exits 3.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "pause" {
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
		<-term
		return
	}
	fmt.Printf("args %s\n", strings.Join(os.Args[1:], " "))
	for _, v := range []string{"GOROVOD_POD_NAME", "GOROVOD_POD_NAMESPACE", "GOROVOD_POD_UID"} {
		fmt.Printf("env %s=%s\n", v, os.Getenv(v))
	}
	if len(os.Args) > 2 && strings.HasPrefix(os.Args[2], "--gorovodjob=fail") {
		_ = os.WriteFile("/dev/termination-log", []byte("loss is NaN"), 0o644)
		os.Exit(3)
	}
}

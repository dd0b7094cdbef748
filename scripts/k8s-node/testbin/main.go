// Command testbin is the one static program in the k8s-node test images (images.sh):
//
//	testbin pause                 the pod sandbox's pause process: waits for SIGTERM/SIGINT, exits 0
//	testbin job DIR SLEEP_MS      a Job's workload: writes DIR/job-$HOSTNAME.start (UNIX ns), sleeps
//	                              SLEEP_MS, writes DIR/job-$HOSTNAME.exit (UNIX ns), exits 0
//	testbin sidecar DIR           a native sidecar: writes DIR/sidecar-$HOSTNAME.start, then on
//	                              SIGTERM writes DIR/sidecar-$HOSTNAME.term (UNIX ns) and exits 0
//
// Each line it prints goes to the container's log with the same timestamps.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

func stamp(dir, name string) {
	host, _ := os.Hostname()
	now := time.Now().UnixNano()
	p := filepath.Join(dir, fmt.Sprintf("%s-%s", host, name))
	if err := os.WriteFile(p, []byte(strconv.FormatInt(now, 10)+"\n"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "testbin:", err)
		os.Exit(2)
	}
	fmt.Printf("%s %d\n", p, now)
}

func waitSignal() os.Signal {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	return <-ch
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testbin pause | job DIR SLEEP_MS | sidecar DIR")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "pause":
		waitSignal()
	case "job":
		if len(os.Args) != 4 {
			os.Exit(2)
		}
		ms, err := strconv.Atoi(os.Args[3])
		if err != nil {
			os.Exit(2)
		}
		stamp(os.Args[2], "job.start")
		time.Sleep(time.Duration(ms) * time.Millisecond)
		stamp(os.Args[2], "job.exit")
	case "sidecar":
		if len(os.Args) != 3 {
			os.Exit(2)
		}
		stamp(os.Args[2], "sidecar.start")
		s := waitSignal()
		stamp(os.Args[2], "sidecar.term")
		fmt.Println("sidecar: got", s)
	default:
		os.Exit(2)
	}
}

// Command testbin is the one static program in the k8s-node test images (images.sh):
//
//	testbin pause                 the pod sandbox's pause process: waits for SIGTERM/SIGINT, exits 0
//	testbin job DIR SLEEP_MS      a Job's workload: writes DIR/job-$HOSTNAME.start (UNIX ns), sleeps
//	                              SLEEP_MS, writes DIR/job-$HOSTNAME.exit (UNIX ns), exits 0
//	testbin sidecar DIR           a native sidecar: writes DIR/sidecar-$HOSTNAME.start, then on
//	                              SIGTERM writes DIR/sidecar-$HOSTNAME.term (UNIX ns) and exits 0
//	testbin write DIR DATA N KIB  a Job's workload on a bucket volume: writes DIR/job-$HOSTNAME.start,
//	                              then N files DATA/part-I.bin of KIB KiB each (DATA made if
//	                              missing; the content is Content(I, KIB), so whoever reads the
//	                              bucket back can check it), each closed before the next, then
//	                              DIR/job-$HOSTNAME.exit, and exits 0; a failed write or close
//	                              exits 1
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

// Content is file I's bytes: the line "part-I offset-O\n" for every 64-byte record O,
// padded with '.' to 64 bytes, KIB KiB in all.
func Content(i, kib int) []byte {
	b := make([]byte, 0, kib*1024)
	for off := 0; off < kib*1024; off += 64 {
		rec := fmt.Sprintf("part-%d offset-%d", i, off)
		for len(rec) < 63 {
			rec += "."
		}
		b = append(b, rec+"\n"...)
	}
	return b
}

func writeFiles(data string, n, kib int) error {
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		f, err := os.Create(filepath.Join(data, fmt.Sprintf("part-%d.bin", i)))
		if err != nil {
			return err
		}
		if _, err := f.Write(Content(i, kib)); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}

func waitSignal() os.Signal {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	return <-ch
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testbin pause | job DIR SLEEP_MS | sidecar DIR | write DIR DATA N KIB")
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
	case "write":
		if len(os.Args) != 6 {
			os.Exit(2)
		}
		n, err1 := strconv.Atoi(os.Args[4])
		kib, err2 := strconv.Atoi(os.Args[5])
		if err1 != nil || err2 != nil {
			os.Exit(2)
		}
		stamp(os.Args[2], "job.start")
		if err := writeFiles(os.Args[3], n, kib); err != nil {
			fmt.Fprintln(os.Stderr, "testbin write:", err)
			os.Exit(1)
		}
		stamp(os.Args[2], "job.exit")
	default:
		os.Exit(2)
	}
}

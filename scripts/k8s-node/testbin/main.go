// Command testbin is the one static program in the k8s-node test images (images.sh):
//
//	testbin pause                 the pod sandbox's pause process: waits for SIGTERM/SIGINT, exits 0
//	testbin job DIR SLEEP_MS      a Job's workload: writes DIR/job-$HOSTNAME.start (UNIX ns), sleeps
//	                              SLEEP_MS, writes DIR/job-$HOSTNAME.exit (UNIX ns), exits 0
//	testbin sidecar DIR           a native sidecar: writes DIR/sidecar-$HOSTNAME.start, then on
//	                              SIGTERM writes DIR/sidecar-$HOSTNAME.term (UNIX ns) and exits 0
//	testbin write [-pace-ms MS] [-linger-ms MS] DIR DATA N KIB
//	                              a Job's workload on a bucket volume: writes
//	                              DIR/job-$HOSTNAME.start, then N files DATA/part-I.bin of KIB
//	                              KiB each (DATA made if missing; the content is Content(I,
//	                              KIB), so whoever reads the bucket back can check it), each
//	                              closed before the next and written in 16 pieces MS/16 ms
//	                              apart (-pace-ms, default 0: the file is open that long), then
//	                              sleeps -linger-ms (default 0: work that does no I/O), writes
//	                              DIR/job-$HOSTNAME.exit, and exits 0. On SIGTERM or SIGINT it
//	                              writes DIR/job-$HOSTNAME.term, finishes the file it is writing
//	                              (a final checkpoint) and stops there.
//	                              DIR/job-$HOSTNAME.closed holds the number of files closed
//	                              (written at the end), DIR/job-$HOSTNAME.opening the number of
//	                              the file it is about to create (written before each),
//	                              DIR/job-$HOSTNAME.closing the time (UNIX ns) it last began a
//	                              close(). A failed write or close exits 1.
//
// Each line it prints goes to the container's log with the same timestamps.
package main

import (
	"flag"
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
	if err := writeAtomic(p, strconv.FormatInt(now, 10)+"\n"); err != nil {
		fmt.Fprintln(os.Stderr, "testbin:", err)
		os.Exit(2)
	}
	fmt.Printf("%s %d\n", p, now)
}

// writeAtomic writes path by rename, so that a reader polling for it never sees it empty.
func writeAtomic(path, data string) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
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

// writeFiles writes files 0..n-1 (see the usage above) until n or a signal on stop; it
// returns how many it closed.
func writeFiles(dir, data string, n, kib int, pace time.Duration, stop <-chan os.Signal) (int, error) {
	if err := os.MkdirAll(data, 0o755); err != nil {
		return 0, err
	}
	host, _ := os.Hostname()
	for i := 0; i < n; i++ {
		select {
		case <-stop:
			return i, nil
		default:
		}
		if err := writeAtomic(filepath.Join(dir, host+"-job.opening"), strconv.Itoa(i)+"\n"); err != nil {
			return i, err
		}
		f, err := os.Create(filepath.Join(data, fmt.Sprintf("part-%d.bin", i)))
		if err != nil {
			return i, err
		}
		b := Content(i, kib)
		piece := (len(b) + 15) / 16
		for off := 0; off < len(b); off += piece {
			if off > 0 {
				time.Sleep(pace / 16)
			}
			if _, err := f.Write(b[off:min(off+piece, len(b))]); err != nil {
				f.Close()
				return i, err
			}
		}
		stamp(dir, "job.closing")
		if err := f.Close(); err != nil {
			return i, err
		}
	}
	return n, nil
}

// writeMode is `testbin write`; it returns the process's exit code.
func writeMode(args []string) int {
	fs := flag.NewFlagSet("write", flag.ContinueOnError)
	paceMs := fs.Int("pace-ms", 0, "ms each file is open for")
	lingerMs := fs.Int("linger-ms", 0, "ms between the last close and the exit")
	if fs.Parse(args) != nil || fs.NArg() != 4 {
		return 2
	}
	dir, data := fs.Arg(0), fs.Arg(1)
	n, err1 := strconv.Atoi(fs.Arg(2))
	kib, err2 := strconv.Atoi(fs.Arg(3))
	if err1 != nil || err2 != nil {
		return 2
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	stop := make(chan os.Signal, 1)
	go func() {
		s := <-sigs
		stamp(dir, "job.term")
		stop <- s
	}()
	stamp(dir, "job.start")
	closed, err := writeFiles(dir, data, n, kib, time.Duration(*paceMs)*time.Millisecond, stop)
	host, _ := os.Hostname()
	_ = writeAtomic(filepath.Join(dir, host+"-job.closed"), strconv.Itoa(closed)+"\n")
	rc := 0
	if err != nil {
		fmt.Fprintln(os.Stderr, "testbin write:", err)
		rc = 1
	} else {
		select {
		case <-stop:
		case <-time.After(time.Duration(*lingerMs) * time.Millisecond):
		}
		stamp(dir, "job.exit")
	}
	fmt.Printf("closed %d of %d files\n", closed, n)
	return rc
}

func waitSignal() os.Signal {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	return <-ch
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testbin pause | job DIR SLEEP_MS | sidecar DIR | write [-pace-ms MS] [-linger-ms MS] DIR DATA N KIB")
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
		os.Exit(writeMode(os.Args[2:]))
	default:
		os.Exit(2)
	}
}

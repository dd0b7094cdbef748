//! drainfs over the real gcsfuse v3.11.2 (`Kind::Gcsfuse`: fake-gcs-server's memory backend on
//! loopback, gcsfuse with the flags REAL-PEERS.md gives), with drainfs's **default flags**
//! (`--passthrough auto`; only triggers, a short `--grace-period` where a test needs the
//! deadline, and observability flags are passed).
//!
//! The invariant every test checks: every file whose close() returned 0 is complete in the
//! bucket (read back from the server, never through a mount), and the exit code and the summary
//! (`open_paths`, `failed_flushes`, `outcome`) say exactly what was not.
//!
//! gcsfuse itself, as these tests find it: with streaming writes (its default) an object
//! appears in the bucket only at a FLUSH (a close() of the file or of a copy of its fd) or a
//! rename; fsync publishes nothing, and neither do the 32 MiB blocks streamed during write().
//! So every close() that drainfs lets through is an upload, and gcsfuse's own behaviour on a
//! signal (its 30 s watchdog), a dead server and a SIGKILL is checked here too.
//!
//! The tests take turns ([`serial`]) and never fork while a file is open: the exec of a forked
//! child closes its copy of every open fd, each such close is a FLUSH, and gcsfuse finalizes the
//! object at a FLUSH. `/status` and bucket listings are asked over HTTP from this process.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{close, open, pattern};
use fuse_tests::fileops::{SharedMap, StuckReader};
use fuse_tests::harness::{MountOpts, Mounted, is_mounted, make_dirs, wait_until};
use fuse_tests::lowers::{Kind, Object, Server, lowers_py, object_of, require_installed};
use fuse_tests::process::{cmdline, kill_leftovers, pid_alive, proc_status_field};
use fuse_tests::stack::{
    Stack, StackOpts, create_file, in_close, serial, write_and_close, write_file,
};
use fuse_tests::wait::summary_at;
use nix::sys::signal::Signal;

const MIB: usize = 1 << 20;
/// gcsfuse's default streaming-write block (`--write-block-size-mb`).
const BLOCK: usize = 32 * MIB;

fn stack(args: &[&str]) -> Stack {
    Stack::start_with(
        Kind::Gcsfuse,
        StackOpts {
            args: args.iter().map(|s| s.to_string()).collect(),
            ..StackOpts::default()
        },
    )
}

/// gcsfuse alone (no drainfs) mounted on `server`'s bucket at `<workdir>/direct`, by
/// `lowers.py mount`; `lowers.py`'s state file lets the server's cleanup unmount it.
fn mount_gcsfuse_alone(server: &Server) -> std::path::PathBuf {
    let mnt = server.workdir().join("direct");
    let wd = server.workdir().to_str().unwrap().to_string();
    lowers_py(&[
        "mount",
        "gcsfuse",
        "--workdir",
        &wd,
        "--mountpoint",
        mnt.to_str().unwrap(),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    mnt
}

/// Names and sizes in the bucket, asked without forking (see the module doc).
fn listing(s: &Server) -> BTreeMap<String, u64> {
    s.listing(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("listing the bucket: {e}"))
}

/// The summary's list `key`, as strings.
fn strings(sum: &serde_json::Value, key: &str) -> Vec<String> {
    sum[key]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

/// Whether a summary path list names `rel` (drainfs shows paths relative to the mount).
fn names(list: &[String], rel: &str) -> bool {
    list.iter()
        .any(|p| p.trim_start_matches('/') == rel.trim_start_matches('/'))
}

/// A clean stop: exit 0, outcome `clean` with `cause`, no flush failed, gcsfuse stopped by
/// drainfs's SIGINT and exited 0 (it unmounts itself), nothing left mounted or running.
fn assert_clean(s: &mut Stack, cause: &str, timeout: Duration) -> serde_json::Value {
    let code = s.wait_exit(timeout);
    assert_eq!(code, 0, "{}", s.m.proc.stderr_text());
    let sum = s.summary();
    assert_eq!(sum["outcome"], "clean", "{sum}");
    assert_eq!(sum["cause"]["cause"], cause, "{sum}");
    assert_eq!(sum["counts"]["lower_flush_errors"], 0, "{sum}");
    assert_eq!(
        strings(&sum, "failed_flushes"),
        Vec::<String>::new(),
        "{sum}"
    );
    assert_eq!(
        sum["lower_exit"], "exit 0",
        "gcsfuse's exit after SIGINT: {sum}"
    );
    s.assert_clean_end();
    sum
}

/// A file being closed on another thread: `data` is written, then the thread reports its
/// (tid, fd) and calls close(), which returns the instant it returned or its error.
struct Closing {
    tid: i32,
    fd: i32,
    thread: std::thread::JoinHandle<std::io::Result<Instant>>,
}

/// Starts writing `data` to `path` on a new thread; returns once the data is written and the
/// thread is about to close (up to `write_timeout`). `before_close` runs on the main thread
/// after the data is written and before the close starts.
fn write_then_close(
    path: PathBuf,
    data: Vec<u8>,
    write_timeout: Duration,
    before_close: impl FnOnce(),
) -> Closing {
    let (tx, rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let mut f = open(&path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644)?;
        f.write_all(&data)?;
        drop(data);
        // SAFETY: gettid has no preconditions.
        tx.send((unsafe { libc::gettid() }, f.as_raw_fd())).unwrap();
        let _ = go_rx.recv();
        close(f).map(|()| Instant::now())
    });
    let Ok((tid, fd)) = rx.recv_timeout(write_timeout) else {
        panic!("the writer did not write its data: {:?}", thread.join());
    };
    before_close();
    go_tx.send(()).unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || in_close(tid, fd)),
        "the writer was never seen inside close()"
    );
    Closing { tid, fd, thread }
}

// ---------------------------------------------------------------- the data path, the main job

/// What `auto` decides on `fuse.gcsfuse`, from `/status`: kernel passthrough for readers and
/// writers, because gcsfuse keeps write state per inode. Then a workload (nested directories,
/// an empty file, small files, a file of two streaming-write blocks) and the exit file: exit 0,
/// and the bucket holds exactly those objects.
#[test]
fn auto_gives_writers_passthrough_on_gcsfuse_and_the_exit_file_uploads_everything() {
    let _serial = serial();
    require_installed(&[]);
    let mut files: Vec<(String, Vec<u8>)> = vec![
        (
            "out/hello.txt".into(),
            b"hello from the workload\n".to_vec(),
        ),
        ("out/nested/deeper/empty".into(), Vec::new()),
        ("out/two-blocks.bin".into(), pattern(2, 2 * BLOCK + 12345)),
    ];
    for i in 0..8 {
        files.push((
            format!("out/nested/part-{i:02}.bin"),
            pattern(10 + i, 4096 * (i as usize + 1) + 17),
        ));
    }
    let want: BTreeMap<String, Object> = files
        .iter()
        .map(|(k, d)| (k.clone(), object_of(d)))
        .collect();
    let mut s = stack(&[]);
    let status = s.status().expect("/status answers");
    let init = &status["init"];
    assert_eq!(
        init["lower_fs"], "fuse.gcsfuse from drainfs-test",
        "{status}"
    );
    assert_eq!(init["passthrough"], true, "{status}");
    assert_eq!(init["writes_passthrough"], true, "{status}");
    let reason = init["data_path_reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("auto") && reason.contains("gcsfuse") && reason.contains("per inode"),
        "auto's reason on gcsfuse: {reason}"
    );
    std::fs::create_dir_all(s.m.path("out/nested/deeper")).unwrap();
    for (key, data) in &files {
        write_file(&s.m.path(key), data).unwrap_or_else(|e| panic!("writing {key}: {e}"));
    }
    // Every close() returned 0, so every object is there before any trigger.
    let listed = listing(&s.server);
    for (key, data) in &files {
        assert_eq!(
            listed.get(key),
            Some(&(data.len() as u64)),
            "{key}: {listed:?}"
        );
    }
    s.trigger_exit_file();
    let sum = assert_clean(&mut s, "exit_file", Duration::from_secs(60));
    // Kernel passthrough carried the writes: none went through drainfs's own data path.
    assert_eq!(sum["counts"]["bytes_written"], 0, "{sum}");
    s.assert_bucket(&want);
}

/// gcsfuse's streaming writes, as the README states them: nothing is in the bucket before the
/// file is closed (not after a whole 32 MiB block was written, not after fsync); after
/// fsync more writes are accepted, and close() publishes all of it (through drainfs, and the
/// same on gcsfuse alone: [`gcsfuse_alone_publishes_at_close_not_at_fsync`]).
#[test]
fn fsync_then_more_writes_then_close_publishes_everything_at_close() {
    let _serial = serial();
    require_installed(&[]);
    let first = pattern(30, BLOCK + 3 * MIB);
    let second = pattern(31, 5 * MIB + 7);
    let whole: Vec<u8> = [first.as_slice(), second.as_slice()].concat();
    let want = object_of(&whole);
    let mut s = stack(&[]);
    let mut f = open(
        &s.m.path("synced.bin"),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        0o644,
    )
    .unwrap();
    f.write_all(&first).unwrap();
    assert_eq!(
        listing(&s.server).get("synced.bin"),
        None,
        "visible before fsync"
    );
    f.sync_all().expect("fsync");
    assert_eq!(
        listing(&s.server).get("synced.bin"),
        None,
        "fsync finalized the object (the README says it does not with streaming writes)"
    );
    f.write_all(&second).expect("writes after fsync");
    close(f).expect("close after fsync and more writes");
    assert_eq!(
        listing(&s.server).get("synced.bin"),
        Some(&(whole.len() as u64))
    );
    s.trigger_exit_file();
    assert_clean(&mut s, "exit_file", Duration::from_secs(60));
    s.assert_bucket(&BTreeMap::from([("synced.bin".to_string(), want)]));
}

/// The same claims on gcsfuse alone (no drainfs), so they are gcsfuse's: the object appears
/// only at close(), not at fsync.
#[test]
fn gcsfuse_alone_publishes_at_close_not_at_fsync() {
    let _serial = serial();
    require_installed(&[]);
    let server = Server::start(Kind::Gcsfuse);
    let mnt = mount_gcsfuse_alone(&server);
    let data = pattern(32, 3 * MIB);
    let mut f = open(
        &mnt.join("alone.bin"),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        0o644,
    )
    .unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().expect("fsync");
    let after_fsync = listing(&server).get("alone.bin").copied();
    close(f).expect("close");
    let after_close = listing(&server).get("alone.bin").copied();
    // Server's drop unmounts and stops gcsfuse.
    assert_eq!(after_fsync, None, "gcsfuse finalized the object at fsync");
    assert_eq!(after_close, Some(data.len() as u64));
    assert_eq!(server.objects().get("alone.bin"), Some(&object_of(&data)));
}

/// gcsfuse finalizes at every FLUSH: the close of the fd copy a forked child's exec makes
/// publishes what was written so far, and the file's own close() publishes it all; renaming a
/// file that is still open publishes it under the new name, and the fd's next write fails with
/// ESTALE.
#[test]
fn gcsfuse_finalizes_at_every_flush_and_at_the_rename_of_an_open_file() {
    let _serial = serial();
    require_installed(&["true"]);
    let first = pattern(130, MIB);
    let second = pattern(131, MIB + 5);
    let whole = [first.as_slice(), second.as_slice()].concat();
    let renamed = pattern(132, 3 * MIB);
    let want = BTreeMap::from([
        ("forked.bin".to_string(), object_of(&whole)),
        ("renamed.bin".to_string(), object_of(&renamed)),
    ]);
    let mut s = stack(&[]);
    let mut f = open(
        &s.m.path("forked.bin"),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        0o644,
    )
    .unwrap();
    f.write_all(&first).unwrap();
    assert_eq!(listing(&s.server).get("forked.bin"), None);
    // The child's exec closes its copy of `f` (O_CLOEXEC): a FLUSH.
    let st = std::process::Command::new("true").status().unwrap();
    assert!(st.success());
    assert_eq!(
        listing(&s.server).get("forked.bin"),
        Some(&(first.len() as u64)),
        "the exec's FLUSH did not publish the partial file"
    );
    f.write_all(&second).expect("writes after the early FLUSH");
    close(f).expect("close");
    assert_eq!(
        listing(&s.server).get("forked.bin"),
        Some(&(whole.len() as u64))
    );

    let mut g = open(
        &s.m.path(".renamed.tmp"),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        0o644,
    )
    .unwrap();
    g.write_all(&renamed).unwrap();
    std::fs::rename(s.m.path(".renamed.tmp"), s.m.path("renamed.bin")).expect("rename while open");
    assert_eq!(
        listing(&s.server).get("renamed.bin"),
        Some(&(renamed.len() as u64)),
        "the rename did not publish the open file"
    );
    let late = g.write_all(b"late");
    assert_eq!(
        late.as_ref().map_err(|e| e.raw_os_error()),
        Err(Some(libc::ESTALE)),
        "write after the rename: {late:?}"
    );
    close(g).expect("close after the rename");
    s.trigger_exit_file();
    assert_clean(&mut s, "exit_file", Duration::from_secs(60));
    s.assert_bucket(&want);
}

/// Write a temp file, close it, rename it into place (also over an existing object): the
/// bucket has the final names with the new content and no temp file.
#[test]
fn rename_into_place() {
    let _serial = serial();
    require_installed(&[]);
    let old = pattern(40, 2 * MIB);
    let new = pattern(41, 3 * MIB + 1);
    let fresh = pattern(42, 100_000);
    let want = BTreeMap::from([
        ("model.bin".to_string(), object_of(&new)),
        ("dir/fresh.json".to_string(), object_of(&fresh)),
    ]);
    let mut s = stack(&[]);
    std::fs::create_dir(s.m.path("dir")).unwrap();
    write_file(&s.m.path("model.bin"), &old).unwrap();
    write_file(&s.m.path(".model.bin.tmp"), &new).unwrap();
    std::fs::rename(s.m.path(".model.bin.tmp"), s.m.path("model.bin")).expect("rename over");
    write_file(&s.m.path("dir/.fresh.tmp"), &fresh).unwrap();
    std::fs::rename(s.m.path("dir/.fresh.tmp"), s.m.path("dir/fresh.json")).expect("rename");
    s.trigger_exit_file();
    assert_clean(&mut s, "exit_file", Duration::from_secs(60));
    s.assert_bucket(&want);
}

/// Appends (O_APPEND) to a closed object, small and over gcsfuse's 2 MiB compose threshold:
/// the object is the concatenation.
#[test]
fn append_to_a_closed_object() {
    let _serial = serial();
    require_installed(&[]);
    let parts = [
        pattern(50, 3 * MIB),
        pattern(51, 100),
        pattern(52, 4 * MIB + 3),
    ];
    let whole = parts.concat();
    let want = object_of(&whole);
    let mut s = stack(&[]);
    write_file(&s.m.path("log.bin"), &parts[0]).unwrap();
    for p in &parts[1..] {
        let mut f = open(&s.m.path("log.bin"), libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
        f.write_all(p).unwrap();
        close(f).expect("close after append");
    }
    s.trigger_exit_file();
    assert_clean(&mut s, "exit_file", Duration::from_secs(60));
    s.assert_bucket(&BTreeMap::from([("log.bin".to_string(), want)]));
}

/// Writes through a shared mapping (kernel passthrough maps gcsfuse's file): with msync before
/// munmap, and with munmap alone before close(). Both objects are complete.
#[test]
fn mmap_writes_then_close() {
    let _serial = serial();
    require_installed(&[]);
    let len = 4 * MIB + 4096;
    let a = pattern(60, len);
    let b = pattern(61, len);
    let want = BTreeMap::from([
        ("mapped-msync.bin".to_string(), object_of(&a)),
        ("mapped.bin".to_string(), object_of(&b)),
    ]);
    let mut s = stack(&[]);
    for (name, data, msync) in [("mapped-msync.bin", &a, true), ("mapped.bin", &b, false)] {
        let f = open(
            &s.m.path(name),
            libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
            0o644,
        )
        .unwrap();
        f.set_len(len as u64).unwrap();
        let mut map = SharedMap::new(&f, len, true);
        map.write_at(0, data);
        if msync {
            map.msync();
        }
        map.unmap();
        close(f).unwrap_or_else(|e| panic!("close of {name}: {e}"));
    }
    s.trigger_exit_file();
    assert_clean(&mut s, "exit_file", Duration::from_secs(60));
    s.assert_bucket(&want);
}

/// Creates `path` with `data.len()` bytes, maps it shared, closes the fd (asserting close()
/// returned 0), writes `data` through the mapping, and unmaps it.
fn write_mapped_after_close(path: &std::path::Path, data: &[u8]) {
    let len = data.len();
    let f = open(path, libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC, 0o644).unwrap();
    f.set_len(len as u64).unwrap();
    let mut map = SharedMap::new(&f, len, true);
    close(f).expect("close before the mapped writes");
    // The mapping outlives the fd.
    map.write_at(0, data);
    map.unmap();
}

/// gcsfuse alone, for comparison with [`mmap_writes_after_close_reach_the_bucket`]: writes
/// through a mapping after close() never reach the bucket, not even when gcsfuse unmounts (its
/// FLUSH at close() finalized the object, munmap writes the pages back to gcsfuse, and nothing
/// flushes the inode again: gcsfuse uploads only at FLUSH and FSYNC).
#[test]
fn gcsfuse_alone_loses_mmap_writes_after_close() {
    let _serial = serial();
    require_installed(&[]);
    let data = pattern(62, 2 * MIB);
    let zeros = object_of(&vec![0u8; data.len()]);
    let server = Server::start(Kind::Gcsfuse);
    let mnt = mount_gcsfuse_alone(&server);
    write_mapped_after_close(&mnt.join("late.bin"), &data);
    fuse_tests::mounts::umount_when_free(&mnt, Duration::from_secs(10)).expect("umount");
    // Server's drop stops gcsfuse (which exits once unmounted) and the server.
    assert_eq!(server.objects().get("late.bin"), Some(&zeros));
}

/// Writes through a shared mapping after the fd was closed (close() returned 0 before the
/// writes, and munmap ends them), then the exit file: either the object has the mapping's
/// content and drainfs exits 0, or drainfs says it may not (exit 75, the file named in the
/// summary). With kernel passthrough the mapping is of gcsfuse's file itself and drainfs's
/// RELEASE comes at close(), before the writes (gcsfuse alone loses them:
/// [`gcsfuse_alone_loses_mmap_writes_after_close`]); drainfs keeps a released writer's lower
/// fd and closes it at the teardown, which gives gcsfuse the FLUSH that uploads them. With
/// `--passthrough never` the mapping is drainfs's, and the kernel writes the pages back to
/// drainfs at munmap, before RELEASE.
#[test]
fn mmap_writes_after_close_reach_the_bucket() {
    let _serial = serial();
    require_installed(&[]);
    let len = 2 * MIB;
    let data = pattern(62, len);
    let want = object_of(&data);
    let mut s = stack(&[]);
    write_mapped_after_close(&s.m.path("late.bin"), &data);
    s.trigger_exit_file();
    let code = s.wait_exit(Duration::from_secs(60));
    let sum = s.summary();
    s.assert_clean_end();
    let got = s.server.objects();
    if got.get("late.bin") == Some(&want) {
        assert_eq!(code, 0, "{sum}");
        assert_eq!(sum["outcome"], "clean", "{sum}");
    } else {
        let named: Vec<String> =
            [strings(&sum, "open_paths"), strings(&sum, "failed_flushes")].concat();
        assert!(
            code == 75 && names(&named, "late.bin"),
            "late.bin is {:?} in the bucket (want {want:?}), but drainfs exited {code}: {sum}",
            got.get("late.bin")
        );
    }
}

/// A writer that opens a file while a reader holds it open (the reader's kernel passthrough
/// backing id forces the writer onto passthrough too): the writer's data is what the bucket
/// has, and a second writer handle closed first does not publish a torn object.
#[test]
fn writers_beside_a_reader_and_a_second_writer() {
    let _serial = serial();
    require_installed(&[]);
    let old = pattern(120, 512 * 1024);
    let new = pattern(121, 3 * MIB);
    let both = pattern(122, 2 * MIB);
    let want = BTreeMap::from([
        ("rw.dat".to_string(), object_of(&new)),
        ("two.dat".to_string(), object_of(&both)),
    ]);
    let mut s = stack(&[]);
    write_file(&s.m.path("rw.dat"), &old).unwrap();
    let reader = std::fs::File::open(s.m.path("rw.dat")).unwrap();
    write_file(&s.m.path("rw.dat"), &new).expect("the writer's open, writes and close succeed");
    drop(reader);
    // Two writable handles of one file; the one that wrote is closed last.
    let mut a = open(
        &s.m.path("two.dat"),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        0o644,
    )
    .unwrap();
    let b = open(&s.m.path("two.dat"), libc::O_WRONLY, 0).unwrap();
    a.write_all(&both[..MIB]).unwrap();
    close(b).expect("close of the idle handle");
    a.write_all(&both[MIB..]).unwrap();
    close(a).expect("close of the writing handle");
    s.trigger_exit_file();
    assert_clean(&mut s, "exit_file", Duration::from_secs(60));
    s.assert_bucket(&want);
}

// ---------------------------------------------------------------- the triggers

/// How a test stops drainfs.
#[derive(Debug, Clone, Copy)]
enum Trigger {
    /// The exit file (regular sidecar, workload gone).
    ExitFile,
    /// SIGTERM with `--native-sidecar` (workload gone).
    NativeSigterm,
    /// SIGTERM of a regular sidecar (the application may still write).
    PlainSigterm,
}

/// A 256 MiB file (eight streaming-write blocks) inside close() when `trigger` comes (the
/// server is held stopped for the moment, so the close is certainly still uploading): close()
/// returns 0, drainfs drains only after it, exits 0, and the object is complete.
fn large_file_inside_close_at(trigger: Trigger) {
    let _serial = serial();
    require_installed(&[]);
    let data = pattern(3, 256 * MIB);
    let want = object_of(&data);
    let mut s = match trigger {
        Trigger::NativeSigterm => stack(&["--native-sidecar"]),
        _ => stack(&[]),
    };
    let server_pid = s.server.pid;
    let c = write_then_close(
        s.m.path("model.bin"),
        data,
        Duration::from_secs(300),
        || {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(server_pid), Signal::SIGSTOP);
        },
    );
    let signalled = Instant::now();
    match trigger {
        Trigger::ExitFile => s.trigger_exit_file(),
        _ => s.m.proc.signal(Signal::SIGTERM),
    }
    std::thread::sleep(Duration::from_millis(300));
    let still_in_close = in_close(c.tid, c.fd);
    let drainfs_running = s.m.proc.wait_timeout(Duration::ZERO).is_none();
    s.server.signal(Signal::SIGCONT);
    let closed = c
        .thread
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("close() failed after the {trigger:?}: {e}"));
    assert!(still_in_close, "close() ended while the server was stopped");
    assert!(
        drainfs_running,
        "drainfs exited while a close() was uploading"
    );
    let cause = match trigger {
        Trigger::ExitFile => "exit_file",
        _ => "sigterm",
    };
    let sum = assert_clean(&mut s, cause, Duration::from_secs(120));
    // Both on the wall clock: drainfs counts drained_ms from when it saw the trigger (an exit
    // file in a directory created by the trigger is seen up to 500 ms after `signalled`), and
    // `trigger` is in whole milliseconds. `closed` is taken when the closing thread runs again
    // after close(2), which a busy machine can delay, and it is turned into wall time seconds
    // later, across any adjustment of the wall clock meanwhile (a fresh-clone run on a VM that
    // had booted 2.5 hours earlier saw both tests 20-24 ms late: drained at .884, closed at
    // .904, drainfs's own "drained" log line at .909);
    // a drain declared while the server was stopped (the upload then still has seconds to
    // go) would be early by far more, so 100 ms of slack still catches that.
    let drained = Duration::from_millis(sum["timings"]["drained_ms"].as_u64().unwrap());
    let trigger = humantime::parse_rfc3339(sum["timings"]["trigger"].as_str().unwrap()).unwrap();
    let closed_wall = std::time::SystemTime::now() - closed.elapsed();
    assert!(
        trigger + drained + Duration::from_millis(100) >= closed_wall,
        "drained at {:?}, but close() returned at {:?} (after the trigger: {:?}): {sum}",
        humantime::format_rfc3339_millis(trigger + drained),
        humantime::format_rfc3339_millis(closed_wall),
        closed.duration_since(signalled)
    );
    s.assert_bucket(&BTreeMap::from([("model.bin".to_string(), want)]));
}

#[test]
fn native_sigterm_while_a_256_mib_file_is_inside_close_keeps_the_object() {
    large_file_inside_close_at(Trigger::NativeSigterm);
}

#[test]
fn exit_file_while_a_256_mib_file_is_inside_close_keeps_the_object() {
    large_file_inside_close_at(Trigger::ExitFile);
}

#[test]
fn plain_sigterm_while_a_256_mib_file_is_inside_close_keeps_the_object() {
    large_file_inside_close_at(Trigger::PlainSigterm);
}

/// A plain SIGTERM (regular sidecar) while the application keeps writing files (its last
/// checkpoint): drainfs keeps serving while the mount is busy (no open is refused), every file
/// is complete, and drainfs exits 0 once the application has stopped.
#[test]
fn plain_sigterm_with_the_app_still_writing() {
    let _serial = serial();
    require_installed(&[]);
    let payloads: Vec<Vec<u8>> = (0..40)
        .map(|i| pattern(70 + i, 256 * 1024 + i as usize))
        .collect();
    let wants: Vec<Object> = payloads.iter().map(|d| object_of(d)).collect();
    let mut s = stack(&[]);
    std::fs::create_dir(s.m.path("ckpt")).unwrap();
    let dir = s.m.path("ckpt");
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        let mut done: Vec<(usize, Instant)> = Vec::new();
        let mut refused = None;
        for (i, d) in payloads.iter().enumerate() {
            if i == 5 {
                tx.send(()).unwrap();
            }
            match write_file(&dir.join(format!("c-{i:02}")), d) {
                Ok(()) => done.push((i, Instant::now())),
                Err(e) => {
                    refused = Some((i, e));
                    break;
                }
            }
        }
        (done, refused)
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the writer started");
    let signalled = Instant::now();
    s.m.proc.signal(Signal::SIGTERM);
    let (done, refused) = writer.join().unwrap();
    let after: Vec<usize> = done
        .iter()
        .filter(|(_, t)| *t > signalled)
        .map(|(i, _)| *i)
        .collect();
    eprintln!(
        "{} files closed, {} after SIGTERM; stopped by {refused:?}",
        done.len(),
        after.len()
    );
    // The writer never leaves the mount idle for the quiet period (500 ms): none of its opens
    // is refused, and most of its files are written after the SIGTERM.
    assert!(
        refused.is_none(),
        "an open was refused while the application kept writing: {refused:?}"
    );
    assert_eq!(done.len(), 40);
    assert!(
        after.len() >= 30,
        "only {} files after the SIGTERM",
        after.len()
    );
    assert_clean(&mut s, "sigterm", Duration::from_secs(60));
    let want: BTreeMap<String, Object> = done
        .iter()
        .map(|(i, _)| (format!("ckpt/c-{i:02}"), wants[*i].clone()))
        .collect();
    s.assert_bucket(&want);
}

/// A second SIGTERM while a file is still open for writing: drainfs finishes at once, exits
/// 75, and the summary names the open file; the file closed before is complete.
#[test]
fn second_sigterm_with_a_file_still_open_exits_75_and_names_it() {
    let _serial = serial();
    require_installed(&[]);
    let done = pattern(80, 2 * MIB);
    let want_done = object_of(&done);
    let held_data = pattern(81, MIB);
    let want_held = object_of(&held_data);
    let mut s = stack(&["--native-sidecar"]);
    write_file(&s.m.path("done.bin"), &done).unwrap();
    let mut held = open(
        &s.m.path("held.bin"),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        0o644,
    )
    .unwrap();
    held.write_all(&held_data).unwrap();
    s.m.proc.signal(Signal::SIGTERM);
    assert!(
        wait_until(Duration::from_secs(10), || s
            .status()
            .is_some_and(|v| v["phase"] == "door_closed")),
        "the door did not close: {:?}",
        s.status()
    );
    // The open file holds the drain.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        s.m.proc.wait_timeout(Duration::ZERO).is_none(),
        "drainfs exited with a file open"
    );
    s.m.proc.signal(Signal::SIGTERM);
    let code = s.wait_exit(Duration::from_secs(30));
    assert_eq!(code, 75, "{}", s.m.proc.stderr_text());
    let sum = s.summary();
    assert_eq!(sum["outcome"], "incomplete", "{sum}");
    assert_eq!(sum["forced"], "second_signal", "{sum}");
    let open_paths = strings(&sum, "open_paths");
    assert!(names(&open_paths, "held.bin"), "{sum}");
    assert!(!names(&open_paths, "done.bin"), "{sum}");
    let r = close(held);
    eprintln!("the application's close() after drainfs exited: {r:?}");
    s.assert_clean_end();
    let got = s.server.objects();
    assert_eq!(got.get("done.bin"), Some(&want_done), "{got:?}");
    // drainfs's forced teardown closes its lower fd, and gcsfuse finalizes at that close: the
    // object, if there, is what was written (never a torn mix).
    if let Some(h) = got.get("held.bin") {
        assert_eq!(h, &want_held, "{got:?}");
    }
    eprintln!(
        "held.bin in the bucket after the forced exit: {:?}",
        got.get("held.bin")
    );
}

/// The deadline with fake-gcs-server stopped (SIGSTOP) while a close() is uploading: drainfs
/// exits 75 before the grace period ends, the summary names the file, the application's close()
/// does not return 0, and nothing is left mounted.
#[test]
fn deadline_with_the_server_stopped_exits_75_and_names_the_file() {
    let _serial = serial();
    require_installed(&[]);
    let mut s = stack(&["--grace-period", "10s"]);
    let server_pid = s.server.pid;
    let c = write_then_close(
        s.m.path("stuck.bin"),
        pattern(90, 3 * MIB),
        Duration::from_secs(60),
        || {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(server_pid), Signal::SIGSTOP);
        },
    );
    let t = Instant::now();
    s.trigger_exit_file();
    let code = s.wait_exit(Duration::from_secs(30));
    let took = t.elapsed();
    assert_eq!(code, 75, "{}", s.m.proc.stderr_text());
    let sum = s.summary();
    eprintln!("summary after the deadline ({took:?} after the trigger): {sum}");
    // drainfs's own clock: it forces at 9 s (the grace period less its 1 s margin) and must
    // have written its summary before the grace period ends.
    let exit_ms = sum["timings"]["exit_ms"].as_u64().unwrap_or(u64::MAX);
    assert!(
        exit_ms < 10_000,
        "drainfs exited {exit_ms} ms after the trigger, past the 10 s grace period: {sum}"
    );
    assert_eq!(sum["outcome"], "incomplete", "{sum}");
    assert_eq!(sum["forced"], "deadline", "{sum}");
    let named: Vec<String> =
        [strings(&sum, "open_paths"), strings(&sum, "failed_flushes")].concat();
    assert!(names(&named, "stuck.bin"), "{sum}");
    s.server.signal(Signal::SIGCONT);
    let r = c.thread.join().unwrap();
    assert!(
        r.is_err(),
        "close() returned 0 although drainfs gave up on its upload"
    );
    s.assert_clean_end();
}

/// gcsfuse SIGKILLed while a file is open for writing (and one was closed before): the next
/// write fails, drainfs exits 69 within seconds with `lower_died`, nothing stays mounted, and
/// the closed file is complete.
#[test]
fn gcsfuse_sigkilled_with_a_file_open_exits_69() {
    let _serial = serial();
    require_installed(&[]);
    let done = pattern(100, MIB);
    let want_done = object_of(&done);
    let mut s = stack(&[]);
    write_file(&s.m.path("done.bin"), &done).unwrap();
    let mut f = open(
        &s.m.path("open.bin"),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        0o644,
    )
    .unwrap();
    f.write_all(&pattern(101, MIB)).unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(s.lower_pid), Signal::SIGKILL).unwrap();
    let chunk = pattern(102, 64 * 1024);
    let t = Instant::now();
    let err = loop {
        match f.write_all(&chunk) {
            Err(e) => break e,
            Ok(()) if t.elapsed() > Duration::from_secs(5) => {
                panic!("writes still succeed 5 s after gcsfuse was killed")
            }
            Ok(()) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let errno = err.raw_os_error().unwrap_or(0);
    assert!(
        [libc::EIO, libc::ENOTCONN, libc::ECONNABORTED].contains(&errno),
        "write after gcsfuse died: {err}"
    );
    let closed = close(f);
    eprintln!("after gcsfuse's SIGKILL: write {err}, close {closed:?}");
    assert!(
        closed.is_err(),
        "close() returned 0 on a file gcsfuse never uploaded"
    );
    let code = s.wait_exit(Duration::from_secs(30));
    eprintln!("drainfs exited {:?} after the SIGKILL", t.elapsed());
    assert_eq!(code, 69, "{}", s.m.proc.stderr_text());
    let sum = s.summary();
    assert_eq!(sum["outcome"], "lower_failed", "{sum}");
    assert_eq!(sum["cause"]["cause"], "lower_died", "{sum}");
    s.assert_clean_end();
    let got = s.server.objects();
    assert_eq!(got.get("done.bin"), Some(&want_done), "{got:?}");
    assert_eq!(got.get("open.bin"), None, "{got:?}");
}

/// Someone else sends gcsfuse SIGTERM (drainfs holds fds on the lower, so gcsfuse's own unmount
/// fails with EBUSY): gcsfuse keeps serving, and a file written then is complete; 30 s after
/// the signal its watchdog exits 0 with the mount still there, and drainfs takes that for a
/// dead lower: exit 69, nothing left mounted.
#[test]
fn gcsfuse_sigterm_from_outside_keeps_serving_then_exits_0_after_30_s() {
    let _serial = serial();
    require_installed(&[]);
    let data = pattern(140, 2 * MIB);
    let want = object_of(&data);
    let mut s = stack(&[]);
    let t = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(s.lower_pid), Signal::SIGTERM).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    write_file(&s.m.path("after-sigterm.bin"), &data).expect("gcsfuse still serves");
    assert!(
        s.m.proc.wait_timeout(Duration::from_secs(20)).is_none(),
        "drainfs exited within 20 s of gcsfuse's SIGTERM"
    );
    let code = s.wait_exit(Duration::from_secs(40));
    let took = t.elapsed();
    eprintln!("drainfs exited {code} {took:?} after gcsfuse's SIGTERM");
    assert!(
        took >= Duration::from_secs(29),
        "gcsfuse stopped after {took:?}"
    );
    assert_eq!(code, 69, "{}", s.m.proc.stderr_text());
    let sum = s.summary();
    assert_eq!(sum["outcome"], "lower_failed", "{sum}");
    assert_eq!(sum["cause"]["cause"], "lower_died", "{sum}");
    eprintln!(
        "lower_exit {} lower_died {}",
        sum["lower_exit"], sum["lower_died"]
    );
    s.assert_clean_end();
    s.assert_bucket(&BTreeMap::from([("after-sigterm.bin".to_string(), want)]));
}

/// fake-gcs-server killed while a file is open, then the file is closed and the exit file
/// written: close() does not return 0, drainfs does not exit 0, and the summary names the file
/// (the bucket died with the server, so nothing can be read back).
#[test]
fn server_killed_under_an_open_file_is_not_a_clean_exit() {
    let _serial = serial();
    require_installed(&[]);
    let mut s = stack(&["--grace-period", "8s"]);
    let mut f = open(
        &s.m.path("lost.bin"),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        0o644,
    )
    .unwrap();
    f.write_all(&pattern(110, 2 * MIB)).unwrap();
    s.server.signal(Signal::SIGKILL);
    let (tx, rx) = std::sync::mpsc::channel();
    let closer = std::thread::spawn(move || {
        let r = close(f);
        let _ = tx.send(());
        r
    });
    // Whatever close() does (fail at once, or retry until drainfs gives up), the exit file
    // follows it.
    let _ = rx.recv_timeout(Duration::from_secs(2));
    s.trigger_exit_file();
    let code = s.wait_exit(Duration::from_secs(30));
    let r = closer.join().unwrap();
    eprintln!(
        "close() with the server dead: {r:?}; drainfs exit {code}: {}",
        std::fs::read_to_string(&s.summary).unwrap_or_default()
    );
    assert!(r.is_err(), "close() returned 0 although the server is dead");
    assert_eq!(code, 75, "{}", s.m.proc.stderr_text());
    let sum = s.summary();
    assert_eq!(sum["outcome"], "incomplete", "{sum}");
    let named: Vec<String> =
        [strings(&sum, "open_paths"), strings(&sum, "failed_flushes")].concat();
    assert!(names(&named, "lost.bin"), "{sum}");
    s.assert_clean_end();
}

/// gcsfuse without `--foreground` daemonizes: the process drainfs started exits once its
/// daemon has mounted, and drainfs takes that for a dead lower (exit 69, as the README says),
/// and leaves nothing mounted (the daemon ends with its unmounted mount).
#[test]
fn gcsfuse_without_foreground_is_a_dead_lower() {
    let _serial = serial();
    require_installed(&[]);
    let server = Server::start(Kind::Gcsfuse);
    let dir = tempfile::Builder::new()
        .prefix("drainfs-real-gcsfuse-")
        .tempdir_in("/tmp")
        .unwrap();
    let [lower, mnt] = make_dirs(dir.path(), ["lower", "mnt"]);
    let summary = dir.path().join("summary.json");
    let lower_cmd: Vec<String> = server
        .mount_cmd(&lower)
        .into_iter()
        .filter(|a| a != "--foreground")
        .collect();
    let mut m = Mounted::start_in(
        dir,
        lower.clone(),
        mnt.clone(),
        MountOpts {
            args: vec![
                "--summary-file".into(),
                summary.display().to_string(),
                "--lower-ready-timeout".into(),
                "30s".into(),
            ],
            lower_cmd,
            no_wait: true,
        },
    );
    let st = m.proc.wait_exit(Duration::from_secs(60), "drainfs");
    assert_eq!(st.code(), Some(69), "{}", m.proc.stderr_text());
    let sum = summary_at(&summary);
    eprintln!("without --foreground: {sum}");
    assert_eq!(sum["outcome"], "lower_failed", "{sum}");
    assert!(
        wait_until(Duration::from_secs(10), || !is_mounted(&lower)
            && !is_mounted(&mnt)),
        "a mount was left behind"
    );
    // The daemon (not drainfs's child) ends by itself once its mount is gone; if not, it is
    // this test's to kill.
    let daemons = || -> Vec<i32> {
        let needle = lower.to_string_lossy().into_owned();
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            // comm first: a cmdline read waits behind a process stuck in a page fault
            // anywhere on the machine, comm does not.
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "gcsfuse")
            })
            .filter(|pid| cmdline(*pid).iter().any(|a| a.contains(&needle)))
            .filter(|pid| pid_alive(*pid))
            .collect()
    };
    let gone = wait_until(Duration::from_secs(10), || daemons().is_empty());
    let left = daemons();
    kill_leftovers(&left);
    assert!(gone, "gcsfuse's daemon outlived its mount: {left:?}");
}

// ---------------------------------------------------------------- randomized stop moments

/// xorshift64*, seeded.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Three rounds, each: one to three application threads writing files of random sizes (some
/// over a streaming-write block), and at a random moment a random trigger (exit file, native
/// SIGTERM, plain SIGTERM). Each thread stops at its first refused open (ESHUTDOWN) or after 8
/// files. Every file whose close() returned 0 is complete, the bucket has nothing else, and
/// drainfs exits 0 (nothing was outstanding that the application did not finish). The seed is
/// printed; `DRAINFS_TEST_SEED=N` replays a run.
///
/// The exit file and the native SIGTERM say the workload is gone, and drainfs unmounts as soon
/// as nothing is open for writing: a file opened after that lands in the directory underneath
/// (shutdown.md). So for those two the application behaves as a gone workload does: from the
/// trigger on it opens no new file, and an open it began before the trigger has returned
/// before the trigger is sent (`gate`); the files it has open then are finished and must
/// reach the bucket. Sent while an open was still on its way (seed 1796622554158610993, round
/// 1: a native SIGTERM 0 ms in, the open's LOOKUP in flight), the open failed with ENOTCONN
/// when the teardown cut it off. A plain SIGTERM says nothing of the workload: the threads
/// write on, and every open refused must be refused with ESHUTDOWN.
#[test]
fn randomized_stop_moments() {
    let _serial = serial();
    require_installed(&[]);
    let seed: u64 = std::env::var("DRAINFS_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("randomized_stop_moments: DRAINFS_TEST_SEED={seed}");
    let mut rng = Rng(seed | 1);
    for round in 0..3 {
        let trigger = rng.below(3);
        let delay = Duration::from_millis(rng.below(1500));
        let writers = 1 + rng.below(3) as usize;
        // Per writer, the sizes of its files (a few cross a streaming-write block).
        let sizes: Vec<Vec<usize>> = (0..writers)
            .map(|_| {
                (0..8)
                    .map(|_| match rng.below(8) {
                        0 => 0,
                        1 => BLOCK + rng.below(4 * MIB as u64) as usize,
                        _ => rng.below(3 * MIB as u64) as usize + 1,
                    })
                    .collect()
            })
            .collect();
        let (name, args): (&str, &[&str]) = match trigger {
            0 => ("exit file", &[]),
            1 => ("native SIGTERM", &["--native-sidecar"]),
            _ => ("plain SIGTERM", &[]),
        };
        eprintln!("round {round}: {name} after {delay:?}, {writers} writers, sizes {sizes:?}");
        let mut wants: BTreeMap<String, Object> = BTreeMap::new();
        let mut jobs: Vec<Vec<(String, Vec<u8>)>> = Vec::new();
        for (w, files) in sizes.iter().enumerate() {
            let mut job = Vec::new();
            for (i, n) in files.iter().enumerate() {
                let key = format!("w{w}-{i:02}");
                let d = pattern(seed ^ (round * 1000 + w as u64 * 100 + i as u64), *n);
                wants.insert(key.clone(), object_of(&d));
                job.push((key, d));
            }
            jobs.push(job);
        }
        let mut s = stack(args);
        // True once the workload is gone; held from a thread's check through its open.
        let gate = std::sync::Arc::new(std::sync::Mutex::new(false));
        let threads: Vec<_> = jobs
            .into_iter()
            .map(|job| {
                let dir = s.m.path("");
                let gate = gate.clone();
                std::thread::spawn(move || {
                    let mut done = BTreeSet::new();
                    for (key, d) in &job {
                        let opened = {
                            let gone = gate.lock().unwrap();
                            if *gone {
                                break;
                            }
                            create_file(&dir.join(key))
                        };
                        match opened.and_then(|f| write_and_close(f, d)) {
                            Ok(()) => {
                                done.insert(key.clone());
                            }
                            Err(e) => return (done, Some((key.clone(), e))),
                        }
                    }
                    (done, None)
                })
            })
            .collect();
        std::thread::sleep(delay);
        if trigger < 2 {
            *gate.lock().unwrap() = true;
        }
        match trigger {
            0 => s.trigger_exit_file(),
            _ => s.m.proc.signal(Signal::SIGTERM),
        }
        let mut done = BTreeSet::new();
        for t in threads {
            let (d, refused) = t.join().unwrap();
            eprintln!("round {round}: closed {d:?}, stopped by {refused:?}");
            if let Some((key, e)) = &refused {
                assert_eq!(
                    e.raw_os_error(),
                    Some(libc::ESHUTDOWN),
                    "round {round} (seed {seed}): {key} failed: {e}"
                );
            }
            done.extend(d);
        }
        let cause = if trigger == 0 { "exit_file" } else { "sigterm" };
        assert_clean(&mut s, cause, Duration::from_secs(120));
        let want: BTreeMap<String, Object> =
            done.iter().map(|k| (k.clone(), wants[k].clone())).collect();
        s.assert_bucket(&want);
    }
}

/// Issue 17.7 on the mount path: a read that gcsfuse cannot answer (fake-gcs-server SIGSTOPped
/// while it waits) when the exit file appears. Nothing is written, so nothing can be lost, and
/// the read does not hold the drain. gcsfuse waits for its in-flight ops, so drainfs has to
/// SIGKILL it. With `--passthrough never` drainfs serves the read and counts it: the kill is
/// explained by a read, exit 0. With `auto` (reads by kernel passthrough) drainfs cannot see
/// the read, so a gcsfuse that does not exit is busy with something unknown: exit 75, the
/// conservative answer. Either way before the grace period ends, the reader gets an error,
/// the object is intact, nothing is left mounted.
///
/// The object is written through a second gcsfuse on the same bucket, not through the stack:
/// the stack's gcsfuse keeps a file's page cache from open to open (v3.11.2 `OpenFile`:
/// `KeepPageCache = true`), so pages it was written through could answer the read without
/// the server (they did once, under `stress-ng --cpu 2`: the read returned 1 MiB with the
/// server stopped). The stack's gcsfuse only looks the object up (before the server stops).
fn a_read_stuck_in_gcsfuse_at_the_stop(passthrough: &str, want: i32) {
    let _serial = serial();
    require_installed(&[]);
    let mut s = stack(&["--grace-period", "10s", "--passthrough", passthrough]);
    let data = pattern(91, 4 * MIB);
    let direct = mount_gcsfuse_alone(&s.server);
    write_file(&direct.join("r.bin"), &data).unwrap();
    assert_eq!(
        listing(&s.server).get("r.bin"),
        Some(&(data.len() as u64)),
        "the object was not uploaded at close"
    );
    let size = std::fs::metadata(s.m.path("r.bin")).map(|m| m.len());
    assert_eq!(size.ok(), Some(data.len() as u64), "r.bin through drainfs");
    s.server.signal(Signal::SIGSTOP);
    let server = s.server.pid;
    let state = move || proc_status_field(server, "State").unwrap_or_else(|| "gone".into());
    assert!(
        wait_until(Duration::from_secs(5), || state().starts_with('T')),
        "fake-gcs-server (pid {server}) did not stop: {}",
        state()
    );
    // The read waits in gcsfuse for the stopped server.
    let reader = StuckReader::start(&s.m.path("r.bin"))
        .assert_stuck_noting(|| format!("fake-gcs-server pid {server}: {}", state()));
    let t = Instant::now();
    s.trigger_exit_file();
    let code = s.wait_exit(Duration::from_secs(30));
    let took = t.elapsed();
    let sum = s.summary();
    eprintln!("{passthrough}: summary ({took:?} after the exit file): {sum}");
    assert_eq!(code, want, "{}", s.m.proc.stderr_text());
    assert_eq!(sum["forced"], "lower_sigkill", "{sum}");
    assert_eq!(sum["lower_exit"], "signal SIGKILL", "{sum}");
    assert!(
        sum["timings"]["exit_ms"].as_u64().unwrap_or(u64::MAX) < 10_000,
        "past the grace period: {sum}"
    );
    assert!(strings(&sum, "failed_flushes").is_empty(), "{sum}");
    s.server.signal(Signal::SIGCONT);
    let r = reader.join();
    assert!(r.is_err(), "the cut-off read returned {r:?}");
    assert_eq!(
        listing(&s.server).get("r.bin"),
        Some(&(data.len() as u64)),
        "the object changed"
    );
    s.assert_clean_end();
}

#[test]
fn a_read_stuck_in_gcsfuse_served_by_drainfs_is_a_clean_exit() {
    a_read_stuck_in_gcsfuse_at_the_stop("never", 0);
}

#[test]
fn a_read_stuck_in_gcsfuse_by_passthrough_is_75() {
    a_read_stuck_in_gcsfuse_at_the_stop("auto", 75);
}

// ---------------------------------------------------------------- break-r20: the lower's stop

fn bind_mount(src: &std::path::Path, dst: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    let s = std::ffi::CString::new(src.as_os_str().as_bytes()).unwrap();
    let d = std::ffi::CString::new(dst.as_os_str().as_bytes()).unwrap();
    // SAFETY: mount(2) on NUL-terminated paths.
    let r = unsafe {
        libc::mount(
            s.as_ptr(),
            d.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "bind mount: {}", std::io::Error::last_os_error());
}

fn detach(path: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: umount2(2) on a NUL-terminated path.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}

/// A bind mount of the lower elsewhere (another container's view of the same gcsfuse mount,
/// a debugging `mount --bind`): drainfs's own `umount2` of `--lower` succeeds, but the FUSE
/// superblock stays mounted at the bind, so gcsfuse's session does not end by itself. drainfs
/// ends gcsfuse's connection by its number (nothing is outstanding, nobody writes on it), so
/// gcsfuse exits 0 well before the deadline instead of being SIGKILLed at it (exit 75, the
/// grace period spent). The bind is not drainfs's: it stays mounted (its connection ended).
#[test]
fn a_bind_mount_of_the_lower_elsewhere_still_stops_gcsfuse_cleanly() {
    let _serial = serial();
    require_installed(&[]);
    let mut s = stack(&["--grace-period", "10s"]);
    let bind = s.m.dir.path().join("bind");
    std::fs::create_dir_all(&bind).unwrap();
    bind_mount(&s.m.lower, &bind);
    let data = pattern(7, 100_000);
    write_file(&s.m.path("b.bin"), &data).unwrap();
    s.trigger_exit_file();
    let code = s.wait_exit(Duration::from_secs(30));
    let sum = s.summary();
    let bind_left = is_mounted(&bind);
    detach(&bind);
    assert_eq!(
        listing(&s.server).get("b.bin"),
        Some(&(data.len() as u64)),
        "{sum}"
    );
    assert_ne!(
        sum["lower_exit"], "signal SIGKILL",
        "gcsfuse was SIGKILLed: {sum}"
    );
    assert_eq!(code, 0, "nothing was outstanding: {sum}");
    assert!(
        sum["timings"]["exit_ms"].as_u64().unwrap_or(u64::MAX) < 3_000,
        "the stop took most of the grace period: {sum}"
    );
    assert!(
        bind_left,
        "drainfs removed the bind mount it did not make: {sum}"
    );
    assert_eq!(sum["lower_unmount"], "aborted", "{sum}");
    s.assert_clean_end();
}

/// A process writing on the lower directly (not through drainfs) holds a file open there:
/// drainfs's `umount2` gets EBUSY, gcsfuse's own unmount on SIGINT too, and 500 ms later
/// drainfs aborts gcsfuse's FUSE connection "because nothing is outstanding". The writer's
/// object never reaches the bucket, yet drainfs exits 0 (`lower_unmount: "aborted"`).
#[test]
fn a_writer_on_the_lower_directly_is_not_aborted_into_a_clean_exit() {
    let _serial = serial();
    require_installed(&[]);
    let mut s = stack(&["--grace-period", "10s"]);
    let data = pattern(9, 1_000_000);
    let mut f = open(
        &s.m.lower_path("direct.bin"),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        0o644,
    )
    .unwrap();
    f.write_all(&data).unwrap();
    s.trigger_exit_file();
    let code = s.wait_exit(Duration::from_secs(30));
    let sum = s.summary();
    let closed = close(f);
    let got = listing(&s.server).get("direct.bin").copied();
    eprintln!("summary: {sum}; close: {closed:?}; object: {got:?}");
    // drainfs does not end gcsfuse's connection under the writer: it waits, then SIGKILLs
    // gcsfuse at its stop budget and says 75; the writer's close fails, its object is absent.
    assert_eq!(code, 75, "{sum}");
    assert_eq!(sum["lower_exit"], "signal SIGKILL", "{sum}");
    assert!(
        closed.is_err(),
        "close after gcsfuse was killed: {closed:?}"
    );
    assert_eq!(got, None, "{sum}");
    s.assert_clean_end();
}

/// A mount under the lower (a volume bind-mounted at `--lower/sub`): drainfs's `umount2` and
/// gcsfuse's own unmount on SIGINT both get EBUSY, and 500 ms later drainfs aborts the
/// connection and detaches the lower lazily (MNT_DETACH), which takes the volume's bind mount
/// with it: a mount drainfs did not make is removed, and the summary says only
/// `lower_unmount: "aborted"`, exit 0.
#[test]
fn a_bind_mount_under_the_lower_is_not_removed_by_drainfs() {
    let _serial = serial();
    require_installed(&[]);
    let mut s = stack(&["--grace-period", "10s"]);
    std::fs::create_dir_all(s.m.path("sub")).unwrap();
    let vol = s.m.dir.path().join("vol");
    std::fs::create_dir_all(&vol).unwrap();
    std::fs::write(vol.join("v.txt"), b"v").unwrap();
    let sub = s.m.lower_path("sub");
    assert!(
        wait_until(Duration::from_secs(5), || sub.is_dir()),
        "sub is not on the lower"
    );
    bind_mount(&vol, &sub);
    s.trigger_exit_file();
    let code = s.wait_exit(Duration::from_secs(30));
    let sum = s.summary();
    let still = is_mounted(&sub);
    // Clean up whatever is left (the bind, then the lower), whatever the outcome.
    detach(&sub);
    detach(&s.m.lower);
    eprintln!("exit {code}: {sum}");
    assert!(
        still,
        "drainfs removed the volume's bind mount under the lower: {sum}"
    );
}

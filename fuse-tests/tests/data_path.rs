//! Data-path defects, each checked on a real mount against the raw lower: the same scenario
//! runs on a scratch directory of the lower itself and through drainfs, and the results must
//! agree. Scenarios that need a gcsfuse-like lower (release-time upload errors, the lazy
//! unmount, interrupted uploads, probes during the quiet period) run over `bucketfs` and key
//! on drainfs's exit code, its `--summary-file` and the lower's event log.

#[macro_use]
mod common;

use std::ffi::CString;
use std::fs::{self, Permissions};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use fuse_tests::bucket::read_events;
use fuse_tests::fileops::SharedMap;
use fuse_tests::harness::{BucketStack, is_mounted};

both_modes!(
    o_append_with_a_shared_mapping_writes_at_the_pages_offset,
    a_hard_link_stays_reachable_after_the_other_name_is_removed,
    o_trunc_by_an_unprivileged_owner_clears_set_user_id,
    root_with_another_gid_creates_inodes_of_that_gid,
    readdirplus_reports_dot_dot_as_the_parent,
    a_lazy_unmount_still_lets_the_lower_stop_cleanly,
    an_interrupted_close_logs_no_error,
    probes_do_not_restart_the_quiet_period,
);

/// A scratch directory inside the lower (the raw lower's side of a comparison).
fn scratch(m: &Mounted) -> tempfile::TempDir {
    let d = tempfile::tempdir_in(&m.lower).unwrap();
    fs::set_permissions(d.path(), Permissions::from_mode(0o755)).unwrap();
    d
}

/// Opens `p` with O_RDWR|O_APPEND, writes "HELLO" at offset 0 through a shared writable
/// mapping, msyncs, unmaps and closes; returns the file's size and first 5 bytes as seen on
/// `check` (the same file on the lower).
fn append_and_map(p: &Path, check: &Path) -> (u64, Vec<u8>) {
    fs::write(p, vec![b'x'; 4096]).unwrap();
    let f = open(p, libc::O_RDWR | libc::O_APPEND, 0).unwrap();
    // Written, synced and unmapped before the fd is closed.
    let mut map = SharedMap::new(&f, 4096, true);
    map.write_at(0, b"HELLO");
    map.msync();
    map.unmap();
    close(f).unwrap();
    let data = fs::read(check).unwrap();
    (data.len() as u64, data[..5].to_vec())
}

fn o_append_with_a_shared_mapping_writes_at_the_pages_offset(mode: &str) {
    let m = mount(mode, &[]);
    let raw = scratch(&m);
    let want = append_and_map(&raw.path().join("f"), &raw.path().join("f"));
    assert_eq!(
        want,
        (4096, b"HELLO".to_vec()),
        "test assumption: the lower"
    );
    let got = append_and_map(&m.path("f"), &m.lower_path("f"));
    assert_eq!(got, want, "through the mount");
    assert_eq!(fs::read(m.path("f")).unwrap().len(), 4096);
    // Plain appends through an O_APPEND fd still go to the end of the file.
    let f = open(&m.path("f"), libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
    use std::io::Write;
    (&f).write_all(b"tail").unwrap();
    close(f).unwrap();
    let data = fs::read(m.lower_path("f")).unwrap();
    assert_eq!(data.len(), 4100);
    assert_eq!(&data[4096..], b"tail");
}

/// `stat a b; rm b; cat a` for two hard links made on the lower: returns what `cat a` gives.
fn links_scenario(view: &Path, lower: &Path) -> std::io::Result<Vec<u8>> {
    fs::write(lower.join("a"), b"linked").unwrap();
    fs::hard_link(lower.join("a"), lower.join("b")).unwrap();
    let (sa, sb) = (
        fs::metadata(view.join("a")).unwrap(),
        fs::metadata(view.join("b")).unwrap(),
    );
    assert_eq!(sa.ino(), sb.ino());
    fs::remove_file(view.join("b")).unwrap();
    fs::read(view.join("a"))
}

fn a_hard_link_stays_reachable_after_the_other_name_is_removed(mode: &str) {
    let m = mount(mode, &[]);
    let raw = scratch(&m);
    let want = links_scenario(raw.path(), raw.path()).unwrap();
    fs::create_dir(m.lower_path("d")).unwrap();
    let got = links_scenario(&m.path("d"), &m.lower_path("d"));
    assert_eq!(got.unwrap(), want);
    // Attributes through the remaining name (a GETATTR without a handle) too.
    assert_eq!(fs::metadata(m.path("d/a")).unwrap().nlink(), 1);
    // And the same after the other name is renamed away and removed.
    fs::hard_link(m.lower_path("d/a"), m.lower_path("d/c")).unwrap();
    fs::metadata(m.path("d/a")).unwrap();
    fs::metadata(m.path("d/c")).unwrap();
    fs::rename(m.path("d/c"), m.path("d/e")).unwrap();
    fs::remove_file(m.path("d/e")).unwrap();
    assert_eq!(fs::read(m.path("d/a")).unwrap(), b"linked");
}

const USER: u32 = 4242;

/// User USER opens its own files with O_WRONLY|O_TRUNC; returns their modes afterwards.
fn trunc_scenario(dir: &Path) -> Vec<u32> {
    let modes = [0o4755, 0o6755, 0o2755, 0o4700];
    modes
        .iter()
        .enumerate()
        .map(|(i, mode)| {
            let p = dir.join(format!("t{i}"));
            fs::write(&p, b"data").unwrap();
            std::os::unix::fs::chown(&p, Some(USER), Some(USER)).unwrap();
            fs::set_permissions(&p, Permissions::from_mode(*mode)).unwrap();
            let pc = cpath(&p);
            assert_eq!(
                as_user(USER, USER, || try_open(
                    &pc,
                    libc::O_WRONLY | libc::O_TRUNC,
                    0
                )),
                0,
                "open {mode:o} O_TRUNC as its owner"
            );
            assert_eq!(fs::metadata(&p).unwrap().len(), 0);
            fs::metadata(&p).unwrap().mode() & 0o7777
        })
        .collect()
}

fn o_trunc_by_an_unprivileged_owner_clears_set_user_id(mode: &str) {
    let m = mount(mode, &[]);
    let raw = scratch(&m);
    let want = trunc_scenario(raw.path());
    assert_eq!(
        want,
        [0o755, 0o755, 0o755, 0o700],
        "test assumption: the lower"
    );
    let got = trunc_scenario(&m.path(""));
    assert_eq!(got, want, "through the mount");
    for (i, w) in want.iter().enumerate() {
        let l = fs::metadata(m.lower_path(&format!("t{i}"))).unwrap().mode() & 0o7777;
        assert_eq!(l, *w, "t{i} on the lower");
    }
}

const GID: u32 = 4343;

/// A uid-0 process whose gid is GID creates a file, a directory, a fifo and a symlink in
/// `dir`; returns their groups.
fn root_gid_scenario(dir: &Path) -> Vec<u32> {
    let names = ["file", "dir", "fifo", "link"];
    let paths: Vec<CString> = names.iter().map(|n| cpath(&dir.join(n))).collect();
    let target = CString::new("file").unwrap();
    let code = in_child(
        Some(Creds {
            uid: 0,
            gid: GID,
            groups: &[],
        }),
        // SAFETY: raw syscalls on paths prepared before the fork.
        || unsafe {
            let fd = libc::open(paths[0].as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
            if fd < 0 {
                return 10;
            }
            libc::close(fd);
            if libc::mkdir(paths[1].as_ptr(), 0o755) < 0 {
                return 11;
            }
            if libc::mknod(paths[2].as_ptr(), libc::S_IFIFO | 0o644, 0) < 0 {
                return 12;
            }
            if libc::symlink(target.as_ptr(), paths[3].as_ptr()) < 0 {
                return 13;
            }
            0
        },
    );
    assert_eq!(code, 0, "creating as 0:{GID}");
    names
        .iter()
        .map(|n| fs::symlink_metadata(dir.join(n)).unwrap().gid())
        .collect()
}

fn root_with_another_gid_creates_inodes_of_that_gid(mode: &str) {
    let m = mount(mode, &[]);
    let raw = scratch(&m);
    let want = root_gid_scenario(raw.path());
    assert_eq!(want, [GID; 4], "test assumption: the lower");
    fs::create_dir(m.lower_path("d")).unwrap();
    assert_eq!(root_gid_scenario(&m.path("d")), want, "through the mount");
    for n in ["file", "dir", "fifo", "link"] {
        let l = fs::symlink_metadata(m.lower_path(&format!("d/{n}"))).unwrap();
        assert_eq!(l.gid(), GID, "{n} on the lower");
    }
}

/// `(d_ino of ".", d_ino of "..")` of `dir`, read with getdents from offset 0.
fn dot_inos(dir: &Path) -> (u64, u64) {
    let mut d = nix::dir::Dir::open(
        dir,
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    let (mut dot, mut dotdot) = (None, None);
    for e in d.iter() {
        let e = e.unwrap();
        match e.file_name().to_bytes() {
            b"." => dot = Some(e.ino()),
            b".." => dotdot = Some(e.ino()),
            _ => {}
        }
    }
    (dot.expect("."), dotdot.expect(".."))
}

fn readdirplus_reports_dot_dot_as_the_parent(mode: &str) {
    let m = mount(mode, &[]);
    let check = |top: &Path| {
        fs::create_dir_all(top.join("p/c")).ok();
        fs::write(top.join("p/c/f"), b"x").unwrap();
        let (dot, dotdot) = dot_inos(&top.join("p/c"));
        (
            dot == fs::metadata(top.join("p/c")).unwrap().ino(),
            dotdot == fs::metadata(top.join("p")).unwrap().ino(),
        )
    };
    let raw = scratch(&m);
    assert_eq!(
        check(raw.path()),
        (true, true),
        "test assumption: the lower"
    );
    fs::create_dir(m.lower_path("top")).unwrap();
    // A directory not looked up before its listing, and one that was.
    assert_eq!(check(&m.path("top")), (true, true), "through the mount");
    fs::create_dir_all(m.lower_path("fresh/p/c")).unwrap();
    let (dot, dotdot) = dot_inos(&m.path("fresh/p/c"));
    assert_eq!(dot, fs::metadata(m.path("fresh/p/c")).unwrap().ino());
    assert_eq!(dotdot, fs::metadata(m.path("fresh/p")).unwrap().ino());
}

/// Writes through a shared mapping after `close()`: the lower's upload happens when drainfs
/// closes its lower fd at RELEASE, and here it fails. drainfs must count that as a failed
/// flush: exit 75, the file named in the summary, the lower flush error counted.
///
/// Not in `always`: there the mapping is of the lower's own file (the backing file), so the
/// mapping's pages reach the lower after drainfs's RELEASE, exactly as without drainfs.
fn a_release_time_lower_error_is_a_failed_flush(mode: &str) {
    let mut s = over_bucketfs(
        mode,
        &["--fail-upload", "relfail", "--upload-delay", "50ms"],
    );
    fs::write(s.bucket.join("relfail"), vec![b'o'; 4096]).unwrap();
    let f = open(&s.m.path("relfail"), libc::O_RDWR, 0).unwrap();
    let mut map = SharedMap::new(&f, 4096, true);
    close(f).expect("close before any write: nothing to upload");
    map.write_at(0, b"HELLO");
    map.unmap();
    let events = s.events.clone();
    assert!(
        eventually(Duration::from_secs(10), || read_events(&events)
            .iter()
            .any(|e| e.is("upload_failed", "relfail"))),
        "the lower's upload at RELEASE was not attempted"
    );
    s.touch_exit_file();
    let code = s.wait_exit(Duration::from_secs(30));
    assert_eq!(code, 75, "{}", s.m.proc.stderr_text());
    let sum = s.summary();
    let failed = sum["failed_flushes"].as_array().expect("failed_flushes");
    assert!(
        failed
            .iter()
            .any(|f| f.as_str().is_some_and(|f| f.contains("relfail"))),
        "summary: {sum}"
    );
    assert!(
        sum["counts"]["lower_flush_errors"].as_u64().unwrap() >= 1,
        "{sum}"
    );
    assert_eq!(
        fs::read(s.bucket.join("relfail")).unwrap(),
        vec![b'o'; 4096],
        "test assumption: the failed upload kept the old object"
    );
}

mod a_release_time_lower_error_is_a_failed_flush {
    #[test]
    fn never() {
        super::a_release_time_lower_error_is_a_failed_flush("never")
    }

    #[test]
    fn reads() {
        super::a_release_time_lower_error_is_a_failed_flush("reads")
    }
}

/// A process keeps its cwd inside the mount, so drainfs's unmount becomes a lazy detach. The
/// lower must still unmount and exit by itself (not be SIGKILLed), and drainfs exit 0 soon.
fn a_lazy_unmount_still_lets_the_lower_stop_cleanly(mode: &str) {
    let mut s = over_bucketfs(mode, &[]);
    fs::write(s.m.path("f"), b"data").unwrap();
    let mut holder = Command::new("sleep")
        .arg("60")
        .current_dir(s.m.path(""))
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    s.touch_exit_file();
    let code = s.wait_exit(Duration::from_secs(30));
    let took = t0.elapsed();
    eprintln!("{mode}: drainfs exited {took:?} after the exit file");
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(code, 0, "{}", s.m.proc.stderr_text());
    // Quick when idle (well under a second); stuck on the lazy detach, it would wait for the
    // lower until its budget near the 30 s grace period. Loose for a loaded machine.
    assert!(
        took < Duration::from_secs(10),
        "drainfs took {took:?} to exit"
    );
    let ev = read_events(&s.events);
    assert!(
        ev.iter().any(|e| e.event == "exit"),
        "the lower did not exit by itself: {ev:?}"
    );
    assert!(!is_mounted(&s.m.lower), "lower mount left behind");
    assert_eq!(fs::read(s.bucket.join("f")).unwrap(), b"data");
}

/// drainfs's JSON log lines at ERROR severity.
fn error_lines(m: &Mounted) -> Vec<String> {
    m.proc
        .stderr_lines()
        .into_iter()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .is_some_and(|v| v["severity"] == "ERROR")
        })
        .collect()
}

extern "C" fn ignore_signal(_: libc::c_int) {}

/// A process blocked in `close()` on a slow upload gets signals (each interrupts the FLUSH,
/// which the kernel then forwards as FUSE_INTERRUPT). Nothing fails, so no ERROR line.
///
/// The signals go once the upload has started (the lower's event log), not after a fixed
/// 200 ms; and SIGUSR1 is blocked across the fork until the child's handler is in place, so
/// that a child a loaded machine runs late is not killed by a signal that came first.
fn an_interrupted_close_logs_no_error(mode: &str) {
    let mut s = fuse_tests::harness::over_bucketfs(
        &["--passthrough", mode, "--log-format", "json"],
        &["--upload-delay", "1500ms"],
        true,
    );
    let p = cpath(&s.m.path("slow"));
    let mut usr1 = nix::sys::signal::SigSet::empty();
    usr1.add(nix::sys::signal::Signal::SIGUSR1);
    let mut old_mask = nix::sys::signal::SigSet::empty();
    nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_BLOCK,
        Some(&usr1),
        Some(&mut old_mask),
    )
    .unwrap();
    // SAFETY: the child makes raw syscalls on data prepared before the fork and leaves with
    // _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = ignore_signal as *const () as usize;
            libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
            let mut unblock: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut unblock);
            libc::sigaddset(&mut unblock, libc::SIGUSR1);
            libc::sigprocmask(libc::SIG_UNBLOCK, &unblock, std::ptr::null_mut());
            let fd = libc::open(p.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
            if fd < 0 {
                libc::_exit(10);
            }
            if libc::write(fd, b"data".as_ptr().cast(), 4) != 4 {
                libc::_exit(11);
            }
            libc::_exit(if libc::close(fd) == 0 { 0 } else { 12 });
        }
    }
    nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&old_mask),
        None,
    )
    .unwrap();
    assert!(pid > 0);
    let uploading = fuse_tests::harness::wait_until(Duration::from_secs(10), || {
        read_events(&s.events)
            .iter()
            .any(|e| e.is("upload_start", "slow"))
    });
    if !uploading {
        // SAFETY: our own child, then waited for.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        panic!("the close's FLUSH never reached the lower");
    }
    // Inside the 1.5 s upload: five signals, 200 ms apart.
    for _ in 0..5 {
        // SAFETY: signals our own child.
        unsafe { libc::kill(pid, libc::SIGUSR1) };
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status:#x}"
    );
    assert_eq!(fs::read(s.bucket.join("slow")).unwrap(), b"data");
    s.touch_exit_file();
    assert_eq!(s.wait_exit(Duration::from_secs(30)), 0);
    let lines = s.m.proc.stderr_lines().len();
    assert!(lines > 3, "JSON log lines were captured");
    let errors = error_lines(&s.m);
    assert!(
        errors.is_empty(),
        "ERROR lines in a run where nothing failed: {errors:#?}"
    );
}

/// `/livez` statfs's through the mount; probing it all through the quiet period after a
/// SIGTERM must not restart the quiet period.
fn probes_do_not_restart_the_quiet_period(mode: &str) {
    let mut m = mount(
        mode,
        &[
            "--admin-addr",
            &free_addr("127.0.0.1"),
            "--quiet-period",
            "1s",
        ],
    );
    let base = admin_base(&m);
    let agent = ureq::Agent::new_with_defaults();
    let live = |agent: &ureq::Agent| {
        agent
            .get(format!("{base}/livez"))
            .call()
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    };
    assert_eq!(live(&agent), 200);
    let t0 = Instant::now();
    m.proc.signal(nix::sys::signal::Signal::SIGTERM);
    let mut exited = None;
    // Probed for 12 s: with the probes restarting the quiet period, drainfs would still be
    // serving at the end.
    while t0.elapsed() < Duration::from_secs(12) {
        live(&agent);
        if let Some(st) = m.proc.wait_timeout(Duration::from_millis(50)) {
            exited = Some(st);
            break;
        }
    }
    let took = t0.elapsed();
    let st = exited.unwrap_or_else(|| panic!("drainfs still running after {took:?}"));
    assert_eq!(st.code(), Some(0));
    // About 1 s when idle; the bound is loose so that a loaded machine does not fail it.
    assert!(
        took < Duration::from_secs(6),
        "quiet period 1s, drainfs exited after {took:?}"
    );
}

/// Writes `tag` through a shared mapping of `path` made before `close()`, after the close, then
/// unmaps it (raw `mmap`: the mapping holds no fd of its own). With `released`, the write
/// waits until `released()` says drainfs has handled the RELEASE.
fn write_through_a_mapping_after_close(
    path: &Path,
    tag: &[u8],
    released: Option<&dyn Fn() -> bool>,
) {
    let f = open(path, libc::O_RDWR, 0).unwrap();
    let mut map = SharedMap::new(&f, 4096, true);
    close(f).expect("close before any write: nothing to upload");
    if let Some(released) = released {
        assert!(
            eventually(Duration::from_secs(10), released),
            "drainfs never released the handle"
        );
    }
    map.write_at(0, tag);
    map.unmap();
}

/// bucketfs under drainfs with `--passthrough mode` and a control socket, and a check that
/// no file is open for writing (drainfs handled every writer's RELEASE).
fn over_bucketfs_with_status(
    mode: &str,
    bucketfs_args: &[&str],
) -> (BucketStack, tempfile::TempDir, std::path::PathBuf) {
    let ctl = tempfile::tempdir_in("/tmp").unwrap();
    let sock = ctl.path().join("ctl.sock");
    let sock_arg = sock.display().to_string();
    let s = fuse_tests::harness::over_bucketfs(
        &["--passthrough", mode, "--control-socket", &sock_arg],
        bucketfs_args,
        true,
    );
    (s, ctl, sock)
}

fn no_writer_open(sock: &Path) -> bool {
    status(sock).is_some_and(|v| v["outstanding"]["open_write"] == 0)
}

/// With kernel passthrough for writers (`always`, and `auto` on bucketfs), a shared mapping
/// holds the kernel's backing file: drainfs gets FLUSH and RELEASE at `close()`, before the
/// mapping's writes, which then reach the lower straight from the backing file with no FLUSH
/// after them (bucketfs, like gcsfuse, would never upload them). drainfs keeps the released
/// writer's lower fd and closes it at the teardown: the change reaches the bucket, exit 0.
///
/// The write waits until drainfs has handled the RELEASE (otherwise the race between the
/// application's write and drainfs's worker decides). `never`: the mapping holds drainfs's
/// file, so RELEASE comes at `munmap`, after the WRITE drainfs serves.
fn a_mapping_written_after_close_reaches_the_bucket(mode: &str) {
    let (mut s, _ctl, sock) = over_bucketfs_with_status(mode, &[]);
    fs::write(s.bucket.join("mapped"), vec![b'o'; 4096]).unwrap();
    let released = || no_writer_open(&sock);
    let wait: Option<&dyn Fn() -> bool> = (mode != "never").then_some(&released);
    write_through_a_mapping_after_close(&s.m.path("mapped"), b"AFTER", wait);
    s.touch_exit_file();
    let code = s.wait_exit(Duration::from_secs(30));
    assert_eq!(code, 0, "{}", s.m.proc.stderr_text());
    let mut want = vec![b'o'; 4096];
    want[..5].copy_from_slice(b"AFTER");
    assert_eq!(
        fs::read(s.bucket.join("mapped")).unwrap(),
        want,
        "the mapping's write after close() is not in the bucket"
    );
    assert!(!is_mounted(&s.m.mnt) && !is_mounted(&s.m.lower));
}

/// The same, with the lower's upload failing: the file is a failed flush, exit 75.
fn a_mapping_written_after_close_that_fails_to_upload_is_a_failed_flush(mode: &str) {
    let (mut s, _ctl, sock) = over_bucketfs_with_status(mode, &["--fail-upload", "mapfail"]);
    fs::write(s.bucket.join("mapfail"), vec![b'o'; 4096]).unwrap();
    let released = || no_writer_open(&sock);
    write_through_a_mapping_after_close(&s.m.path("mapfail"), b"AFTER", Some(&released));
    s.touch_exit_file();
    let code = s.wait_exit(Duration::from_secs(30));
    assert_eq!(code, 75, "{}", s.m.proc.stderr_text());
    let sum = s.summary();
    let failed = sum["failed_flushes"].as_array().expect("failed_flushes");
    assert!(
        failed
            .iter()
            .any(|f| f.as_str().is_some_and(|f| f.contains("mapfail"))),
        "summary: {sum}"
    );
    assert_eq!(
        fs::read(s.bucket.join("mapfail")).unwrap(),
        vec![b'o'; 4096]
    );
}

mod a_mapping_written_after_close_reaches_the_bucket {
    #[test]
    fn always() {
        super::a_mapping_written_after_close_reaches_the_bucket("always")
    }

    #[test]
    fn auto() {
        super::a_mapping_written_after_close_reaches_the_bucket("auto")
    }

    #[test]
    fn never() {
        super::a_mapping_written_after_close_reaches_the_bucket("never")
    }
}

mod a_mapping_written_after_close_that_fails_to_upload_is_a_failed_flush {
    #[test]
    fn always() {
        super::a_mapping_written_after_close_that_fails_to_upload_is_a_failed_flush("always")
    }

    #[test]
    fn auto() {
        super::a_mapping_written_after_close_that_fails_to_upload_is_a_failed_flush("auto")
    }
}

//! End-to-end tests of `drainfs relay`, run the way GKE's CSI driver runs gcsfuse: the fake node
//! driver mounts with `fd=N` and hands the connection to an unprivileged sidecar (uid 65534, no
//! capabilities), which is `drainfs relay --socket-buffer 212992 -- DAEMON ... /dev/fd/3`.
//! Daemons: `bucketfs` (gcsfuse-like, fuser `Session::from_fd`, asks for 16 MiB writes) and
//! `fuse-overlayfs` (libfuse 3, nobody's here). The baseline is the same daemon holding the
//! kernel fd itself. Every test keys on state: exit codes, the fake driver's status line,
//! bucket contents, `/status`.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fuse_tests::bucket::{read_events, wait_for_event};
use fuse_tests::fileops::{SharedMap, close, errno_name, names, pattern, show, write_file};
use fuse_tests::harness::{is_mounted, wait_until};
use fuse_tests::mounts::Fusectl;
use fuse_tests::relay::{Daemon, Sidecar, Via, find_key, pid_exists, proc_status_field};

/// The relay with no extra options.
fn relay() -> Via {
    Via::Relay(Vec::new())
}

/// A C string of a path.
fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// `setxattr(2)`.
fn setxattr(p: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let (p, n) = (cpath(p), CString::new(name).unwrap());
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `getxattr(2)` into a 4 KiB buffer.
fn getxattr(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    let (p, n) = (cpath(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let rc = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(rc as usize);
    Ok(buf)
}

/// `listxattr(2)` into a 4 KiB buffer, names sorted.
fn listxattr(p: &Path) -> io::Result<Vec<String>> {
    let p = cpath(p);
    let mut buf = vec![0u8; 4096];
    // SAFETY: a valid NUL-terminated string and a buffer of the given length.
    let rc = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(rc as usize);
    let mut names: Vec<String> = buf
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// The same file-operation script, run on a mount; one result line per step (values, or the
/// errno name). Inode numbers, owners and times are left out: they legitimately differ.
fn script(root: &Path) -> Vec<String> {
    let d = root.join("d");
    let f = d.join("f");
    let g = d.join("g");
    let h = d.join("h");
    let big = pattern(300 * 1024, 7);
    let mut out = Vec::new();
    let mut step = |name: &str, r: String| out.push(format!("{name}: {r}"));
    step("mkdir d", show(fs::create_dir(&d)));
    step("mkdir d again", show(fs::create_dir(&d)));
    step("write f", show(write_file(&f, b"hello world")));
    step("read f", show(fs::read_to_string(&f)));
    step(
        "stat f",
        show(fs::metadata(&f).map(|m| (m.is_file(), m.len(), m.mode() & 0o777))),
    );
    step(
        "append f",
        show(
            OpenOptions::new()
                .append(true)
                .open(&f)
                .and_then(|mut x| x.write_all(b", again").and_then(|()| close(x))),
        ),
    );
    step("read f again", show(fs::read_to_string(&f)));
    step("rename f g", show(fs::rename(&f, &g)));
    step("read f after rename", show(fs::read(&f)));
    step("read g", show(fs::read_to_string(&g)));
    step("write h (300 KiB)", show(write_file(&h, &big)));
    step("read h equals", show(fs::read(&h).map(|x| x == big)));
    step(
        "truncate h",
        show(
            OpenOptions::new()
                .write(true)
                .open(&h)
                .and_then(|x| x.set_len(1000).and_then(|()| close(x))),
        ),
    );
    step("stat h", show(fs::metadata(&h).map(|m| m.len())));
    step("readdir d", show(names(&d)));
    step("setxattr g", show(setxattr(&g, "user.k", b"v")));
    step("getxattr g", show(getxattr(&g, "user.k")));
    step("listxattr g", show(listxattr(&g)));
    step("getxattr missing", show(getxattr(&g, "user.missing")));
    step("unlink g", show(fs::remove_file(&g)));
    step("unlink g again", show(fs::remove_file(&g)));
    step("rmdir d (not empty)", show(fs::remove_dir(&d)));
    step("unlink h", show(fs::remove_file(&h)));
    step("rmdir d", show(fs::remove_dir(&d)));
    step("open missing", show(File::open(root.join("missing"))));
    step("readdir root", show(names(root)));
    step(
        "statfs",
        show(
            nix::sys::statvfs::statvfs(root)
                .map(|_| ())
                .map_err(io::Error::from),
        ),
    );
    out
}

/// Runs [`script`] over `daemon` directly and through the relay and asserts identical results.
fn parity(daemon: Daemon) {
    let run = |via: Via| {
        let mut s = Sidecar::start(daemon.clone(), via);
        let lines = script(&s.mnt);
        s.stop(Duration::from_secs(15));
        lines
    };
    let direct = run(Via::Direct);
    let relayed = run(relay());
    assert!(
        direct
            .iter()
            .any(|l| l == "read f again: \"hello world, again\""),
        "the script itself failed on the direct connection: {direct:#?}"
    );
    for (a, b) in direct.iter().zip(&relayed) {
        assert_eq!(a, b, "direct vs relay differ");
    }
    assert_eq!(direct.len(), relayed.len());
}

/// Waits until the relay's `/status` says nothing is in flight; returns the last document.
fn wait_idle(s: &Sidecar, timeout: Duration) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    let idle = wait_until(timeout, || {
        last = s.status();
        last["outstanding"]["in_flight"].as_i64() == Some(0)
    });
    assert!(idle, "in-flight did not go back to 0: {last:#}");
    last
}

/// Waits until the relay's `/status` has a READ in flight (in the daemon's slow read): the
/// state a signal or a kill must find, which a fixed sleep after starting the reader only
/// guesses (a loaded machine can start the reader later).
fn wait_read_in_flight(s: &Sidecar) {
    let reading = wait_until(Duration::from_secs(10), || {
        s.status()["in_flight_by_op"].as_array().is_some_and(|ops| {
            ops.iter()
                .any(|o| o[0] == "read" && o[1].as_i64() > Some(0))
        })
    });
    assert!(reading, "no READ in flight: {:#}", s.status());
}

/// Runs `f` on another thread and returns its result, or `None` if it takes longer than
/// `timeout` (the thread is left behind, blocked).
fn within<T: Send + 'static>(
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(timeout).ok()
}

// ------------------------------------------------------------------------------------------
// Baseline: the daemon on the kernel fd, as in GKE today.

#[test]
fn baseline_direct_bucketfs_serves_and_is_sigkilled_after_5s() {
    let mut s = Sidecar::start(Daemon::Bucketfs(Vec::new()), Via::Direct);
    let data = pattern(4096, 1);
    write_file(&s.path("a.bin"), &data).unwrap();
    assert_eq!(fs::read(s.path("a.bin")).unwrap(), data);
    assert_eq!(
        fs::read(s.store.join("a.bin")).unwrap(),
        data,
        "uploaded on close"
    );
    assert_eq!(
        proc_status_field(s.sidecar_pid(), "Uid").unwrap(),
        "65534\t65534\t65534\t65534"
    );
    assert_eq!(
        proc_status_field(s.sidecar_pid(), "CapEff").unwrap(),
        "0000000000000000"
    );

    let e = s.stop(Duration::from_secs(15));
    eprintln!("baseline stop: {e}");
    // gcsfuse (and bucketfs) on a /dev/fd/N mount ignore SIGTERM: the sidecar kills them 5 s later.
    assert!(e.sigkill_sent, "{e}");
    assert_eq!(e.signal.as_deref(), Some("SIGKILL"), "{e}");
    let ms = e.ms_after_stop.unwrap();
    assert!((4900..7000).contains(&ms), "{e}");
    s.assert_nothing_left();
}

// ------------------------------------------------------------------------------------------
// Through the relay.

#[test]
fn parity_bucketfs() {
    parity(Daemon::Bucketfs(Vec::new()));
}

#[test]
fn parity_overlay() {
    parity(Daemon::Overlay);
}

#[test]
fn relay_runs_unprivileged_and_the_daemon_never_holds_dev_fuse() {
    let mut s = Sidecar::start(Daemon::Bucketfs(Vec::new()), relay());
    let (relay_pid, daemon) = (s.sidecar_pid(), s.daemon_pid());
    assert_ne!(
        relay_pid, daemon,
        "the relay must run the daemon as its child"
    );
    assert_eq!(
        proc_status_field(relay_pid, "Uid").unwrap(),
        "65534\t65534\t65534\t65534"
    );
    assert_eq!(
        proc_status_field(relay_pid, "CapEff").unwrap(),
        "0000000000000000"
    );
    let mut fuse_fds = Vec::new();
    for fd in fs::read_dir(format!("/proc/{daemon}/fd"))
        .unwrap()
        .flatten()
    {
        let target = fs::read_link(fd.path()).unwrap_or_default();
        if target == Path::new("/dev/fuse") {
            fuse_fds.push(fd.file_name());
        }
    }
    assert!(
        fuse_fds.is_empty(),
        "the daemon holds /dev/fuse: {fuse_fds:?}"
    );
    let fd3 = fs::read_link(format!("/proc/{daemon}/fd/3")).unwrap();
    assert!(
        fd3.to_string_lossy().starts_with("socket:"),
        "daemon fd 3 is {fd3:?}"
    );
    let fdinfo = fs::read_to_string(format!("/proc/{daemon}/fdinfo/3")).unwrap();
    let flags = fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
        .unwrap();
    assert_eq!(
        flags & libc::O_NONBLOCK as u32,
        0,
        "the daemon's socket must be blocking"
    );

    let st = s.status();
    assert_eq!(st["data_path"], "relay", "{st:#}");
    // fuser asks for 16 MiB writes. The kernel gets 1 MiB (the relay splits larger READs and
    // WRITEs), while every message the daemon sends (the relay's cap) fits one datagram of the
    // socket the relay obtained (SO_SNDBUF 212992, doubled by the kernel).
    let num = |key: &str| {
        find_key(&st, key)
            .and_then(|v| v.as_u64())
            .unwrap_or_else(|| panic!("no {key} in /status: {st:#}"))
    };
    assert_eq!(num("max_write"), 1 << 20, "{st:#}");
    assert_eq!(num("kernel_cap"), 1 << 20, "{st:#}");
    let cap = st["relay"]["cap"]
        .as_u64()
        .unwrap_or_else(|| panic!("no relay.cap in /status: {st:#}"));
    assert!(
        (4096..=2 * 212_992).contains(&cap),
        "the daemon's cap {cap} does not fit the socket: {st:#}"
    );
    assert!((cap..=2 * 212_992).contains(&num("write_part")), "{st:#}");

    let e = s.stop(Duration::from_secs(15));
    assert_eq!(e.code, Some(0), "{e}");
    s.assert_nothing_left();
}

/// 64 MiB written in 1 MiB writes and read back through the relay, compared with the data
/// and with what the daemon stored: every WRITE and READ crosses the socket in pieces that fit.
fn large_write_read(daemon: Daemon) {
    let mut s = Sidecar::start(daemon, relay());
    let data = pattern(64 << 20, 42);
    let path = s.path("big.bin");
    let mut f = File::create(&path).unwrap();
    for chunk in data.chunks(1 << 20) {
        f.write_all(chunk).unwrap();
    }
    f.sync_all().unwrap();
    close(f).unwrap();
    let mut back = Vec::with_capacity(data.len());
    File::open(&path).unwrap().read_to_end(&mut back).unwrap();
    assert!(back == data, "read back through the relay differs");
    let stored = fs::read(s.store.join("big.bin")).unwrap();
    assert!(stored == data, "the daemon's stored copy differs");
    wait_idle(&s, Duration::from_secs(5));
    let e = s.stop(Duration::from_secs(15));
    assert!(!e.sigkill_sent, "{e}");
    s.assert_nothing_left();
}

#[test]
fn large_write_read_64mib_bucketfs() {
    large_write_read(Daemon::Bucketfs(Vec::new()));
}

#[test]
fn large_write_read_64mib_overlay() {
    large_write_read(Daemon::Overlay);
}

#[test]
fn interrupts_during_a_slow_read() {
    let mut s = Sidecar::start(
        Daemon::Bucketfs(vec![
            "--slow-read".into(),
            "slow".into(),
            "--read-delay".into(),
            "2s".into(),
        ]),
        relay(),
    );
    let data = pattern(100_000, 3);
    fs::write(s.store.join("slow.bin"), &data).unwrap();
    fs::write(s.store.join("fast.bin"), b"fast").unwrap();

    // A handled signal: the kernel sends INTERRUPT; the read still completes with all the data.
    let mut reader = Command::new("python3")
        .args([
            "-c",
            "import signal, sys\n\
             signal.signal(signal.SIGUSR1, lambda *a: None)\n\
             print('armed', flush=True)\n\
             d = open(sys.argv[1], 'rb').read()\n\
             print(len(d))",
        ])
        .arg(s.path("slow.bin"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(reader.stdout.take().unwrap());
    let mut armed = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut armed).unwrap();
    assert_eq!(armed.trim(), "armed");
    wait_read_in_flight(&s);
    let pid = nix::unistd::Pid::from_raw(reader.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR1).unwrap();
    let (status, rest) = within(Duration::from_secs(10), move || {
        let mut rest = String::new();
        let _ = stdout.read_to_string(&mut rest);
        (reader.wait(), rest)
    })
    .expect("the interrupted read hangs");
    assert!(status.as_ref().unwrap().success(), "{status:?}");
    assert_eq!(rest.trim(), data.len().to_string());

    // A fatal signal: the reader dies; the relay's books still balance. SIGINT's default
    // action is set in the child: a test run started in the background by a non-interactive
    // shell (`scripts/test-under-load.sh &`) inherits SIGINT ignored, and an exec keeps that,
    // so `cat` read its 2 s and exited 0.
    let mut cat = Command::new("cat");
    cat.arg(s.path("slow.bin")).stdout(Stdio::null());
    // SAFETY: only signal(2), async-signal-safe, between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cat, || {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut cat = cat.spawn().unwrap();
    wait_read_in_flight(&s);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(cat.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let st = within(Duration::from_secs(10), move || cat.wait())
        .expect("the killed reader hangs")
        .unwrap();
    assert!(!st.success(), "{st:?}");

    wait_idle(&s, Duration::from_secs(5));
    assert_eq!(fs::read(s.path("fast.bin")).unwrap(), b"fast");
    let e = s.stop(Duration::from_secs(15));
    assert_eq!(e.code, Some(0), "{e}");
    s.assert_nothing_left();
}

#[test]
fn batch_forget_flood() {
    let mut s = Sidecar::start(Daemon::Bucketfs(Vec::new()), relay());
    // 20 000 objects, created in the bucket directly, then looked up through the mount so that
    // the kernel holds 20 000 inodes; dropping the caches forgets them in BATCH_FORGETs.
    for d in 0..20 {
        let dir = s.store.join(format!("d{d:02}"));
        fs::create_dir(&dir).unwrap();
        for i in 0..1000 {
            fs::write(dir.join(format!("f{i:04}")), b"x").unwrap();
        }
    }
    let mut seen = 0;
    for d in 0..20 {
        let dir = s.path(&format!("d{d:02}"));
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            assert_eq!(fs::metadata(e.path()).unwrap().len(), 1);
            seen += 1;
        }
    }
    assert_eq!(seen, 20_000);
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    let st = wait_idle(&s, Duration::from_secs(10));
    eprintln!("after the flood: {}", st["outstanding"]);

    write_file(&s.path("after.txt"), b"still here").unwrap();
    assert_eq!(fs::read(s.path("after.txt")).unwrap(), b"still here");
    assert_eq!(fs::read(s.path("d07/f0123")).unwrap(), b"x");
    assert!(pid_exists(s.daemon_pid()));
    let e = s.stop(Duration::from_secs(15));
    assert_eq!(e.code, Some(0), "{e}");
    // The flood really went through the relay (otherwise this test proves nothing).
    let summary: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&s.summary).unwrap()).unwrap();
    let forgets = find_key(&summary, "forgets").and_then(|v| v.as_u64());
    assert!(
        forgets.is_some_and(|n| n > 0),
        "no forgets relayed: {summary:#}"
    );
    s.assert_nothing_left();
}

#[test]
fn idle_stop_is_fast_and_clean() {
    let mut s = Sidecar::start(Daemon::Bucketfs(Vec::new()), relay());
    write_file(&s.path("done.txt"), b"done").unwrap();
    wait_idle(&s, Duration::from_secs(5));
    let e = s.stop(Duration::from_secs(15));
    eprintln!("idle stop: {e}");
    assert_eq!(e.code, Some(0), "{e}");
    assert!(!e.sigkill_sent, "{e}");
    // Target: under 20 ms from SIGTERM to daemon exit; the bound here leaves room for a loaded
    // test machine (which runs the driver, the relay and the daemon late, one after the
    // other: 500 ms was within reach), well short of the driver's SIGKILL at 5 s.
    assert!(e.ms_after_stop.unwrap() < 2000, "{e}");
    assert!(read_events(&s.events).iter().any(|ev| ev.event == "exit"));
    assert_eq!(fs::read(s.store.join("done.txt")).unwrap(), b"done");
    s.assert_nothing_left();
}

#[test]
fn drain_waits_for_a_slow_flush() {
    let mut s = Sidecar::start(
        Daemon::Bucketfs(vec!["--upload-delay".into(), "2s".into()]),
        relay(),
    );
    let data = pattern(1 << 20, 9);
    let mut f = File::create(s.path("out.bin")).unwrap();
    f.write_all(&data).unwrap();
    let closer = std::thread::spawn(move || {
        let t = Instant::now();
        let r = close(f);
        (r.map_err(|e| errno_name(&e)), t.elapsed())
    });
    wait_for_event(&s.events, Duration::from_secs(5), |e| {
        e.is("upload_start", "out.bin")
    })
    .expect("the FLUSH reached the daemon");
    let newfile = s.path("new.txt");
    let admin = s.admin.clone().expect("the relay's admin server");
    // The create comes once the door has closed (`/status`), not a fixed 300 ms after the
    // stop began, which a loaded machine can outrun (the driver's SIGTERM, then the relay's).
    let opener = std::thread::spawn(move || {
        let closed = wait_until(Duration::from_secs(10), || {
            fuse_tests::relay::http_get(&format!("{admin}/status"))
                .ok()
                .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
                .is_some_and(|v| v["phase"] == "door_closed")
        });
        assert!(closed, "the door did not close");
        File::create(&newfile)
            .map(|_| ())
            .map_err(|e| errno_name(&e))
    });

    let e = s.stop(Duration::from_secs(15));
    eprintln!("drain stop: {e}");
    let (closed, took) = closer.join().unwrap();
    assert_eq!(closed, Ok(()), "close() during the drain");
    assert!(took >= Duration::from_millis(1500), "close took {took:?}");
    assert_eq!(
        opener.join().unwrap(),
        Err("ESHUTDOWN".to_string()),
        "a new create while draining"
    );
    assert!(
        fs::read(s.store.join("out.bin")).unwrap() == data,
        "the object is not complete"
    );
    assert!(!s.store.join("new.txt").exists());
    assert!(!e.sigkill_sent, "{e}");
    assert_eq!(e.code, Some(0), "{e}");
    assert!(e.ms_after_stop.unwrap() < 5000, "{e}");
    assert!(read_events(&s.events).iter().any(|ev| ev.event == "exit"));
    s.assert_nothing_left();
}

/// A scratch file the sidecar's uid may write, for `--termination-log` (the relay writes it in
/// place, as Kubernetes' bind-mounted `/dev/termination-log`); the directory is returned too.
fn termination_log() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = fuse_tests::harness::scratch_dir("/tmp", "drainfs-tlog-");
    fuse_tests::relay::sidecar_dir(dir.path());
    let p = dir.path().join("termination-log");
    (dir, p)
}

/// The termination log's JSON (`Null` while it is missing or not JSON yet).
fn read_json(p: &Path) -> serde_json::Value {
    fs::read_to_string(p)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// Writes 1 MiB to `rel` and closes it on a thread of its own (the close waits for the
/// daemon's upload); waits until the FLUSH reached the daemon. The thread returns the close's
/// result.
fn close_while_uploading(s: &Sidecar, rel: &str) -> std::thread::JoinHandle<Result<(), String>> {
    let mut f = File::create(s.path(rel)).unwrap();
    f.write_all(&pattern(1 << 20, 5)).unwrap();
    let closer = std::thread::spawn(move || close(f).map_err(|e| errno_name(&e)));
    wait_for_event(&s.events, Duration::from_secs(5), |e| {
        e.is("upload_start", rel)
    })
    .expect("the FLUSH reached the daemon");
    closer
}

/// bucketfs taking `upload_delay` per upload, behind a relay with `--grace-period grace` and
/// `--termination-log tlog`.
fn slow_relay(upload_delay: &str, grace: &str, tlog: &Path) -> Sidecar {
    Sidecar::start(
        Daemon::Bucketfs(vec!["--upload-delay".into(), upload_delay.into()]),
        Via::Relay(vec![
            "--grace-period".into(),
            grace.into(),
            "--termination-log".into(),
            tlog.display().to_string(),
        ]),
    )
}

/// While the relay drains, its termination log holds a provisional summary (`stopping`,
/// exit_code 75, the file whose close is uploading named); the relay's final summary replaces
/// it when the drain ends.
#[test]
fn a_relay_keeps_a_provisional_summary_while_it_drains_and_replaces_it_at_its_exit() {
    let (_d, tlog) = termination_log();
    // The upload takes 4 s, inside the relay's deadline (30 s): the drain ends by itself.
    let mut s = slow_relay("4s", "30s", &tlog);
    let closer = close_while_uploading(&s, "slow.bin");
    let relay_pid = s.sidecar_pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(relay_pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let provisional = fuse_tests::wait::wait_for(Duration::from_millis(3500), || {
        let v = read_json(&tlog);
        (v["outcome"] == "stopping").then_some(v)
    })
    .unwrap_or_else(|| panic!("no provisional summary: {:#}", read_json(&tlog)));
    assert_eq!(provisional["exit_code"], 75, "{provisional:#}");
    assert_eq!(provisional["pid"], relay_pid, "{provisional:#}");
    let open = provisional["open_paths"].as_array().unwrap();
    assert!(
        open.iter()
            .any(|p| p.as_str().unwrap().ends_with("slow.bin")),
        "{provisional:#}"
    );
    let e = s.wait(Duration::from_secs(15));
    assert_eq!(closer.join().unwrap(), Ok(()), "close() during the drain");
    assert_eq!(e.code, Some(0), "{e}");
    let last = read_json(&tlog);
    assert_eq!(
        (last["outcome"].as_str(), last["exit_code"].as_i64()),
        (Some("clean"), Some(0)),
        "{last:#}"
    );
    assert_eq!(
        fs::read(s.store.join("slow.bin")).unwrap(),
        pattern(1 << 20, 5)
    );
    s.assert_nothing_left();
}

/// A relay SIGKILLed in the middle of its drain (here the driver's SIGKILL 5 s after its
/// SIGTERM, before the relay's own 60 s deadline; under the kubelet, the 2 s a native sidecar
/// gets when the workload used up the grace period) leaves its provisional summary: the
/// termination message says the stop did not finish and names the file still uploading.
#[test]
fn a_relay_killed_while_draining_leaves_a_provisional_summary_naming_the_file() {
    let (_d, tlog) = termination_log();
    let mut s = slow_relay("60s", "60s", &tlog);
    let closer = close_while_uploading(&s, "stuck.bin");
    let relay_pid = s.sidecar_pid();
    let e = s.stop(Duration::from_secs(20));
    assert!(
        e.sigkill_sent && e.signal.as_deref() == Some("SIGKILL"),
        "{e}"
    );
    let closed = closer.join().unwrap();
    assert!(closed.is_err(), "the close of an upload cut off succeeded");
    let v = read_json(&tlog);
    assert_eq!(
        (
            v["outcome"].as_str(),
            v["exit_code"].as_i64(),
            v["pid"].as_i64()
        ),
        (Some("stopping"), Some(75), Some(i64::from(relay_pid))),
        "{v:#}"
    );
    assert!(
        v["open_paths"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().ends_with("stuck.bin")),
        "{v:#}"
    );
    assert!(
        v["outstanding_at_force"]["open_write"].as_i64() >= Some(1),
        "{v:#}"
    );
    assert!(
        !s.summary.exists(),
        "a killed relay wrote its final summary"
    );
    s.assert_nothing_left();
}

/// Two relays of one pod (one per volume) share the termination log and are SIGTERMed at
/// once, as GKE's sidecar mounter does: A is idle and stops clean at once, B's close is
/// uploading. While B stops, and after it is SIGKILLed mid-drain, the file must name B's
/// unfinished stop, whatever order the two wrote in (a newcomer saw "clean" in it for 4.5 s
/// while B cut off a file).
#[test]
fn two_relays_sharing_a_termination_log_never_leave_it_clean_while_one_is_stuck() {
    let (_d, tlog) = termination_log();
    let mut a = Sidecar::start(
        Daemon::Bucketfs(Vec::new()),
        Via::Relay(vec!["--termination-log".into(), tlog.display().to_string()]),
    );
    let mut b = slow_relay("60s", "60s", &tlog);
    write_file(&a.path("done.txt"), b"done").unwrap();
    wait_idle(&a, Duration::from_secs(5));
    let closer = close_while_uploading(&b, "stuck.bin");
    let (pa, pb) = (a.sidecar_pid(), b.sidecar_pid());
    for pid in [pa, pb] {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
    }
    let ea = a.wait(Duration::from_secs(15));
    assert_eq!(ea.code, Some(0), "{ea}");
    // A has exited clean; B is still stopping: the file shows B's provisional summary (at
    // most REASSERT_EVERY after A's clean one, if A's replaced it).
    let shows_b = |v: &serde_json::Value| {
        v["outcome"] == "stopping"
            && v["pid"] == pb
            && v["open_paths"]
                .as_array()
                .is_some_and(|p| p.iter().any(|p| p.as_str().unwrap().ends_with("stuck.bin")))
    };
    let v = fuse_tests::wait::wait_for(Duration::from_secs(5), || {
        let v = read_json(&tlog);
        shows_b(&v).then_some(v)
    });
    assert!(v.is_some(), "A exited, B stopping: {:#}", read_json(&tlog));
    // The kubelet's SIGKILL (a native sidecar's 2 s) ends B mid-drain; the file must still
    // say so.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pb),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let eb = b.wait(Duration::from_secs(20));
    assert_eq!(eb.signal.as_deref(), Some("SIGKILL"), "{eb}");
    assert!(closer.join().unwrap().is_err());
    let v = read_json(&tlog);
    assert!(shows_b(&v), "after B's SIGKILL: {v:#}");
    a.assert_nothing_left();
    b.assert_nothing_left();
}

#[test]
fn overlay_stop_is_fast_and_keeps_data() {
    let mut s = Sidecar::start(Daemon::Overlay, relay());
    let data = pattern(3 << 20, 11);
    write_file(&s.path("o.bin"), &data).unwrap();
    wait_idle(&s, Duration::from_secs(5));
    let e = s.stop(Duration::from_secs(15));
    eprintln!("overlay stop: {e}");
    assert!(!e.sigkill_sent, "{e}");
    // As in `idle_stop_is_fast_and_clean`: loose for a loaded machine, short of the 5 s SIGKILL.
    assert!(e.ms_after_stop.unwrap() < 2000, "{e}");
    // libfuse reads the relay's end-of-stream as a "short read on fuse device" (EIO) and exits
    // 1 (lib/fuse_lowlevel.c); the default --eof-exit-codes 0,1 counts that as a clean stop.
    assert_eq!(e.code, Some(0), "{e}");
    let summary = read_summary(&s);
    assert_eq!(summary["lower_exit"], "exit 1", "{summary:#}");
    assert_eq!(summary["exit_code"], 0, "{summary:#}");
    assert!(fs::read(s.store.join("o.bin")).unwrap() == data);
    s.assert_nothing_left();
}

#[test]
fn strict_eof_exit_codes_report_a_libfuse_daemon_as_failed() {
    // With only 0 accepted, the same stop of the same daemon is exit 69: the daemon's own
    // status decides, it is not assumed.
    let mut s = Sidecar::start(
        Daemon::Overlay,
        Via::Relay(vec!["--eof-exit-codes".into(), "0".into()]),
    );
    write_file(&s.path("o.bin"), b"strict").unwrap();
    wait_idle(&s, Duration::from_secs(5));
    let e = s.stop(Duration::from_secs(15));
    assert!(!e.sigkill_sent, "{e}");
    assert_eq!(e.code, Some(69), "{e}");
    let summary = read_summary(&s);
    assert_eq!(summary["lower_exit"], "exit 1", "{summary:#}");
    assert_eq!(fs::read(s.store.join("o.bin")).unwrap(), b"strict");
    s.assert_nothing_left();
}

fn read_summary(s: &Sidecar) -> serde_json::Value {
    serde_json::from_str(&fs::read_to_string(&s.summary).unwrap()).unwrap()
}

#[test]
fn daemon_killed_mid_read_fails_fast() {
    let mut s = Sidecar::start(
        Daemon::Bucketfs(vec![
            "--slow-read".into(),
            "slow".into(),
            "--read-delay".into(),
            "30s".into(),
        ]),
        relay(),
    );
    fs::write(s.store.join("slow.bin"), b"slow").unwrap();
    fs::write(s.store.join("other.bin"), b"other").unwrap();
    let mut cat = Command::new("cat")
        .arg(s.path("slow.bin"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_read_in_flight(&s);
    assert!(
        cat.try_wait().unwrap().is_none(),
        "the read should be blocked"
    );
    let killed = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(s.daemon_pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let st = within(Duration::from_secs(3), move || cat.wait())
        .expect("the blocked read hangs after the daemon died")
        .unwrap();
    eprintln!(
        "blocked read ended {:?} after the kill: {st:?}",
        killed.elapsed()
    );
    assert_eq!(
        st.code(),
        Some(1),
        "cat must fail with an I/O error: {st:?}"
    );
    let other = s.path("other.bin");
    let later = within(Duration::from_secs(3), move || {
        fs::read(other).map_err(|e| errno_name(&e))
    })
    .expect("a later read hangs");
    assert!(later.is_err(), "a later read succeeded: {later:?}");

    // The relay may exit by itself or wait for the stop; either way without a SIGKILL.
    let exited = wait_until(Duration::from_secs(3), || s.stdout_has_status());
    let e = if exited {
        s.wait(Duration::from_secs(5))
    } else {
        s.stop(Duration::from_secs(15))
    };
    eprintln!("after the daemon's death: {e}");
    assert!(!e.sigkill_sent, "{e}");
    // drainfs reports the daemon's death the way gcsfuse's own death would look to the CSI
    // sidecar: it ends by the same signal (SIGKILL), after writing its summary.
    assert_eq!(e.signal.as_deref(), Some("SIGKILL"), "{e}");
    s.assert_nothing_left();
}

/// Waits for the sidecar to exit on its own after the kernel side went away; asserts a clean
/// daemon stop (relay exit 0, bucketfs logged its exit) and nothing left behind.
fn assert_stops_by_itself(s: &mut Sidecar) {
    // Loose (milliseconds when idle) for a loaded machine: a sidecar that does not stop by
    // itself never does.
    let e = s.wait(Duration::from_secs(15));
    eprintln!("after the kernel side went away: {e}");
    assert_eq!(
        e.ms_after_stop, None,
        "the sidecar did not stop by itself: {e}"
    );
    assert_eq!(e.code, Some(0), "{e}");
    assert!(read_events(&s.events).iter().any(|ev| ev.event == "exit"));
    s.assert_nothing_left();
}

#[test]
fn lazy_unmount_stops_the_daemon_cleanly() {
    let mut s = Sidecar::start(Daemon::Bucketfs(Vec::new()), relay());
    write_file(&s.path("kept.txt"), b"kept").unwrap();
    let st = Command::new("umount")
        .arg("-l")
        .arg(&s.mnt)
        .status()
        .unwrap();
    assert!(st.success());
    assert_stops_by_itself(&mut s);
    assert_eq!(fs::read(s.store.join("kept.txt")).unwrap(), b"kept");
}

#[test]
fn connection_abort_stops_the_daemon_cleanly() {
    let _fusectl = Fusectl::ensure();
    let mut s = Sidecar::start(Daemon::Bucketfs(Vec::new()), relay());
    write_file(&s.path("kept.txt"), b"kept").unwrap();
    Fusectl::abort(&s.mnt);
    assert_stops_by_itself(&mut s);
    assert!(!is_mounted(&s.mnt));
    assert_eq!(fs::read(s.store.join("kept.txt")).unwrap(), b"kept");
}

/// An output the unprivileged sidecar cannot create (a control socket in a directory only
/// root may write) is a start-up error, exit 2, instead of a failure found after the start.
#[test]
fn an_output_the_sidecar_cannot_create_is_a_start_up_error() {
    let root_only = tempfile::tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(
        root_only.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let sock = root_only.path().join("control.sock");
    let mut s = Sidecar::spawn(
        Daemon::Bucketfs(Vec::new()),
        Via::Relay(vec!["--control-socket".into(), sock.display().to_string()]),
    );
    let e = s.wait(Duration::from_secs(10));
    assert_eq!(e.code, Some(2), "{e}");
    assert!(!sock.exists());
    s.assert_nothing_left();
}

/// A connection abort while a file is open for writing cuts the writer off (ENOTCONN) before
/// its close could upload: the relay reports it, exit 75 with the file named, never "clean".
/// (A lazy unmount instead waits for the last close, which uploads: see above.)
#[test]
fn connection_abort_with_a_writer_is_incomplete_and_names_the_file() {
    let _fusectl = Fusectl::ensure();
    let mut s = Sidecar::start(Daemon::Bucketfs(Vec::new()), relay());
    fs::create_dir(s.path("d")).unwrap();
    let mut f = fs::File::create(s.path("d/held")).unwrap();
    f.write_all(&[5u8; 100_000]).unwrap();
    Fusectl::abort(&s.mnt);
    let e = s.wait(Duration::from_secs(15));
    assert_eq!(e.ms_after_stop, None, "did not stop by itself: {e}");
    assert_eq!(e.code, Some(75), "{e}");
    let summary = read_summary(&s);
    assert_eq!(
        summary["failed_flushes"],
        serde_json::json!(["d/held"]),
        "{summary:#}"
    );
    assert_eq!(
        summary["open_paths"],
        serde_json::json!(["d/held"]),
        "{summary:#}"
    );
    drop(f);
    s.assert_nothing_left();
}

/// A daemon that refuses INIT is a failed start (69), also when the node driver's SIGTERM
/// (sent as soon as its statfs fails) races the relay's report of the refusal.
#[test]
fn a_daemon_that_refuses_init_is_a_failed_start() {
    for _ in 0..5 {
        let mut s = Sidecar::spawn(Daemon::Bucketfs(vec!["--refuse-init".into()]), relay());
        let e = s.wait(Duration::from_secs(10));
        assert_eq!(e.code, Some(69), "{e}");
        s.assert_nothing_left();
    }
}

// ------------------------------------------------------------------------------------------
// Issue 17: relay edges (notifications, page-cache changes, a slow daemon, no-open daemons,
// a WRITE after the last FLUSH).

/// Issue 17.1: the daemon sends NOTIFY_INVAL_INODE while the READ of that inode is in flight
/// (the kernel holds the notification until the READ's folio is unlocked) and
/// NOTIFY_INVAL_ENTRY while a LOOKUP in that directory is in flight. The replies still come
/// through, the kernel takes the notifications, and the stop is clean. (Issue 36: a daemon
/// that invalidated the inode on every READ made a loop of the kernel's, with or without the
/// relay: the reader lost the pages before it copied them and read again; under load one
/// 256 KiB read took 20-30 s and dozens of READs. bucketfs now notifies once per key.)
#[test]
fn notifications_while_their_request_is_in_flight_never_wedge_the_relay() {
    let mut s = Sidecar::start(
        Daemon::Bucketfs(vec![
            "--notify-on-read".into(),
            "inval-inode".into(),
            "--notify-on-lookup".into(),
            "inval-entry".into(),
        ]),
        relay(),
    );
    // Written straight into the bucket: not in the page cache, so the read is a READ.
    let data = pattern(256 << 10, 17);
    fs::write(s.store.join("inval-inode.bin"), &data).unwrap();
    fs::write(s.store.join("inval-entry.txt"), b"entry").unwrap();
    let p = s.path("inval-inode.bin");
    let read = within(Duration::from_secs(30), move || {
        fs::read(&p).map_err(|e| errno_name(&e))
    });
    assert!(
        read == Some(Ok(data.clone())),
        "the READ did not complete with the object's bytes (hung: {})",
        read.is_none()
    );
    let p = s.path("inval-entry.txt");
    let looked = within(Duration::from_secs(30), move || {
        fs::metadata(&p)
            .map(|m| m.len())
            .map_err(|e| errno_name(&e))
    });
    assert_eq!(looked, Some(Ok(5)), "the LOOKUP did not complete");
    for key in ["inval-inode.bin", "inval-entry.txt"] {
        let sent = wait_for_event(&s.events, Duration::from_secs(30), |e| {
            e.is("notify_sent", key)
        });
        assert!(
            sent.is_some(),
            "the kernel never took the notification for {key}"
        );
    }
    wait_idle(&s, Duration::from_secs(10));
    // One per key (bucketfs notifies on the first READ of the file and the first LOOKUP of
    // the name), all taken by the kernel. bucketfs logs `notify_sent` when it has written
    // the notification to the relay, which counts it once it has passed it to the kernel, a
    // moment later (under `stress-ng --cpu 2` the status once still said 1): wait for both.
    let mut status = s.status();
    let both = wait_until(Duration::from_secs(10), || {
        status = s.status();
        status["relay"]["counts"]["notifications"].as_u64() >= Some(2)
    });
    assert!(
        both,
        "the relay did not count both notifications: {status:#}"
    );
    let counts = &status["relay"]["counts"];
    assert_eq!(counts["notifications"], 2, "{status:#}");
    assert_eq!(counts["notifications_dropped"], 0, "{status:#}");
    let e = s.stop(Duration::from_secs(15));
    assert_eq!(e.code, Some(0), "{e}");
    assert!(!e.sigkill_sent, "{e}");
    s.assert_nothing_left();
}

/// Issue 17.2: a file open O_RDWR changed only through a MAP_SHARED mapping (no WRITE has
/// reached the relay) when the connection is aborted: the change is lost, so the outcome is
/// 75 with the file named, never 0.
#[test]
fn connection_abort_with_changes_only_in_the_page_cache_is_incomplete() {
    let _fusectl = Fusectl::ensure();
    let mut s = Sidecar::start(Daemon::Bucketfs(Vec::new()), relay());
    fs::create_dir(s.path("m")).unwrap();
    write_file(&s.path("m/mapped"), &[b'a'; 8192]).unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(s.path("m/mapped"))
        .unwrap();
    let mut map = SharedMap::new(&f, 8192, true);
    map.fill(b'b');
    Fusectl::abort(&s.mnt);
    let e = s.wait(Duration::from_secs(10));
    assert_eq!(e.ms_after_stop, None, "did not stop by itself: {e}");
    // The bucket really kept the old object: the change was lost.
    assert!(fs::read(s.store.join("m/mapped")).unwrap() == vec![b'a'; 8192]);
    assert_eq!(e.code, Some(75), "{e}");
    let summary = read_summary(&s);
    assert_eq!(
        summary["failed_flushes"],
        serde_json::json!(["m/mapped"]),
        "{summary:#}"
    );
    drop(map);
    drop(f);
    s.assert_nothing_left();
}

/// Issue 17.3: every daemon worker is busy in an 8 s upload while writers queue WRITEs that
/// fill the socket: the relay waits for the daemon (as the kernel's own queue would) instead
/// of answering a WRITE EIO itself; every write succeeds and every object arrives.
#[test]
fn a_slow_daemon_is_waited_for_and_never_gets_a_request_failed_by_the_relay() {
    let mut s = Sidecar::start(
        Daemon::Bucketfs(vec![
            "--threads".into(),
            "1".into(),
            "--upload-delay".into(),
            "8s".into(),
            "--slow-upload".into(),
            "slow".into(),
        ]),
        relay(),
    );
    let writers: Vec<File> = (0..10)
        .map(|i| File::create(s.path(&format!("w{i}.bin"))).unwrap())
        .collect();
    let mut slow = File::create(s.path("slow.bin")).unwrap();
    slow.write_all(b"slow").unwrap();
    let closer = std::thread::spawn(move || close(slow).map_err(|e| errno_name(&e)));
    wait_for_event(&s.events, Duration::from_secs(10), |e| {
        e.is("upload_start", "slow.bin")
    })
    .expect("the slow FLUSH reached the daemon");
    // Ten 128 KiB WRITEs at once: a few fill the socket (212992 bytes requested, doubled by
    // the kernel), the rest wait for the daemon.
    let chunk = 128 << 10;
    let threads: Vec<_> = writers
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            std::thread::spawn(move || {
                use std::os::unix::fs::FileExt;
                let data = pattern(chunk, 40 + i as u64);
                let r = f.write_all_at(&data, 0).map_err(|e| errno_name(&e));
                (r, f, data)
            })
        })
        .collect();
    let mut expected = Vec::new();
    for (i, t) in threads.into_iter().enumerate() {
        let (r, f, data) = t.join().unwrap();
        assert_eq!(r, Ok(()), "pwrite of w{i}.bin while the daemon was busy");
        assert_eq!(
            close(f).map_err(|e| errno_name(&e)),
            Ok(()),
            "close of w{i}.bin"
        );
        expected.push(data);
    }
    assert_eq!(closer.join().unwrap(), Ok(()), "close of slow.bin");
    let e = s.stop(Duration::from_secs(15));
    assert_eq!(e.code, Some(0), "{e}");
    for (i, data) in expected.iter().enumerate() {
        assert!(
            fs::read(s.store.join(format!("w{i}.bin"))).unwrap() == *data,
            "w{i}.bin is not complete in the bucket"
        );
    }
    assert_eq!(fs::read(s.store.join("slow.bin")).unwrap(), b"slow");
    s.assert_nothing_left();
}

/// Issue 17.4: a daemon that answers OPEN with ENOSYS (the kernel's no-open mode, in which
/// no RELEASE comes): a writer still counts, so a stop waits for its close (its upload)
/// instead of ending at once and cutting it off.
#[test]
fn a_writer_on_a_no_open_daemon_holds_the_drain_until_its_close() {
    let mut s = Sidecar::start(Daemon::Bucketfs(vec!["--open-enosys".into()]), relay());
    fs::write(s.store.join("w.txt"), b"old").unwrap();
    let mut f = OpenOptions::new()
        .write(true)
        .open(s.path("w.txt"))
        .unwrap();
    f.write_all(b"new!").unwrap();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        let w = f.write_all(b"more").map_err(|e| errno_name(&e));
        (w, close(f).map_err(|e| errno_name(&e)))
    });
    std::thread::sleep(Duration::from_millis(200));
    let status = s.status();
    assert_eq!(
        status["outstanding"]["open_write"], 1,
        "the writer is not counted: {status:#}"
    );
    let e = s.stop(Duration::from_secs(15));
    let (w, c) = writer.join().unwrap();
    assert_eq!(w, Ok(()), "a write after the stop began");
    assert_eq!(c, Ok(()), "the writer's close (its upload)");
    assert_eq!(fs::read(s.store.join("w.txt")).unwrap(), b"new!more");
    assert_eq!(e.code, Some(0), "{e}");
    assert!(!e.sigkill_sent, "{e}");
    s.assert_nothing_left();
}

/// Issue 17.5: a write through a mapping after the file's last close, then munmap: the kernel
/// sends WRITE then RELEASE, no FLUSH, and bucketfs (like gcsfuse) uploads only at
/// FLUSH/FSYNC. The relay's own FSYNC before the RELEASE uploads it.
#[test]
fn a_write_after_the_last_flush_is_synced_before_its_release() {
    let mut s = Sidecar::start(Daemon::Bucketfs(Vec::new()), relay());
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(s.path("late.bin"))
        .unwrap();
    f.set_len(8192).unwrap();
    let mut map = SharedMap::new(&f, 8192, true);
    map.fill(b'a');
    (&f).write_all(&[b'a'; 8192]).unwrap();
    close(f).unwrap();
    assert!(fs::read(s.store.join("late.bin")).unwrap() == vec![b'a'; 8192]);
    map.fill(b'b');
    drop(map);
    wait_idle(&s, Duration::from_secs(10));
    let e = s.stop(Duration::from_secs(15));
    assert!(
        fs::read(s.store.join("late.bin")).unwrap() == vec![b'b'; 8192],
        "the change written after the last FLUSH did not reach the bucket"
    );
    assert_eq!(e.code, Some(0), "{e}");
    let summary = read_summary(&s);
    assert_eq!(
        summary["failed_flushes"],
        serde_json::json!([]),
        "{summary:#}"
    );
    s.assert_nothing_left();
}

/// Issue 17.5 over the real gcsfuse v3.11.2 (fake-gcs-server): gcsfuse uploads at FLUSH and
/// FSYNC only, so a write through a mapping after the last close, then munmap (WRITE, then
/// RELEASE, no FLUSH) never reaches the bucket on a direct connection. Through the relay, its
/// own FSYNC before the RELEASE makes gcsfuse upload it; objects are read back from the server.
#[test]
fn gcsfuse_uploads_a_write_after_the_last_flush_through_the_relay() {
    use fuse_tests::lowers::{Kind, Server, object_of};
    let server = Server::start(Kind::Gcsfuse);
    let argv = server.mount_cmd(Path::new("/dev/fd/3"));
    let mut s = Sidecar::start(Daemon::Command(argv), relay());
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(s.path("late.bin"))
        .unwrap();
    (&f).write_all(&[b'a'; 8192]).unwrap();
    let mut map = SharedMap::new(&f, 8192, true);
    close(f).unwrap();
    assert_eq!(
        server.objects().get("late.bin"),
        Some(&object_of(&[b'a'; 8192])),
        "close() uploads"
    );
    map.fill(b'b');
    drop(map);
    wait_idle(&s, Duration::from_secs(10));
    assert_eq!(
        server.objects().get("late.bin"),
        Some(&object_of(&[b'b'; 8192])),
        "the write after the last FLUSH is uploaded before its RELEASE"
    );
    let status = s.status();
    assert_eq!(status["relay"]["counts"]["relay_fsyncs"], 1, "{status:#}");
    let e = s.stop(Duration::from_secs(15));
    assert_eq!(e.code, Some(0), "{e}");
    s.assert_nothing_left();
}

/// Issue 17.1, the forced end: the daemon notifies while a READ is in flight and then does not
/// answer that READ for a minute. The stop still ends with an outcome before the sidecar's
/// SIGKILL: the deadline stops the daemon, the READ is answered EIO, the kernel takes the
/// notification, and nothing is left behind (no process stuck in the kernel, no mount).
#[test]
fn a_notification_behind_a_read_that_never_ends_does_not_outlive_the_deadline() {
    let mut s = Sidecar::start(
        Daemon::Bucketfs(vec![
            "--notify-on-read".into(),
            "stuck".into(),
            "--slow-read".into(),
            "stuck".into(),
            "--read-delay".into(),
            "60s".into(),
        ]),
        relay(),
    );
    fs::write(s.store.join("stuck.bin"), pattern(64 << 10, 5)).unwrap();
    let p = s.path("stuck.bin");
    let reader = std::thread::spawn(move || fs::read(&p).map(|_| ()).map_err(|e| errno_name(&e)));
    wait_until(Duration::from_secs(10), || {
        s.status()["relay"]["awaiting_daemon"].as_u64() == Some(1)
    });
    std::thread::sleep(Duration::from_millis(500));
    let e = s.stop(Duration::from_secs(15));
    assert!(!e.sigkill_sent, "{e}");
    assert!(e.code.is_some(), "{e}");
    assert!(
        reader.join().unwrap().is_err(),
        "the READ cut off by the deadline fails"
    );
    s.assert_nothing_left();
}

/// The gcsfuse drop-in (drainfs run as `gcsfuse`, as the relay image's `/gcsfuse`) logs Cloud
/// Logging JSON on stdout, which GKE's logging agent files by its `severity`: every line drainfs
/// writes parses as JSON with a `severity`, a clean stop's summary is `INFO`, and a stop that
/// is not clean (a file still open for writing at the deadline, exit 75) is `ERROR`, so that a
/// `severity>=ERROR` alert sees it. The sidecar's stdout is on `fake-node-driver`'s stderr.
/// drainfs as the gcsfuse drop-in in relay mode (a symlink named `gcsfuse`, bucketfs as the
/// real gcsfuse, the mount option `drainfs-mode=relay` as argv) under `fake-node-driver`, with `env` added to the sidecar's environment; ready.
fn dropin(env: &[(&str, &str)]) -> (tempfile::TempDir, fuse_tests::driver::NodeDriver) {
    use fuse_tests::driver::{NodeDriver, sidecar_dir};
    use fuse_tests::harness::{bin, scratch_dir};
    let dir = scratch_dir("/tmp", "drainfs-dropin-");
    let (mnt, store, bin_dir) = (
        dir.path().join("mnt"),
        dir.path().join("store"),
        dir.path().join("bin"),
    );
    fs::create_dir(&mnt).unwrap();
    sidecar_dir(&store);
    fs::create_dir(&bin_dir).unwrap();
    let gcsfuse = bin_dir.join("gcsfuse");
    std::os::unix::fs::symlink(bin("drainfs"), &gcsfuse).unwrap();
    let mut cmd = NodeDriver::command(&mnt);
    cmd.env("DRAINFS_REAL_GCSFUSE", bin("bucketfs"))
        .env("DRAINFS_SOCKET_BUFFER", "212992")
        .env_remove("DRAINFS_LOG_FORMAT")
        .env_remove("DRAINFS_ADMIN_ADDR")
        .envs(env.iter().copied())
        .arg("--")
        .arg(&gcsfuse)
        // The relay is the drop-in's opt-in (the hand-off is its default).
        .arg("--drainfs-mode=relay")
        .arg("--bucket")
        .arg(&store)
        .args(["--mountpoint", "/dev/fd/3"]);
    let mut driver = NodeDriver::spawn(cmd, &mnt, "[dropin]", Duration::from_secs(10));
    driver.wait_ready(Duration::from_secs(30));
    driver.note_chain(2);
    (dir, driver)
}

/// One relay runs per gcsfuse volume, all with the relay image's `DRAINFS_ADMIN_ADDR`: a relay
/// that finds the address taken (another volume's relay, here a listener of the test's) logs a
/// WARNING and serves its volume without an admin server, instead of failing the mount.
#[test]
fn dropin_runs_without_an_admin_server_when_its_address_is_taken() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (dir, mut driver) = dropin(&[("DRAINFS_ADMIN_ADDR", addr.as_str())]);
    write_file(&dir.path().join("mnt/f"), b"x").unwrap();
    let ending = driver.stop(Duration::from_secs(15));
    assert_eq!(ending.signal.as_deref(), Some("SIGTERM"), "{ending:?}");
    let text = driver.stderr_text();
    assert!(
        text.lines()
            .any(|l| l.contains("admin address in use") && l.contains("\"severity\":\"WARNING\"")),
        "no WARNING about the taken admin address:\n{text}"
    );
}

#[test]
fn dropin_logs_json_with_cloud_logging_severity() {
    for incomplete in [false, true] {
        let (dir, mut driver) = dropin(&[]);
        let mnt = dir.path().join("mnt");
        write_file(&mnt.join("done"), b"x").unwrap();
        let held = incomplete.then(|| {
            let mut f = File::create(mnt.join("held")).unwrap();
            f.write_all(b"partial").unwrap();
            f
        });
        let ending = driver.stop(Duration::from_secs(15));
        drop(held);
        let text = driver.stderr_text();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
            .filter(|v| {
                v["target"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("drainfs"))
            })
            .collect();
        assert!(
            lines.iter().any(|v| v["message"] == "shutdown summary"),
            "no JSON summary line from the drop-in:\n{text}"
        );
        for v in &lines {
            let sev = v["severity"].as_str().unwrap_or_default();
            assert!(
                ["DEBUG", "INFO", "WARNING", "ERROR"].contains(&sev),
                "line without a Cloud Logging severity: {v}"
            );
            assert!(v["timestamp"].is_string(), "{v}");
        }
        let summary = lines
            .iter()
            .find(|v| v["message"] == "shutdown summary")
            .unwrap();
        if incomplete {
            assert_eq!(summary["severity"], "ERROR", "{summary}");
            assert_eq!(summary["exit_code"], 75, "{summary}");
            assert_eq!(ending.code, Some(75), "{ending:?}");
        } else {
            assert_eq!(summary["severity"], "INFO", "{summary}");
            assert_eq!(summary["exit_code"], 0, "{summary}");
            // The drop-in ends a clean stop after SIGTERM by SIGTERM (--clean-sigterm-exit).
            assert_eq!(ending.signal.as_deref(), Some("SIGTERM"), "{ending:?}");
        }
        // No drainfs line in the text format ("drainfs: " prefixes or a bare level word).
        assert!(
            !text.lines().any(|l| l.contains(" INFO lifecycle:")),
            "a text-format drainfs line:\n{text}"
        );
    }
}

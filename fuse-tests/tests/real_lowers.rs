//! drainfs over real FUSE lowers of object stores (the real binary, real mounts, loopback servers):
//!
//! - `gcs`: `rclone mount` over fake-gcs-server, the gcsfuse stand-in (data streams during
//!   write(), the object is finalized inside close());
//! - `s3`: s3fs over moto (the whole upload happens inside close()).
//!
//! Every object is read back from the server and compared by size and SHA-256, never through a
//! mount. Each test starts its own server on a free port and its own `drainfs run -- <client>`;
//! RAII guards stop drainfs, the client and the server and detach any mount, even when a test
//! fails.
//!
//! The lowers come from `scripts/install-lowers.sh`: without them every test fails with a
//! message saying so. `scripts/LOWERS-NOTES.md` describes the clients' behaviour.
//!
//! The tests take turns ([`serial`]): a fork+exec anywhere in this process (starting a server,
//! `cp`, `sha256sum`) gives the child a copy of every open fd, which exec closes, and each of
//! those closes is a FLUSH. On rclone a FLUSH finalizes the upload and closes its handle, so
//! another test's file being written would be published early and its next write() would fail
//! with EBADF (the same happens to any multithreaded application that spawns processes while
//! it writes, with or without drainfs).

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{close, open, pattern};
use fuse_tests::harness::{MountOpts, Mounted, is_mounted, wait_until};
use fuse_tests::lowers::{
    Kind, Object, Server, child_pids, fstype_at, object_of, objects_of_tree, pid_alive,
    require_installed,
};
use nix::sys::signal::Signal;

/// drainfs runs with default flags over both lowers: `--passthrough auto` gives writers kernel
/// passthrough only on lowers known to keep per-inode write state, and rclone and s3fs are
/// not among them (rclone `--vfs-cache-mode off` uploads per file handle, and the kernel's
/// passthrough handle never gets a FLUSH: LOWERS-NOTES.md, section 4).
const MIB: usize = 1 << 20;

/// One test at a time in this process (see the module doc). Take it before anything forks.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A server, and `drainfs run` mounted over that server's FUSE client. Fields drop in order:
/// drainfs (and the client) first, then the server.
struct Stack {
    m: Mounted,
    server: Server,
    kind: Kind,
    exit_file: PathBuf,
    summary: PathBuf,
    /// The FUSE client's PID (drainfs's child).
    lower_pid: i32,
}

/// `passthrough`: `Some(mode)` passes `--passthrough mode`; `None` leaves drainfs's default.
fn stack(kind: Kind, passthrough: Option<&str>) -> Stack {
    stack_with(kind, passthrough, &[])
}

/// [`stack`] with more drainfs flags.
fn stack_with(kind: Kind, passthrough: Option<&str>, extra: &[&str]) -> Stack {
    let server = Server::start(kind);
    let dir = tempfile::Builder::new()
        .prefix(&format!("drainfs-real-{}-", kind.name()))
        .tempdir_in("/tmp")
        .unwrap();
    let lower = dir.path().join("lower");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&lower).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let exit_file = dir.path().join("volumes").join("exit");
    let summary = dir.path().join("summary.json");
    let mut args: Vec<String> = passthrough
        .map(|p| vec!["--passthrough".to_string(), p.to_string()])
        .unwrap_or_default();
    args.extend([
        "--exit-file".into(),
        exit_file.display().to_string(),
        "--summary-file".into(),
        summary.display().to_string(),
        "--lower-ready-timeout".into(),
        "30s".into(),
    ]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let lower_cmd = server.mount_cmd(&lower);
    let client = lower_cmd[0].clone();
    let m = Mounted::start_in(
        dir,
        lower.clone(),
        mnt,
        MountOpts {
            args,
            lower_cmd,
            no_wait: false,
        },
    );
    let mut lower_pid = None;
    wait_until(Duration::from_secs(5), || {
        lower_pid = child_pids(m.proc.pid()).into_iter().find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmdline.split(|b| *b == 0).next() == Some(client.as_bytes())
        });
        lower_pid.is_some()
    });
    let s = Stack {
        m,
        server,
        kind,
        exit_file,
        summary,
        lower_pid: lower_pid.unwrap_or(-1),
    };
    assert!(s.lower_pid > 0, "drainfs has no child (the FUSE client)");
    assert_eq!(
        fstype_at(&lower).as_deref(),
        Some(kind.fstype()),
        "the real client is not mounted under drainfs"
    );
    s
}

impl Stack {
    /// Writes the exit file the way Kubernetes wrappers do: a temp file, then a rename.
    fn trigger_exit_file(&self) {
        let dir = self.exit_file.parent().unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let tmp = dir.join(".exit.tmp");
        std::fs::write(&tmp, b"").unwrap();
        std::fs::rename(&tmp, &self.exit_file).unwrap();
    }

    fn wait_exit(&mut self, timeout: Duration) -> i32 {
        let st = self.m.proc.wait_timeout(timeout).unwrap_or_else(|| {
            panic!(
                "drainfs did not exit within {timeout:?}:\n{}",
                self.m.proc.stderr_text()
            )
        });
        st.code().unwrap_or(-1)
    }

    fn summary(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(&self.summary)
            .unwrap_or_else(|e| panic!("no summary file ({e}):\n{}", self.m.proc.stderr_text()));
        serde_json::from_str(&text).unwrap()
    }

    /// After drainfs exited: nothing mounted, the client's process gone.
    fn assert_clean_end(&self) {
        assert!(!is_mounted(&self.m.mnt), "drainfs's mount left behind");
        assert!(!is_mounted(&self.m.lower), "the lower's mount left behind");
        assert!(
            wait_until(Duration::from_secs(2), || !pid_alive(self.lower_pid)),
            "the FUSE client (pid {}) is still running",
            self.lower_pid
        );
    }

    /// The bucket holds exactly `want` (same keys, sizes and SHA-256).
    fn assert_bucket(&self, want: &BTreeMap<String, Object>) {
        let got = self.server.objects();
        let missing: Vec<&String> = want.keys().filter(|k| !got.contains_key(*k)).collect();
        let extra: Vec<&String> = got.keys().filter(|k| !want.contains_key(*k)).collect();
        let wrong: Vec<String> = want
            .iter()
            .filter_map(|(k, w)| {
                let g = got.get(k)?;
                (g != w).then(|| {
                    format!(
                        "{k}: {} B sha256 {:.12} (want {} B sha256 {:.12})",
                        g.size, g.sha256, w.size, w.sha256
                    )
                })
            })
            .collect();
        assert!(
            missing.is_empty() && extra.is_empty() && wrong.is_empty(),
            "{} bucket differs: missing {missing:?}, unexpected {extra:?}, wrong content {wrong:?}",
            self.kind.name()
        );
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // drainfs first: SIGTERM (drain), a second SIGTERM (finish now), then SIGKILL. Then the
        // client, in case drainfs could not stop it. Mounted's own drop detaches what is left
        // mounted, and Server's stops the server.
        let p = &mut self.m.proc;
        if p.wait_timeout(Duration::ZERO).is_none() {
            p.signal(Signal::SIGTERM);
            if p.wait_timeout(Duration::from_secs(5)).is_none() {
                p.signal(Signal::SIGTERM);
                if p.wait_timeout(Duration::from_secs(5)).is_none() {
                    p.signal(Signal::SIGKILL);
                    let _ = p.wait_timeout(Duration::from_secs(5));
                }
            }
        }
        if self.lower_pid > 0 && pid_alive(self.lower_pid) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.lower_pid), Signal::SIGKILL);
        }
    }
}

/// Creates `path` (O_TRUNC), writes `data` and closes it, returning close()'s error: the upload
/// happens inside close(), so that is where its failure shows.
fn write_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644)?;
    f.write_all(data)?;
    close(f)
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------- the main job

fn workload_then_exit_file(kind: Kind) {
    let _serial = serial();
    let mut s = stack(kind, None);
    let mut want = BTreeMap::new();
    std::fs::create_dir_all(s.m.path("out/nested/deeper")).unwrap();
    let mut files: Vec<(String, Vec<u8>)> = vec![
        (
            "out/hello.txt".into(),
            b"hello from the workload\n".to_vec(),
        ),
        ("out/one-mib.bin".into(), pattern(1, MIB)),
        ("out/sixteen-mib.bin".into(), pattern(2, 16 * MIB)),
        ("out/nested/deeper/empty".into(), Vec::new()),
    ];
    for i in 0..8 {
        files.push((
            format!("out/nested/part-{i:02}.bin"),
            pattern(10 + i, 4096 * (i as usize + 1) + 17),
        ));
    }
    for (key, data) in &files {
        write_file(&s.m.path(key), data).unwrap_or_else(|e| panic!("writing {key}: {e}"));
        want.insert(key.clone(), object_of(data));
    }
    s.trigger_exit_file();
    let code = s.wait_exit(Duration::from_secs(60));
    assert_eq!(code, 0, "{}", s.m.proc.stderr_text());
    let sum = s.summary();
    assert_eq!(sum["outcome"], "clean", "{sum}");
    assert_eq!(sum["cause"]["cause"], "exit_file", "{sum}");
    assert_eq!(sum["counts"]["lower_flush_errors"], 0, "{sum}");
    s.assert_clean_end();
    s.assert_bucket(&want);
}

/// Default flags over rclone (`--vfs-cache-mode off`, which uploads per file handle): every
/// file whose close() returned 0 is complete in the bucket, and drainfs exits 0. With kernel
/// passthrough for writers the kernel's own lower handle never gets a FLUSH, and objects end
/// up empty or short while drainfs reports a clean exit.
#[test]
fn gcs_default_flags_every_closed_file_is_complete() {
    let _serial = serial();
    let mut s = stack(Kind::Gcs, None);
    std::fs::create_dir_all(s.m.path("many")).unwrap();
    let mut want = BTreeMap::new();
    for i in 0..32 {
        let key = format!("many/f-{i:02}.bin");
        let data = pattern(100 + i, 64 * 1024 * (1 + i as usize % 4) + i as usize);
        write_file(&s.m.path(&key), &data).unwrap_or_else(|e| panic!("writing {key}: {e}"));
        want.insert(key, object_of(&data));
    }
    s.trigger_exit_file();
    let code = s.wait_exit(Duration::from_secs(60));
    assert_eq!(code, 0, "{}", s.m.proc.stderr_text());
    s.assert_clean_end();
    s.assert_bucket(&want);
}

/// Default flags over rclone: a writer that opens a file while a reader holds it open must
/// work as it does on rclone itself (the new data is uploaded), not be forced onto kernel
/// passthrough by the reader's backing id (EPERM, and an emptied object).
#[test]
fn gcs_default_flags_writer_while_a_reader_holds_the_file() {
    let _serial = serial();
    let mut s = stack(Kind::Gcs, None);
    let old = pattern(7, 512 * 1024);
    write_file(&s.m.path("rw.dat"), &old).unwrap();
    let reader = std::fs::File::open(s.m.path("rw.dat")).unwrap();
    let new = pattern(8, 3 * MIB);
    write_file(&s.m.path("rw.dat"), &new).expect("the writer's open, writes and close succeed");
    drop(reader);
    s.trigger_exit_file();
    let code = s.wait_exit(Duration::from_secs(60));
    assert_eq!(code, 0, "{}", s.m.proc.stderr_text());
    s.assert_clean_end();
    s.assert_bucket(&BTreeMap::from([("rw.dat".to_string(), object_of(&new))]));
}

#[test]
fn gcs_workload_then_exit_file_uploads_everything() {
    workload_then_exit_file(Kind::Gcs);
}

#[test]
fn s3_workload_then_exit_file_uploads_everything() {
    workload_then_exit_file(Kind::S3);
}

// ---------------------------------------------------------------- SIGTERM inside close()

/// Whether thread `tid` of this process is inside `close(fd)` (from /proc, as `strace -p`
/// would see it).
fn in_close(tid: i32, fd: i32) -> bool {
    let text =
        std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).unwrap_or_default();
    let mut f = text.split_whitespace();
    f.next() == Some(libc::SYS_close.to_string().as_str())
        && f.next() == Some(format!("{fd:#x}").as_str())
}

fn sigterm_inside_close(kind: Kind) {
    let _serial = serial();
    let mut s = stack(kind, None);
    let data = pattern(3, 64 * MIB);
    let want = object_of(&data);
    std::fs::create_dir(s.m.path("big")).unwrap();
    let path = s.m.path("big/model.bin");
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = std::thread::spawn(move || {
        let mut f = open(&path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644)?;
        f.write_all(&data)?;
        // SAFETY: gettid has no preconditions.
        tx.send((unsafe { libc::gettid() }, f.as_raw_fd())).unwrap();
        let r = close(f); // FLUSH: the upload is finalized in here
        r.map(|()| Instant::now())
    });
    let Ok((tid, fd)) = rx.recv_timeout(Duration::from_secs(120)) else {
        panic!("the writer did not write 64 MiB: {:?}", writer.join());
    };
    assert!(
        wait_until(Duration::from_secs(30), || in_close(tid, fd)),
        "the writer was never seen inside close()"
    );
    let signalled = Instant::now();
    s.m.proc.signal(Signal::SIGTERM);
    let still_in_close = in_close(tid, fd);
    let closed = writer
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("close() failed after SIGTERM: {e}"));
    assert!(
        still_in_close,
        "close() ended before SIGTERM was sent: the test did not test anything"
    );
    let code = s.wait_exit(Duration::from_secs(60));
    assert_eq!(code, 0, "{}", s.m.proc.stderr_text());
    let sum = s.summary();
    assert_eq!(sum["outcome"], "clean", "{sum}");
    assert_eq!(sum["cause"]["cause"], "sigterm", "{sum}");
    // drainfs unmounted and stopped the lower only after the upload had finished.
    let drained = Duration::from_millis(sum["timings"]["drained_ms"].as_u64().unwrap());
    assert!(
        drained + Duration::from_millis(200) >= closed.duration_since(signalled),
        "drained {drained:?} after SIGTERM, but close() returned {:?} after it: {sum}",
        closed.duration_since(signalled)
    );
    s.assert_clean_end();
    s.assert_bucket(&BTreeMap::from([("big/model.bin".to_string(), want)]));
}

#[test]
fn gcs_sigterm_while_a_large_file_is_inside_close_keeps_the_object() {
    sigterm_inside_close(Kind::Gcs);
}

#[test]
fn s3_sigterm_while_a_large_file_is_inside_close_keeps_the_object() {
    sigterm_inside_close(Kind::S3);
}

// ---------------------------------------------------------------- the lower dies

/// SIGKILLs the FUSE client while the application has a file open for writing: the
/// application's next operation on that fd fails (`want` errnos), drainfs exits 69, and nothing
/// stays mounted.
fn lower_killed_while_a_file_is_open(kind: Kind, mode: &str, want: &[i32]) {
    let _serial = serial();
    let mut s = stack(kind, Some(mode));
    let mut f = open(
        &s.m.path("open.bin"),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        0o644,
    )
    .unwrap();
    f.write_all(&pattern(4, MIB)).unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(s.lower_pid), Signal::SIGKILL).unwrap();
    let chunk = pattern(5, 64 * 1024);
    let t = Instant::now();
    let err = loop {
        match f.write_all(&chunk) {
            Err(e) => break e,
            Ok(()) if t.elapsed() > Duration::from_secs(5) => {
                panic!("writes still succeed 5 s after the FUSE client was killed")
            }
            Ok(()) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    eprintln!(
        "{} --passthrough {mode}: the first write after the kill failed with {err}",
        kind.name()
    );
    let errno = err.raw_os_error().unwrap_or(0);
    assert!(
        want.contains(&errno),
        "{} --passthrough {mode}: write after the client died failed with {err}, want one of {want:?}",
        kind.name()
    );
    let _ = close(f);
    let code = s.wait_exit(Duration::from_secs(30));
    assert_eq!(code, 69, "{}", s.m.proc.stderr_text());
    let sum = s.summary();
    assert_eq!(sum["outcome"], "lower_failed", "{sum}");
    assert_eq!(sum["cause"]["cause"], "lower_died", "{sum}");
    s.assert_clean_end();
}

#[test]
fn gcs_lower_killed_while_a_file_is_open_gives_eio_and_exit_69() {
    lower_killed_while_a_file_is_open(Kind::Gcs, "never", &[libc::EIO]);
}

#[test]
fn s3_lower_killed_while_a_file_is_open_gives_eio_and_exit_69() {
    lower_killed_while_a_file_is_open(Kind::S3, "never", &[libc::EIO]);
}

/// With kernel passthrough the application's writes go straight to the dead client's mount, so
/// the kernel answers them (ENOTCONN), not drainfs.
#[test]
fn s3_passthrough_lower_killed_while_a_file_is_open_fails_the_fd_and_exits_69() {
    lower_killed_while_a_file_is_open(
        Kind::S3,
        "always",
        &[libc::EIO, libc::ENOTCONN, libc::ECONNABORTED],
    );
}

// ---------------------------------------------------------------- everyday tools

/// A tree with awkward names and sizes from 0 B to 5 MB, and a tar of it.
fn make_tree(root: &Path) -> PathBuf {
    let tree = root.join("tree");
    let files: Vec<(&str, Vec<u8>)> = vec![
        (
            "a.txt",
            (0..100)
                .map(|i| format!("line {i}\n"))
                .collect::<String>()
                .into_bytes(),
        ),
        ("empty", Vec::new()),
        ("with space.bin", pattern(20, 100 * 1024)),
        ("plus+percent%.bin", pattern(21, 10 * 1024)),
        ("sub/one-mib.bin", pattern(22, MIB)),
        ("sub/deeper/five-mb.bin", pattern(23, 5_000_000)),
        ("sub/deeper/small.json", br#"{"ok": true}"#.to_vec()),
    ];
    for (rel, data) in &files {
        let p = tree.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
    }
    let tar = root.join("tree.tar");
    run(Command::new("tar")
        .arg("-C")
        .arg(root)
        .arg("-cf")
        .arg(&tar)
        .arg("tree"));
    tar
}

const PY_WRITER: &str = r#"
import sys
# Buffered text I/O, one small write() call per line, as scripts log.
with open(sys.argv[1], "w") as f:
    for i in range(100000):
        f.write(f"{i},{i * i},{i % 7}\n")
"#;

fn everyday_tools(kind: Kind) {
    let _serial = serial();
    require_installed(&["rsync", "tar", "python3"]);
    let mut s = stack(kind, None);
    let src = tempfile::Builder::new()
        .prefix("drainfs-real-src-")
        .tempdir_in("/tmp")
        .unwrap();
    let tar = make_tree(src.path());
    let tree = src.path().join("tree");
    let mnt = s.m.mnt.clone();

    run(Command::new("cp").arg("-r").arg(&tree).arg(mnt.join("cp")));
    std::fs::create_dir(mnt.join("tar")).unwrap();
    run(Command::new("tar")
        .arg("-C")
        .arg(mnt.join("tar"))
        .arg("-xf")
        .arg(&tar));
    run(Command::new("rsync")
        .arg("-a")
        .arg(format!("{}/", tree.display()))
        .arg(format!("{}/", mnt.join("rsync").display())));
    std::fs::create_dir(mnt.join("py")).unwrap();
    run(Command::new("python3")
        .arg("-c")
        .arg(PY_WRITER)
        .arg(mnt.join("py/metrics.csv")));

    let mut want = BTreeMap::new();
    want.extend(objects_of_tree(&tree, "cp/"));
    want.extend(objects_of_tree(&tree, "tar/tree/"));
    want.extend(objects_of_tree(&tree, "rsync/"));
    let csv: String = (0..100000u64)
        .map(|i| format!("{i},{},{}\n", i * i, i % 7))
        .collect();
    want.insert("py/metrics.csv".to_string(), object_of(csv.as_bytes()));

    s.trigger_exit_file();
    let code = s.wait_exit(Duration::from_secs(60));
    assert_eq!(code, 0, "{}", s.m.proc.stderr_text());
    s.assert_clean_end();
    // Exactly these objects: no rsync temp file, nothing missing.
    s.assert_bucket(&want);
}

#[test]
fn gcs_everyday_tools_cp_tar_rsync_python() {
    everyday_tools(Kind::Gcs);
}

#[test]
fn s3_everyday_tools_cp_tar_rsync_python() {
    everyday_tools(Kind::S3);
}

// ---------------------------------------------------------------- gcsfuse

/// The object's generation, from the server's JSON API (it changes with every upload).
fn generation(server: &Server, key: &str) -> String {
    let url = format!(
        "http://127.0.0.1:{}/storage/v1/b/{}/o/{key}",
        server.port, server.bucket
    );
    let mut r = ureq::get(&url)
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let v: serde_json::Value =
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    v["generation"].as_str().expect("generation").to_string()
}

/// gcsfuse v3.11.2 under drainfs with default flags (`--passthrough auto`: writers get kernel
/// passthrough on gcsfuse). A shared mapping holds the kernel's backing file, so drainfs's
/// RELEASE comes at the application's `close()` and the mapping's writes reach gcsfuse after
/// it, with no FLUSH: drainfs keeps the released writer's lower fd and closes it at the
/// teardown, which makes gcsfuse upload them. The same close on a file nobody changed since
/// its FLUSH must not upload it again (its generation stays).
#[test]
fn gcsfuse_a_mapping_written_after_close_reaches_the_bucket() {
    let _serial = serial();
    let ctl = tempfile::tempdir_in("/tmp").unwrap();
    let sock = ctl.path().join("ctl.sock");
    let sock_arg = sock.display().to_string();
    let mut s = stack_with(Kind::Gcsfuse, None, &["--control-socket", &sock_arg]);
    let plain = pattern(3, 64 * 1024);
    write_file(&s.m.path("plain.bin"), &plain).unwrap();
    let plain_gen = generation(&s.server, "plain.bin");
    write_file(&s.m.path("mapped.bin"), &[b'o'; 4096]).unwrap();
    let f = open(&s.m.path("mapped.bin"), libc::O_RDWR, 0).unwrap();
    // SAFETY: a fresh shared mapping of 4096 bytes, written within bounds, unmapped below.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        close(f).expect("close before any write");
        // drainfs has handled the RELEASE before the mapping is written.
        assert!(
            wait_until(Duration::from_secs(10), || common::status(&sock)
                .is_some_and(|v| v["outstanding"]["open_write"] == 0)),
            "drainfs never released the handle"
        );
        std::ptr::copy_nonoverlapping(b"AFTER".as_ptr(), p.cast::<u8>(), 5);
        assert_eq!(libc::munmap(p, 4096), 0);
    }
    s.trigger_exit_file();
    let code = s.wait_exit(Duration::from_secs(60));
    assert_eq!(code, 0, "{}", s.m.proc.stderr_text());
    let mut mapped = vec![b'o'; 4096];
    mapped[..5].copy_from_slice(b"AFTER");
    let want: BTreeMap<String, Object> = [
        ("plain.bin".to_string(), object_of(&plain)),
        ("mapped.bin".to_string(), object_of(&mapped)),
    ]
    .into_iter()
    .collect();
    s.assert_clean_end();
    s.assert_bucket(&want);
    assert_eq!(
        generation(&s.server, "plain.bin"),
        plain_gen,
        "gcsfuse uploaded an unchanged file again when drainfs closed its lower fd"
    );
}

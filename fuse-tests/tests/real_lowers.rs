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
use fuse_tests::fileops::SharedMap;
use fuse_tests::harness::wait_until;
use fuse_tests::lowers::{Kind, Object, Server, object_of, objects_of_tree, require_installed};
use fuse_tests::stack::{Stack, StackOpts, in_close, serial, write_file};
use nix::sys::signal::Signal;

/// drainfs runs with default flags over both lowers: `--passthrough auto` gives writers kernel
/// passthrough only on lowers known to keep per-inode write state, and rclone and s3fs are
/// not among them (rclone `--vfs-cache-mode off` uploads per file handle, and the kernel's
/// passthrough handle never gets a FLUSH: LOWERS-NOTES.md, section 4).
const MIB: usize = 1 << 20;

/// `passthrough`: `Some(mode)` passes `--passthrough mode`; `None` leaves drainfs's default.
fn stack(kind: Kind, passthrough: Option<&str>) -> Stack {
    stack_with(kind, passthrough, &[])
}

/// [`stack`] with more drainfs flags.
fn stack_with(kind: Kind, passthrough: Option<&str>, extra: &[&str]) -> Stack {
    Stack::start_with(
        kind,
        StackOpts {
            passthrough: passthrough.map(str::to_string),
            args: extra.iter().map(|s| s.to_string()).collect(),
            ..StackOpts::default()
        },
    )
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
    // drainfs unmounted and stopped the lower only after the upload had finished. On the
    // wall clock from drainfs's own trigger time (as in `real_gcsfuse.rs`): `drained_ms`
    // counts from when drainfs took the SIGTERM, and a loaded machine can deliver it well
    // after `signalled`, which counted against the drain as if it had ended early. `closed`
    // is taken when the writer runs again after close(2), which a loaded machine can also
    // delay: the 200 ms of slack; a drain declared during the upload would be early by more.
    let drained = Duration::from_millis(sum["timings"]["drained_ms"].as_u64().unwrap());
    let trigger = humantime::parse_rfc3339(sum["timings"]["trigger"].as_str().unwrap()).unwrap();
    let closed_wall = std::time::SystemTime::now() - closed.elapsed();
    assert!(
        trigger + drained + Duration::from_millis(200) >= closed_wall,
        "drained at {}, but close() returned at {} ({:?} after the SIGTERM): {sum}",
        humantime::format_rfc3339_millis(trigger + drained),
        humantime::format_rfc3339_millis(closed_wall),
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

/// What a write served by drainfs gets once its lower died: EIO while drainfs answers (the
/// lower's ENOTCONN, or the lower known gone); ENOTCONN once the forced teardown has detached
/// drainfs's mount and aborted its own connection, milliseconds after the lower's death, which
/// a write lands after when the dying lower still took the one before it (SIGKILL is delivered
/// asynchronously).
const AFTER_THE_LOWER_DIED: &[i32] = &[libc::EIO, libc::ENOTCONN];

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
fn gcs_lower_killed_while_a_file_is_open_fails_its_writes_and_exits_69() {
    lower_killed_while_a_file_is_open(Kind::Gcs, "never", AFTER_THE_LOWER_DIED);
}

#[test]
fn s3_lower_killed_while_a_file_is_open_fails_its_writes_and_exits_69() {
    lower_killed_while_a_file_is_open(Kind::S3, "never", AFTER_THE_LOWER_DIED);
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
    let mut map = SharedMap::new(&f, 4096, true);
    close(f).expect("close before any write");
    // drainfs has handled the RELEASE before the mapping is written.
    assert!(
        wait_until(Duration::from_secs(10), || common::status(&sock)
            .is_some_and(|v| v["outstanding"]["open_write"] == 0)),
        "drainfs never released the handle"
    );
    map.write_at(0, b"AFTER");
    map.unmap();
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

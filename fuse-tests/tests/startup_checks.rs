//! Start-up checks through the real binary: `--check-config` (for `run` and `relay`) runs
//! every check that needs no mount and exits 2 with one line per problem; malformed
//! `DRAINFS_*` and `NATIVE_SIDECAR` values are exit 2 naming the variable, for the mount and
//! for the gcsfuse drop-in alike. Nothing here mounts.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use fuse_tests::harness::bin;

fn drainfs(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin("drainfs"));
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn errors(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("drainfs: error: "))
        .map(str::to_string)
        .collect()
}

/// A directory with a lower and a mountpoint, and an executable `gcsfuse` that is never run.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        // Under the suite's bound: a FUSE mount made here is aborted and detached at its end.
        fuse_tests::bound::own_dir(dir.path());
        for d in ["lower", "mnt", "out"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        let g = dir.path().join("gcsfuse");
        std::fs::write(&g, "#!/bin/sh\nexit 1\n").unwrap();
        std::fs::set_permissions(&g, std::fs::Permissions::from_mode(0o755)).unwrap();
        Scratch { dir }
    }
    fn p(&self, rel: &str) -> String {
        self.dir.path().join(rel).display().to_string()
    }
}

#[test]
fn check_config_passes_a_good_run_configuration() {
    let s = Scratch::new();
    let out = drainfs(
        &[
            "run",
            "--lower",
            &s.p("lower"),
            "--mountpoint",
            &s.p("mnt"),
            "--summary-file",
            &s.p("out/summary.json"),
            "--check-config",
            "--",
            &s.p("gcsfuse"),
            "--foreground",
            "bucket",
            &s.p("lower"),
        ],
        &[],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cfg: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(cfg["lifecycle"]["lower_process"]["spawn"].is_object());
}

#[test]
fn check_config_reports_every_startup_problem_of_run() {
    let s = Scratch::new();
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id().to_string();
    child.wait().unwrap();
    let out = drainfs(
        &[
            "run",
            "--lower",
            &s.p("missing-lower"),
            "--mountpoint",
            &s.p("missing-mnt"),
            "--summary-file",
            &s.p("no-dir/summary.json"),
            "--termination-log",
            &s.p("no-dir/termination-log"),
            "--watch-pid",
            &dead,
            "--check-config",
            "--",
            &s.p("gcsfuse"),
            "bucket",
            "/somewhere/else",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let e = errors(&out);
    for want in [
        "--lower",
        "--mountpoint",
        "--summary-file",
        "--termination-log",
        "--watch-pid",
    ] {
        assert!(
            e.iter().any(|l| l.contains(want)),
            "no line for {want}: {e:#?}"
        );
    }

    // A gcsfuse without --foreground, mounting somewhere other than --lower.
    let out = drainfs(
        &[
            "run",
            "--lower",
            &s.p("lower"),
            "--mountpoint",
            &s.p("mnt"),
            "--check-config",
            "--",
            &s.p("gcsfuse"),
            "bucket",
            &s.p("mnt"),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let e = errors(&out);
    assert_eq!(e.len(), 2, "{e:#?}");
    assert!(e.iter().any(|l| l.contains("--foreground")), "{e:#?}");
    assert!(e.iter().any(|l| l.contains("not at --lower")), "{e:#?}");

    // A lower command that does not exist; the mountpoint inside the lower.
    std::fs::create_dir(s.dir.path().join("lower/inner")).unwrap();
    let out = drainfs(
        &[
            "run",
            "--lower",
            &s.p("lower"),
            "--mountpoint",
            &s.p("lower/inner"),
            "--check-config",
            "--",
            "no-such-gcsfuse-binary",
            "--foreground",
            "b",
            &s.p("lower"),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let e = errors(&out);
    assert!(e.iter().any(|l| l.contains("not found on PATH")), "{e:#?}");
    assert!(e.iter().any(|l| l.contains("inside --lower")), "{e:#?}");
}

#[test]
fn relay_check_config_checks_the_daemon_and_the_connection() {
    let s = Scratch::new();
    // No fd 3 in drainfs: the connection the node driver would pass is missing.
    let out = drainfs(
        &[
            "relay",
            "--check-config",
            "--",
            &s.p("gcsfuse"),
            "bucket",
            "/dev/fd/3",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        errors(&out).iter().any(|l| l.contains("fd 3")),
        "{:#?}",
        errors(&out)
    );
    // A daemon that does not exist and no /dev/fd/N.
    let out = drainfs(
        &[
            "relay",
            "--check-config",
            "--",
            "/nonexistent/gcsfuse",
            "bucket",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(errors(&out).len(), 2, "{:#?}", errors(&out));
    // fd 3 on a /dev/fuse that was never mounted: not a connection (it was relayed, and the
    // stop reported clean).
    let fuse = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .unwrap();
    let out = check_config_with_fd3(&s, &fuse);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        errors(&out)
            .iter()
            .any(|l| l.contains("not a live FUSE connection")),
        "{:#?}",
        errors(&out)
    );
    // The same fd once mounted with fd=N, as the node driver does: accepted.
    use std::os::fd::AsRawFd;
    let mnt = std::path::PathBuf::from(s.p("mnt"));
    nix::mount::mount(
        Some("check-config-test"),
        &mnt,
        Some("fuse"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(
            format!(
                "fd={},rootmode=40000,user_id=0,group_id=0",
                fuse.as_raw_fd()
            )
            .as_str(),
        ),
    )
    .unwrap();
    // Detached even when an assertion below fails (nothing ever answers this mount).
    struct Detach(std::path::PathBuf);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _detach = Detach(mnt);
    let out = check_config_with_fd3(&s, &fuse);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `drainfs relay --check-config -- gcsfuse bucket /dev/fd/3` with `fuse` as its fd 3.
fn check_config_with_fd3(s: &Scratch, fuse: &std::fs::File) -> Output {
    use std::os::fd::AsRawFd;
    let mut cmd = Command::new(bin("drainfs"));
    cmd.args([
        "relay",
        "--check-config",
        "--",
        &s.p("gcsfuse"),
        "bucket",
        "/dev/fd/3",
    ]);
    let raw = fuse.as_raw_fd();
    // SAFETY: dup2 in the child before exec, on an fd the parent keeps open.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            // dup2 onto itself keeps FD_CLOEXEC: clear it either way.
            if libc::dup2(raw, 3) < 0 || libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().unwrap()
}

#[test]
fn malformed_environment_values_are_usage_errors_naming_the_variable() {
    let s = Scratch::new();
    let run = [
        "run",
        "--lower",
        &s.p("lower"),
        "--mountpoint",
        &s.p("mnt"),
        "--check-config",
    ];
    for (k, v) in [
        ("DRAINFS_LOG_LEVEL", "warning"),
        ("DRAINFS_GRACE_PERIOD", "60 seconds please"),
        ("DRAINFS_NATIVE_SIDECAR", "yes"),
        ("DRAINFS_PASSTHROUGH", "sometimes"),
        ("DRAINFS_QUIET_PERIOD", ""),
        ("NATIVE_SIDECAR", "yes"),
        ("NATIVE_SIDECAR", "on"),
    ] {
        let out = drainfs(&run, &[(k, v)]);
        assert_eq!(out.status.code(), Some(2), "{k}={v}");
        let e = errors(&out);
        assert!(e.len() == 1 && e[0].contains(k), "{k}={v}: {e:#?}");
    }
    for v in ["1", "t", "T", "TRUE", "true", "True"] {
        let out = drainfs(&run, &[("NATIVE_SIDECAR", v)]);
        assert_eq!(out.status.code(), Some(0), "NATIVE_SIDECAR={v}");
        let cfg: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            cfg["lifecycle"]["native_sidecar"], true,
            "NATIVE_SIDECAR={v}"
        );
    }
    for v in ["0", "f", "F", "FALSE", "false", "False"] {
        let out = drainfs(&run, &[("NATIVE_SIDECAR", v)]);
        assert_eq!(out.status.code(), Some(0), "NATIVE_SIDECAR={v}");
        let cfg: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            cfg["lifecycle"]["native_sidecar"], false,
            "NATIVE_SIDECAR={v}"
        );
    }
    // The gcsfuse drop-in (argv[0] `gcsfuse`): the same strictness, exit 2 before anything
    // starts.
    let dropin = s.dir.path().join("dropin/gcsfuse");
    std::fs::create_dir(dropin.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(bin("drainfs"), &dropin).unwrap();
    let out = Command::new(&dropin)
        .args(["--foreground", "bucket", "/dev/fd/3"])
        .env_clear()
        .env("DRAINFS_LOG_LEVEL", "warning")
        .env("DRAINFS_REAL_GCSFUSE", Path::new("/bin/true"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        errors(&out).iter().any(|l| l.contains("DRAINFS_LOG_LEVEL")),
        "{:#?}",
        errors(&out)
    );
}

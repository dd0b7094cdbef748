//! Observability and control through the real binary: probes flipping over the
//! lifecycle, metrics parsed by the reference OpenMetrics parser and equal to what the test did,
//! quit/drain endpoints, the control socket subcommands, `drainfs cleanup`, JSON logs and the
//! ready file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{admin_base, free_addr, summary_cause};
use fuse_tests::harness::{MountOpts, Mounted, bin, is_mounted, make_dirs, wait_until};
use nix::sys::signal::Signal;

const LOWERS_PYTHON: &str = "/opt/drainfs-lowers/venv/bin/python";

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// `(status, body)` of a GET.
fn get(base: &str, path: &str) -> (u16, String) {
    let mut r = agent()
        .get(format!("{base}{path}"))
        .call()
        .expect("admin server answers");
    (
        r.status().as_u16(),
        r.body_mut().read_to_string().unwrap_or_default(),
    )
}

fn post(base: &str, path: &str) -> u16 {
    agent()
        .post(format!("{base}{path}"))
        .send_empty()
        .expect("admin server answers")
        .status()
        .as_u16()
}

/// A drainfs whose lower (bucketfs) takes `delay` to appear, with the admin server on a free
/// loopback port (unless `extra` names one), a control socket, a ready file and a summary
/// file (`summary.json` in the mount's directory).
fn start(delay: &str, extra: &[&str]) -> (Mounted, PathBuf, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("drainfs-obs-")
        .tempdir_in("/tmp")
        .unwrap();
    let [lower, mnt, bucket] = make_dirs(dir.path(), ["lower", "mnt", "bucket"]);
    let sock = dir.path().join("ctl.sock");
    let ready = dir.path().join("ready");
    let mut args: Vec<String> = Vec::new();
    if !extra.contains(&"--admin-addr") {
        args.extend(["--admin-addr".to_string(), free_addr("127.0.0.1")]);
    }
    args.extend([
        "--summary-file".into(),
        dir.path().join("summary.json").display().to_string(),
        "--control-socket".into(),
        sock.display().to_string(),
        "--ready-file".into(),
        ready.display().to_string(),
    ]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let script = format!(
        "sleep {delay}; exec {} --bucket {} --mountpoint {}",
        bin("bucketfs").display(),
        bucket.display(),
        lower.display()
    );
    let m = Mounted::start_in(
        dir,
        lower,
        mnt,
        MountOpts {
            args,
            lower_cmd: vec!["sh".into(), "-c".into(), script],
            no_wait: true,
        },
    );
    (m, sock, ready)
}

#[test]
fn probes_flip_at_the_right_moments() {
    let (mut m, _sock, ready) = start("1.5", &["--quiet-period", "300ms"]);
    let base = admin_base(&m);
    // Starting: the lower is not mounted yet.
    assert_eq!(get(&base, "/startupz").0, 503);
    assert_eq!(get(&base, "/readyz").0, 503);
    assert_eq!(get(&base, "/livez").0, 200, "starting is alive");
    assert!(!ready.exists());
    m.wait_serving(Duration::from_secs(20));
    assert!(wait_until(Duration::from_secs(5), || get(
        &base,
        "/startupz"
    )
    .0 == 200));
    assert_eq!(get(&base, "/readyz").0, 200);
    let (code, body) = get(&base, "/livez?verbose");
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("[+] fuse_loop") && body.contains("[+] lower"),
        "{body}"
    );
    assert!(ready.exists(), "ready file written once serving");

    // A wedged lower turns liveness false within the bound (and back once it answers).
    let lower_pid = m.proc.child_pid();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(lower_pid), Signal::SIGSTOP).unwrap();
    let t = Instant::now();
    let (code, body) = get(&base, "/livez?verbose");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("[-] lower"), "{body}");
    assert!(t.elapsed() < Duration::from_secs(5));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(lower_pid), Signal::SIGCONT).unwrap();
    assert!(wait_until(Duration::from_secs(10), || get(&base, "/livez")
        .0
        == 200));

    // Draining: ready turns false at once, while the mount still serves an open handle.
    let mut f = std::fs::File::create(m.path("held")).unwrap();
    assert_eq!(post(&base, "/drain"), 200);
    // At once when idle; the waits are loose for a loaded machine (the held file keeps the
    // mount serving meanwhile).
    assert!(wait_until(Duration::from_secs(10), || get(
        &base, "/readyz"
    )
    .0 == 503));
    assert!(
        wait_until(Duration::from_secs(10), || !ready.exists()),
        "ready file removed when draining begins"
    );
    assert_eq!(get(&base, "/startupz").0, 200);
    f.write_all(b"still served").unwrap();
    drop(f);
    // Drain, not quit: drainfs closes the door after the quiet period and exits by itself.
    let st = m
        .proc
        .wait_timeout(Duration::from_secs(20))
        .expect("exits after draining");
    assert_eq!(st.code(), Some(0), "{}", m.proc.stderr_text());
    assert!(!is_mounted(&m.mnt));
}

/// Parses OpenMetrics text with the reference parser (prometheus_client) and returns
/// `{"name{labels}": value}` for every sample.
fn parse_metrics(text: &str) -> serde_json::Value {
    let script = r#"
import sys, json
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
        out[f"{s.name}{{{labels}}}"] = s.value
print(json.dumps(out))
"#;
    assert!(
        Path::new(LOWERS_PYTHON).exists(),
        "{LOWERS_PYTHON} missing: run scripts/install-lowers.sh (it installs the reference metrics parser)"
    );
    let mut child = Command::new(LOWERS_PYTHON)
        .arg("-c")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "metrics do not parse: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn metric(m: &serde_json::Value, key: &str) -> f64 {
    m.get(key)
        .and_then(|v| v.as_f64())
        .unwrap_or_else(|| panic!("metric {key} missing"))
}

#[test]
fn metrics_parse_and_count_what_the_test_did() {
    let (mut m, sock, _ready) = start("0", &["--passthrough", "never"]);
    m.wait_serving(Duration::from_secs(20));
    let base = admin_base(&m);
    let before = parse_metrics(&get(&base, "/metrics").1);
    std::fs::create_dir(m.path("d")).unwrap();
    for i in 0..7 {
        std::fs::write(m.path(&format!("d/f{i}")), vec![b'x'; 1000]).unwrap();
    }
    for i in 0..3 {
        assert_eq!(
            std::fs::read(m.path(&format!("d/f{i}"))).unwrap().len(),
            1000
        );
    }
    // An error only the lower can give (the kernel answers EEXIST from its own cache).
    let e = std::fs::remove_dir(m.path("d")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
    let held = std::fs::File::open(m.path("d/f0")).unwrap();
    // drainfs counts a request when its handler ends, after the reply (a worker can answer
    // and be descheduled before it counts: 6 CREATEs of 7 seen in a loaded suite run), and the
    // kernel sends RELEASE after close() has returned. So the snapshot asserted is the first
    // with nothing in flight and only `held` open (or the last at 10 s, to fail with).
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let after = parse_metrics(&get(&base, "/metrics").1);
        let settled = metric(&after, r#"drainfs_requests_in_flight{}"#) == 0.0
            && metric(&after, r#"drainfs_open_handles{mode="write"}"#) == 0.0
            && metric(&after, r#"drainfs_open_handles{mode="read"}"#) == 1.0;
        if settled || Instant::now() > deadline {
            break after;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let delta = |k: &str| metric(&after, k) - before.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
    assert_eq!(delta(r#"drainfs_requests_total{op="create"}"#), 7.0);
    assert_eq!(delta(r#"drainfs_requests_total{op="mkdir"}"#), 1.0);
    assert_eq!(delta(r#"drainfs_requests_total{op="rmdir"}"#), 1.0);
    assert_eq!(delta(r#"drainfs_request_errors_total{op="rmdir"}"#), 1.0);
    assert_eq!(delta(r#"drainfs_handles_opened_total{mode="write"}"#), 7.0);
    assert_eq!(delta(r#"drainfs_handles_opened_total{mode="read"}"#), 4.0);
    // One FLUSH per close: the 7 written files and the 3 read-only opens drainfs serves
    // (`never`; a passthrough read-only open needs none). At least 10, not exactly: the kernel
    // sends a FLUSH for every close of an fd, and a child that another test thread forks while
    // one of these files is open closes its copy of the fd at exec (O_CLOEXEC), which is a
    // FLUSH of its own (seen under load: 11).
    let flushes = delta(r#"drainfs_requests_total{op="flush"}"#);
    assert!(
        (10.0..=20.0).contains(&flushes),
        "one FLUSH per close (10), plus at most one per close of a forked copy: {flushes}"
    );
    assert_eq!(delta(r#"drainfs_written_bytes_total{}"#), 7000.0);
    assert_eq!(delta(r#"drainfs_read_bytes_total{}"#), 3000.0);
    assert_eq!(metric(&after, r#"drainfs_open_handles{mode="read"}"#), 1.0);
    assert_eq!(metric(&after, r#"drainfs_open_handles{mode="write"}"#), 0.0);
    assert_eq!(metric(&after, r#"drainfs_phase{phase="serving"}"#), 1.0);
    assert_eq!(metric(&after, r#"drainfs_lower_up{}"#), 1.0);
    // Every FLUSH drainfs served flushed the lower once.
    assert_eq!(
        delta(r#"drainfs_lower_flush_duration_seconds_count{}"#),
        flushes
    );
    assert!(
        metric(
            &after,
            r#"drainfs_request_duration_seconds_count{op="create"}"#
        ) >= 7.0
    );
    assert!(
        after
            .as_object()
            .unwrap()
            .keys()
            .all(|k| k.starts_with("drainfs_"))
    );

    // `drainfs status --json` and `/status` agree.
    let out = Command::new(bin("drainfs"))
        .args(["status", "--json", "--control-socket"])
        .arg(&sock)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let via_socket: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let via_http: serde_json::Value = serde_json::from_str(&get(&base, "/status").1).unwrap();
    for key in ["phase", "open_paths", "init", "lower_up"] {
        assert_eq!(via_socket[key], via_http[key], "{key}");
    }
    // The open handles agree; the requests in flight need not: forking `drainfs status` (and
    // any other test thread's fork) while `d/f0` is open closes the child's copy of its fd at
    // exec, a FLUSH that one snapshot can catch in flight and the other not (seen under
    // `stress-ng --cpu 2`: `in_flight` 1 and `lower_flush` 1 through the socket, 0 over HTTP).
    for key in ["open_read", "open_write", "open_dirs"] {
        assert_eq!(
            via_socket["outstanding"][key], via_http["outstanding"][key],
            "outstanding.{key}"
        );
    }
    assert_eq!(via_http["outstanding"]["open_read"], 1);
    assert_eq!(via_http["open_paths"][0][0], "d/f0");
    drop(held);

    // After a quit, the trigger counter and the phase move.
    assert_eq!(post(&base, "/quitquitquit"), 200);
    let st = m.proc.wait_timeout(Duration::from_secs(20)).expect("exits");
    assert_eq!(st.code(), Some(0));
}

#[test]
fn quitquitquit_is_post_only_and_loopback_only() {
    // Bind on every address so a non-loopback peer can reach it.
    let addr = free_addr("0.0.0.0");
    let (mut m, _sock, _ready) = start("0", &["--admin-addr", &addr]);
    m.wait_serving(Duration::from_secs(20));
    let base = admin_base(&m);
    assert_eq!(
        agent()
            .get(format!("{base}/quitquitquit"))
            .call()
            .unwrap()
            .status()
            .as_u16(),
        405
    );
    assert_eq!(
        agent()
            .get(format!("{base}/drain"))
            .call()
            .unwrap()
            .status()
            .as_u16(),
        405
    );
    if let Some(ip) = non_loopback_ipv4() {
        let port = base.rsplit(':').next().unwrap();
        let status = agent()
            .post(format!("http://{ip}:{port}/quitquitquit"))
            .send_empty()
            .unwrap()
            .status()
            .as_u16();
        assert_eq!(status, 403, "a non-loopback peer must be refused");
        assert_eq!(
            get(&base, "/readyz").0,
            200,
            "a refused request must not trigger anything"
        );
    } else {
        eprintln!(
            "note: no non-loopback IPv4 address on this machine; the 403 case was not exercised"
        );
    }
    assert_eq!(post(&base, "/quitquitquit"), 200);
    let st = m.proc.wait_timeout(Duration::from_secs(20)).expect("exits");
    assert_eq!(st.code(), Some(0), "{}", m.proc.stderr_text());
    assert_eq!(
        summary_cause(&m.dir.path().join("summary.json")),
        "quit_request"
    );
    assert!(!is_mounted(&m.mnt));
}

#[test]
fn status_names_open_files_only_to_loopback_peers() {
    // Bound on every address, as the relay image's 0.0.0.0:29090: a peer beyond the pod gets
    // the counts, not the workload's file names.
    let addr = free_addr("0.0.0.0");
    let (mut m, _sock, _ready) = start("0", &["--admin-addr", &addr]);
    m.wait_serving(Duration::from_secs(20));
    let base = admin_base(&m);
    std::fs::write(m.path("secret-name.bin"), b"x").unwrap();
    let held = std::fs::OpenOptions::new()
        .append(true)
        .open(m.path("secret-name.bin"))
        .unwrap();
    let local: serde_json::Value = serde_json::from_str(&get(&base, "/status").1).unwrap();
    assert_eq!(local["open_paths"][0][0], "secret-name.bin", "{local}");
    assert!(local.get("open_paths_hidden").is_none(), "{local}");
    let ip = non_loopback_ipv4().expect(
        "a non-loopback IPv4 address on this machine (`hostname -I`), to reach the admin server \
         from beyond loopback",
    );
    let port = base.rsplit(':').next().unwrap();
    let (code, body) = get(&format!("http://{ip}:{port}"), "/status");
    assert_eq!(code, 200, "{body}");
    let remote: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(remote["open_paths"], serde_json::json!([]), "{remote}");
    assert_eq!(remote["open_paths_hidden"], 1, "{remote}");
    assert_eq!(remote["outstanding"]["open_write"], 1, "{remote}");
    assert!(!body.contains("secret-name"), "{body}");
    drop(held);
    assert_eq!(post(&base, "/quitquitquit"), 200);
    let st = m.proc.wait_timeout(Duration::from_secs(20)).expect("exits");
    assert_eq!(st.code(), Some(0), "{}", m.proc.stderr_text());
}

fn non_loopback_ipv4() -> Option<String> {
    let out = Command::new("hostname").arg("-I").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|a| a.contains('.') && !a.starts_with("127."))
        .map(str::to_string)
}

#[test]
fn wait_returns_only_once_the_mount_serves_and_shutdown_wait_blocks_until_exit() {
    let (mut m, sock, _ready) = start("1.5", &[]);
    let t = Instant::now();
    let out = Command::new(bin("drainfs"))
        .args(["wait", "--timeout", "30s", "--control-socket"])
        .arg(&sock)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        t.elapsed() >= Duration::from_millis(1000),
        "returned before the lower could be ready"
    );
    assert!(is_mounted(&m.mnt));
    std::fs::write(m.path("usable"), b"yes").unwrap();
    let out = Command::new(bin("drainfs"))
        .args(["shutdown", "--wait", "--control-socket"])
        .arg(&sock)
        .output()
        .unwrap();
    assert!(out.status.success());
    // --wait returns once drainfs is gone (its socket removed at exit).
    assert!(
        m.proc.wait_timeout(Duration::from_secs(2)).is_some(),
        "shutdown --wait returned before drainfs exited"
    );
    assert!(!is_mounted(&m.mnt));
}

#[test]
fn wait_times_out_with_124_when_nothing_serves() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin("drainfs"))
        .args(["wait", "--timeout", "300ms", "--control-socket"])
        .arg(dir.path().join("none.sock"))
        .output()
        .unwrap();
    // Its own code: 75 means "data may be incomplete" everywhere else.
    assert_eq!(out.status.code(), Some(124));
}

#[test]
fn cleanup_repairs_a_mount_left_by_a_killed_drainfs() {
    let mut m = Mounted::new("auto");
    std::fs::write(m.path("f"), b"x").unwrap();
    m.proc.signal(Signal::SIGKILL);
    m.proc.wait_timeout(Duration::from_secs(5)).unwrap();
    assert!(dead_soon(&m.mnt), "a dead mount is left");
    let run = |args: &[&str]| {
        Command::new(bin("drainfs"))
            .arg("cleanup")
            .args(args)
            .arg(&m.mnt)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&m.mnt));
    assert!(
        std::fs::metadata(&m.mnt).unwrap().is_dir(),
        "the path is usable again"
    );
    // Idempotent.
    assert!(run(&[]).status.success());
    // A live, healthy mount is left alone unless --force.
    let live = Mounted::new("auto");
    let out = Command::new(bin("drainfs"))
        .arg("cleanup")
        .arg(&live.mnt)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(is_mounted(&live.mnt), "live mount must be left alone");
    let out = Command::new(bin("drainfs"))
        .args(["cleanup", "--force"])
        .arg(&live.mnt)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!is_mounted(&live.mnt));
}

#[test]
fn json_logs_are_one_object_per_line() {
    let mut m = Mounted::start(MountOpts {
        args: vec!["--log-format".into(), "json".into()],
        ..Default::default()
    });
    std::fs::write(m.path("a"), b"a").unwrap();
    assert_eq!(m.stop(Duration::from_secs(20)).code(), Some(0));
    let lines = m.proc.stderr_lines();
    assert!(lines.len() >= 5);
    let mut transitions = 0;
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"));
        for key in ["timestamp", "severity", "message"] {
            assert!(v.get(key).is_some(), "{key} missing in {line}");
        }
        assert!(["DEBUG", "INFO", "WARNING", "ERROR"].contains(&v["severity"].as_str().unwrap()));
        if v.get("from").is_some() && v.get("to").is_some() {
            transitions += 1;
            assert!(v.get("cause").is_some(), "transition without cause: {line}");
        }
    }
    assert!(transitions >= 4, "every transition is logged");
}

#[test]
fn run_repairs_a_dead_mount_at_its_own_mountpoint() {
    let mut m = Mounted::new("auto");
    m.proc.signal(Signal::SIGKILL);
    m.proc.wait_timeout(Duration::from_secs(5)).unwrap();
    assert!(dead_soon(&m.mnt), "a dead mount is left");
    // A restarted sidecar: same paths, the dead mount still there.
    let (dir, lower, mnt) = (tempfile::tempdir().unwrap(), m.lower.clone(), m.mnt.clone());
    // It mounts over the dead mount (the harness waits until it serves) and serves there.
    let mut again = Mounted::start_in(dir, lower, mnt, MountOpts::default());
    std::fs::write(again.path("after-restart"), b"ok").unwrap();
    assert_eq!(
        std::fs::read(again.lower_path("after-restart")).unwrap(),
        b"ok"
    );
    assert_eq!(again.stop(Duration::from_secs(20)).code(), Some(0));
}

/// Whether `path` turns into a dead mount (ENOTCONN) within 5 s: the kernel may answer a stat
/// from its attribute cache (TTL 1 s) for a moment after the daemon died.
fn dead_soon(path: &Path) -> bool {
    wait_until(Duration::from_secs(5), || {
        std::fs::metadata(path).err().and_then(|e| e.raw_os_error()) == Some(libc::ENOTCONN)
    })
}

/// An admin address already in use is a start-up error: one line, exit 2, before the lower is
/// started or anything is mounted (it used to be found later, with an exit code that depended
/// on timing).
#[test]
fn admin_address_in_use_fails_before_anything_starts() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap();
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let [lower, mnt] = make_dirs(dir.path(), ["lower", "mnt"]);
    let marker = dir.path().join("lower-started");
    let out = std::process::Command::new(fuse_tests::harness::bin("drainfs"))
        .args(["run", "--lower"])
        .arg(&lower)
        .arg("--mountpoint")
        .arg(&mnt)
        .arg("--admin-addr")
        .arg(addr.to_string())
        .args(["--", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(!marker.exists(), "the lower was started");
    assert!(!fuse_tests::harness::is_mounted(&mnt));
}

/// Settings that would only fail at shutdown (a summary file in a missing directory) or make
/// drainfs stop at once (a watched pid that does not exist) are start-up errors: one line,
/// exit 2, nothing mounted.
#[test]
fn outputs_and_watched_pid_are_checked_at_start() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let [lower, mnt] = make_dirs(dir.path(), ["lower", "mnt"]);
    let missing = dir.path().join("no-such-dir").join("summary.json");
    let missing_sock = dir.path().join("no-such-dir").join("control.sock");
    let cases: [&[&str]; 3] = [
        &["--summary-file", missing.to_str().unwrap()],
        &["--watch-pid", "999999999"],
        &["--control-socket", missing_sock.to_str().unwrap()],
    ];
    for extra in cases {
        let out = Command::new(bin("drainfs"))
            .args(["run", "--lower"])
            .arg(&lower)
            .arg("--mountpoint")
            .arg(&mnt)
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "{extra:?}: {stderr}");
        assert!(!is_mounted(&mnt));
    }
}

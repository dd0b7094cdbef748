//! drainfs in the mount topology of a Kubernetes pod, on one machine (`fuse_tests::pod`): the
//! volumes are bind mounts, drainfs and its lower run in a sidecar container (own mount
//! namespace, the shared volume Bidirectional, drainfs as PID 1 of its own PID namespace), the
//! application in another container (HostToContainer) that must see drainfs's mount propagate.
//!
//! Each scenario checks what a pod depends on: drainfs accepts bind-mounted volumes, the
//! application sees the mount, the stop behaves as documented (exit code, the ready file), every
//! file is complete in the bucket, and afterwards the volumes' own bind mounts are still there
//! (the same mount IDs, on the node and inside the sidecar's namespace) with nothing else left
//! mounted.

use std::process::Command;
use std::time::Duration;

use fuse_tests::harness::{bin, wait_until};
use fuse_tests::lowers::{Kind, Server, object_of, require_installed};
use fuse_tests::pod::{Container, Pod, mountinfo_of, top_at};
use nix::sys::signal::Signal;

/// Files the application writes.
const FILES: usize = 12;

/// The content of the application's file `i` (what `seq 1 (i*997)` prints).
fn content(i: usize) -> Vec<u8> {
    (1..=i * 997)
        .map(|n| format!("{n}\n"))
        .collect::<String>()
        .into_bytes()
}

/// The application container's script: checks it is PID 1, waits until drainfs's mount has
/// propagated into its own mount namespace and the ready file exists, writes `FILES` files
/// under `out/`, then writes the exit file (temp file + rename) and exits 0.
fn app_script(pod: &Pod) -> String {
    let data = pod.data.path.display();
    let signal = pod.signal.path.display();
    format!(
        r#"set -eu
[ "$$" = 1 ] || {{ echo "app is not PID 1 of its namespace" >&2; exit 9; }}
n=0
until grep -Eq " {data} .* - fuse(\.drainfs)? drainfs " /proc/self/mountinfo; do
  n=$((n+1)); [ $n -lt 600 ] || {{ echo "drainfs's mount never reached the application" >&2; exit 10; }}
  sleep 0.05
done
n=0
until [ -e {signal}/ready ]; do
  n=$((n+1)); [ $n -lt 600 ] || {{ echo "no ready file" >&2; exit 11; }}
  sleep 0.05
done
mkdir -p {data}/out
for i in $(seq 1 {FILES}); do seq 1 $((i*997)) > {data}/out/f-$i; done
: > {signal}/.exit.tmp
mv {signal}/.exit.tmp {signal}/exit
"#
    )
}

/// `drainfs run` for the sidecar, with the exit and ready files in the signal volume and the
/// summary in `run/`, then `--` and the lower's command.
fn sidecar_argv(pod: &Pod, extra: &[&str], lower_cmd: Vec<String>) -> Vec<String> {
    let mut argv: Vec<String> = vec![
        bin("drainfs").display().to_string(),
        "run".into(),
        "--lower".into(),
        pod.lower.path.display().to_string(),
        "--mountpoint".into(),
        pod.data.path.display().to_string(),
        "--exit-file".into(),
        pod.signal.path.join("exit").display().to_string(),
        "--ready-file".into(),
        pod.signal.path.join("ready").display().to_string(),
        "--summary-file".into(),
        pod.path("run/summary.json").display().to_string(),
        "--lower-ready-timeout".into(),
        "30s".into(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    argv.push("--".into());
    argv.extend(lower_cmd);
    argv
}

fn bucketfs_cmd(pod: &Pod) -> Vec<String> {
    vec![
        bin("bucketfs").display().to_string(),
        "--bucket".into(),
        pod.path("bucket").display().to_string(),
        "--mountpoint".into(),
        pod.lower.path.display().to_string(),
    ]
}

fn log_env() -> Vec<(String, String)> {
    vec![(
        "RUST_LOG".into(),
        std::env::var("DRAINFS_TEST_LOG").unwrap_or_else(|_| "info".into()),
    )]
}

/// PID 1 of the sidecar is drainfs: its comm, and `NSpid: <node pid> 1`.
fn assert_drainfs_is_pid1(c: &Container) {
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", c.pid1)).unwrap_or_default();
    let status = std::fs::read_to_string(format!("/proc/{}/status", c.pid1)).unwrap_or_default();
    let nspid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .unwrap_or("")
        .split_whitespace()
        .last()
        .map(str::to_string);
    assert_eq!(comm.trim(), "drainfs");
    assert_eq!(
        nspid.as_deref(),
        Some("1"),
        "drainfs is not PID 1: {status}"
    );
}

fn stderr_of(c: &Container) -> String {
    c.proc.stderr_text()
}

/// The pod's lifecycle over bucketfs: bind-mounted volumes are accepted, the application (own
/// namespaces, HostToContainer) sees the mount and writes through it, the exit file stops
/// drainfs with exit 0, every object is complete, and the volumes survive teardown.
#[test]
fn pod_lifecycle_over_bucketfs() {
    let pod = Pod::new();
    // The application starts first (legacy sidecar pods start both at once): the mount must
    // reach a namespace that existed before drainfs mounted.
    let mut app = Container::app(&app_script(&pod));
    let mut sidecar = Container::sidecar(&sidecar_argv(&pod, &[], bucketfs_cmd(&pod)), &log_env());
    let ready = pod.signal.path.join("ready");
    assert!(
        wait_until(Duration::from_secs(30), || ready.exists()),
        "drainfs never became ready:\n{}",
        stderr_of(&sidecar)
    );
    assert_drainfs_is_pid1(&sidecar);
    // The mount propagated to the node (Bidirectional), stacked on the volume's bind mount.
    let node = mountinfo_of("self");
    let top = top_at(&node, &pod.data.path).expect("a mount at data");
    assert_eq!(top.source, "drainfs", "{top:?}");
    assert_eq!(
        top.parent, pod.data.id,
        "drainfs is not stacked on the volume"
    );
    // The volumes as the sidecar sees them, before teardown.
    let inside = mountinfo_of(&sidecar.pid1.to_string());
    let in_sidecar = vec![
        pod.volume_mount(&inside, &pod.data.path),
        pod.volume_mount(&inside, &pod.lower.path),
    ];
    assert!(
        top_at(&inside, &pod.lower.path)
            .is_some_and(|m| m.is_fuse() && m.source.starts_with("bucketfs:")),
        "bucketfs is not mounted on the lower volume: {inside:#?}"
    );

    let st = app
        .wait_timeout(Duration::from_secs(60))
        .expect("app exits");
    assert_eq!(
        st.code(),
        Some(0),
        "app failed:\n{}",
        app.proc.stderr_text()
    );
    let st = sidecar
        .wait_timeout(Duration::from_secs(30))
        .expect("drainfs exits after the exit file");
    assert_eq!(st.code(), Some(0), "{}", stderr_of(&sidecar));
    assert!(!ready.exists(), "the ready file outlived drainfs");
    for i in 1..=FILES {
        let got = std::fs::read(pod.path(&format!("bucket/out/f-{i}")))
            .unwrap_or_else(|e| panic!("object out/f-{i}: {e}"));
        assert!(
            got == content(i),
            "object out/f-{i} is incomplete ({} B)",
            got.len()
        );
    }
    pod.assert_volumes_intact(&sidecar, &in_sidecar);
}

/// A live FUSE mount at the mountpoint is still refused (exit 2), and left alone.
#[test]
fn live_fuse_mount_at_the_mountpoint_is_refused() {
    let pod = Pod::new();
    let mut squatter = fuse_tests::harness::Proc::spawn({
        let mut c = Command::new(bin("bucketfs"));
        c.arg("--bucket")
            .arg(pod.path("bucket"))
            .arg("--mountpoint")
            .arg(&pod.data.path);
        c
    });
    assert!(wait_until(Duration::from_secs(10), || top_at(
        &mountinfo_of("self"),
        &pod.data.path
    )
    .is_some_and(|m| m.source.starts_with("bucketfs:"))));
    let out = Command::new(bin("drainfs"))
        .arg("run")
        .arg("--lower")
        .arg(&pod.lower.path)
        .arg("--mountpoint")
        .arg(&pod.data.path)
        .arg("--")
        .args(bucketfs_cmd(&pod))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        top_at(&mountinfo_of("self"), &pod.data.path)
            .is_some_and(|m| m.source.starts_with("bucketfs:")),
        "the live mount was touched"
    );
    squatter.signal(Signal::SIGINT);
    assert!(squatter.wait_timeout(Duration::from_secs(10)).is_some());
    assert!(pod.data.present());
}

/// The pod over a real lower (rclone over fake-gcs-server) with default flags: the application
/// writes through the mount, the exit file stops everything, every object is complete on the
/// server, and the volumes survive (rclone unmounts itself on SIGINT, which must not make
/// drainfs remove the lower volume's bind mount).
#[test]
fn pod_lifecycle_over_rclone_with_default_flags() {
    require_installed(&[]);
    let server = Server::start(Kind::Gcs);
    let pod = Pod::new();
    let mut app = Container::app(&app_script(&pod));
    let mut lower_cmd = server.mount_cmd(&pod.lower.path);
    // rclone refuses a mountpoint that is already a mount point (the volume) without this;
    // gcsfuse has no such check.
    lower_cmd.push("--allow-non-empty".into());
    let mut sidecar = Container::sidecar(&sidecar_argv(&pod, &[], lower_cmd), &log_env());
    let ready = pod.signal.path.join("ready");
    assert!(
        wait_until(Duration::from_secs(40), || ready.exists()),
        "drainfs never became ready:\n{}",
        stderr_of(&sidecar)
    );
    assert_drainfs_is_pid1(&sidecar);
    let inside = mountinfo_of(&sidecar.pid1.to_string());
    let in_sidecar = vec![
        pod.volume_mount(&inside, &pod.data.path),
        pod.volume_mount(&inside, &pod.lower.path),
    ];
    assert_eq!(
        top_at(&inside, &pod.lower.path).map(|m| m.fstype),
        Some(Kind::Gcs.fstype().to_string())
    );
    let st = app
        .wait_timeout(Duration::from_secs(90))
        .expect("app exits");
    assert_eq!(
        st.code(),
        Some(0),
        "app failed:\n{}",
        app.proc.stderr_text()
    );
    let st = sidecar
        .wait_timeout(Duration::from_secs(60))
        .expect("drainfs exits after the exit file");
    assert_eq!(st.code(), Some(0), "{}", stderr_of(&sidecar));
    assert!(!ready.exists());
    let objects = server.objects();
    for i in 1..=FILES {
        let key = format!("out/f-{i}");
        assert_eq!(
            objects.get(&key),
            Some(&object_of(&content(i))),
            "object {key} on the server"
        );
    }
    pod.assert_volumes_intact(&sidecar, &in_sidecar);
}

/// The production shape over the real gcsfuse v3.11.2 (fake-gcs-server on loopback) with
/// drainfs's default flags: drainfs is PID 1 of the sidecar, gcsfuse mounts the lower volume
/// inside the sidecar's namespace (where `auto` gives writers kernel passthrough), the
/// application writes through the propagated mount from its own namespace, the exit file stops
/// everything with exit 0 and gcsfuse's own exit 0 after drainfs's SIGINT, every object is
/// complete on the server, and the volumes survive.
#[test]
fn pod_lifecycle_over_gcsfuse_with_default_flags() {
    require_installed(&[]);
    let server = Server::start(Kind::Gcsfuse);
    let pod = Pod::new();
    let mut app = Container::app(&app_script(&pod));
    let lower_cmd = server.mount_cmd(&pod.lower.path);
    let mut sidecar = Container::sidecar(&sidecar_argv(&pod, &[], lower_cmd), &log_env());
    let ready = pod.signal.path.join("ready");
    assert!(
        wait_until(Duration::from_secs(40), || ready.exists()),
        "drainfs never became ready:\n{}",
        stderr_of(&sidecar)
    );
    assert_drainfs_is_pid1(&sidecar);
    let inside = mountinfo_of(&sidecar.pid1.to_string());
    let in_sidecar = vec![
        pod.volume_mount(&inside, &pod.data.path),
        pod.volume_mount(&inside, &pod.lower.path),
    ];
    assert_eq!(
        top_at(&inside, &pod.lower.path).map(|m| m.fstype),
        Some(Kind::Gcsfuse.fstype().to_string()),
        "gcsfuse is not mounted on the lower volume: {inside:#?}"
    );
    // gcsfuse's mount stays inside the sidecar (the lower volume is private there).
    assert!(
        top_at(&mountinfo_of("self"), &pod.lower.path).is_some_and(|m| !m.is_fuse()),
        "gcsfuse's mount leaked to the node"
    );
    let st = app
        .wait_timeout(Duration::from_secs(90))
        .expect("app exits");
    assert_eq!(
        st.code(),
        Some(0),
        "app failed:\n{}",
        app.proc.stderr_text()
    );
    let st = sidecar
        .wait_timeout(Duration::from_secs(60))
        .expect("drainfs exits after the exit file");
    assert_eq!(st.code(), Some(0), "{}", stderr_of(&sidecar));
    assert!(!ready.exists());
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(pod.path("run/summary.json")).expect("the summary file"),
    )
    .unwrap();
    assert_eq!(summary["outcome"], "clean", "{summary}");
    assert_eq!(summary["cause"]["cause"], "exit_file", "{summary}");
    assert_eq!(summary["lower_exit"], "exit 0", "{summary}");
    // Kernel passthrough carried the writes: none went through drainfs's own data path.
    assert_eq!(summary["counts"]["bytes_written"], 0, "{summary}");
    assert!(
        summary["counts"]["opened_write"].as_u64() >= Some(FILES as u64),
        "{summary}"
    );
    let objects = server.objects();
    for i in 1..=FILES {
        let key = format!("out/f-{i}");
        assert_eq!(
            objects.get(&key),
            Some(&object_of(&content(i))),
            "object {key} on the server"
        );
    }
    assert_eq!(objects.len(), FILES, "{objects:?}");
    pod.assert_volumes_intact(&sidecar, &in_sidecar);
}

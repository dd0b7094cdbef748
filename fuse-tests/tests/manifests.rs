//! The Kubernetes manifests cannot drift from the CLI: every drainfs invocation in
//! `docker/k8s/*.yaml` (container commands and hooks, with their environment) is run against
//! the real binary. `run` invocations get `--check-config` (validate and print, mount nothing)
//! and must exit 0 with the configuration the manifest meant; the other subcommands must not
//! be rejected as usage errors (exit 2).
//!
//! Each `run` invocation also really runs in a pod on this machine (`fuse_tests::pod`): the
//! manifest's paths are mapped into the pod's bind-mounted volume directories, gcsfuse is
//! replaced by bucketfs, and drainfs must start as PID 1 of its sidecar, serve a write, stop
//! as the manifest stops it (exit file, or SIGTERM for a native sidecar) with exit 0, and
//! leave the volumes' bind mounts as they were.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use fuse_tests::harness::{bin, wait_until};
use fuse_tests::pod::{Container, Pod, mountinfo_of, top_at};
use nix::sys::signal::Signal;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn invocations() -> Vec<serde_json::Value> {
    let out = Command::new("python3")
        .arg(repo().join("docker/extract-drainfs-invocations.py"))
        .current_dir(repo())
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "extract-drainfs-invocations.py failed (run `bash docker/check.sh` once to install its venv): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn every_manifest_invocation_is_accepted_by_the_binary() {
    let all = invocations();
    let runs = all.iter().filter(|i| i["subcommand"] == "run").count();
    assert!(
        runs >= 3,
        "expected a drainfs run in each manifest, found {runs}"
    );
    for inv in &all {
        let sub = inv["subcommand"].as_str().unwrap();
        let argv: Vec<String> = if sub == "run" {
            &inv["check_argv"]
        } else {
            &inv["argv"]
        }
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
        let mut argv = argv;
        if sub == "wait"
            && let Some(i) = argv.iter().position(|a| a == "--timeout")
        {
            // Same flags, a shorter wait: there is no drainfs to wait for here.
            argv[i + 1] = "1s".into();
        }
        // `--check-config` runs the start-up checks, so the manifest's paths must exist: they
        // are mapped into a pod's volume directories, and `gcsfuse` (found, never run) is any
        // executable of that name on PATH.
        let pod = Pod::new();
        let path_dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(bin("bucketfs"), path_dir.path().join("gcsfuse")).unwrap();
        let argv: Vec<String> = argv.iter().map(|a| pod.remap(a)).collect();
        let mut cmd = Command::new(bin("drainfs"));
        cmd.args(&argv[1..]).env_clear().env(
            "PATH",
            format!(
                "{}:{}",
                path_dir.path().display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        );
        for (k, v) in inv["env"].as_object().unwrap() {
            let v = v.as_str().unwrap();
            let v = match k.as_str() {
                "DRAINFS_ADMIN_ADDR" => "127.0.0.1:0".to_string(),
                _ => pod.remap(v),
            };
            cmd.env(k, v);
        }
        if sub != "run" {
            // Point the socket clients at nothing, so they fail fast instead of waiting.
            cmd.env("DRAINFS_CONTROL_SOCKET", "/nonexistent/drainfs.sock");
        }
        let out = cmd.output().unwrap();
        let what = format!("{} / {}: {:?}", inv["manifest"], inv["container"], argv);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if sub == "run" {
            assert_eq!(out.status.code(), Some(0), "{what}\n{stderr}");
            let cfg: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: {e}"));
            let grace = inv["termination_grace_period_seconds"].as_u64().unwrap();
            let configured =
                humantime::parse_duration(cfg["lifecycle"]["grace_period"].as_str().unwrap())
                    .unwrap();
            assert_eq!(
                configured.as_secs(),
                grace,
                "{what}: DRAINFS_GRACE_PERIOD must match terminationGracePeriodSeconds"
            );
            assert_eq!(
                cfg["lifecycle"]["native_sidecar"].as_bool().unwrap(),
                inv["native_sidecar_container"].as_bool().unwrap(),
                "{what}: native sidecar mode must match restartPolicy: Always"
            );
            assert!(
                cfg["lifecycle"]["lower_process"]["spawn"].is_object(),
                "{what}: the sidecar must start gcsfuse itself"
            );
        } else {
            assert_ne!(
                out.status.code(),
                Some(2),
                "{what} is a usage error:\n{stderr}"
            );
        }
    }
}

#[test]
fn every_manifest_run_invocation_serves_and_stops_in_a_pod() {
    let runs: Vec<serde_json::Value> = invocations()
        .into_iter()
        .filter(|i| i["subcommand"] == "run")
        .collect();
    assert!(runs.len() >= 3, "expected a drainfs run in each manifest");
    for inv in &runs {
        let what = format!("{} / {}", inv["manifest"], inv["container"]);
        let pod = Pod::new();
        let manifest_argv: Vec<String> = inv["argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let dashdash = manifest_argv
            .iter()
            .position(|a| a == "--")
            .unwrap_or_else(|| panic!("{what}: no lower command"));
        let mut argv = vec![bin("drainfs").display().to_string()];
        argv.extend(manifest_argv[1..dashdash].iter().map(|a| pod.remap(a)));
        argv.extend([
            "--".to_string(),
            bin("bucketfs").display().to_string(),
            "--bucket".into(),
            pod.path("bucket").display().to_string(),
            "--mountpoint".into(),
            pod.lower.path.display().to_string(),
        ]);
        let mut env: Vec<(String, String)> = vec![("RUST_LOG".into(), "info".into())];
        for (k, v) in inv["env"].as_object().unwrap() {
            let v = v.as_str().unwrap();
            let v = match k.as_str() {
                // One port per test run, loopback only.
                "DRAINFS_ADMIN_ADDR" => "127.0.0.1:0".to_string(),
                _ => pod.remap(v),
            };
            env.push((k.clone(), v));
        }
        let exit_file = argv
            .iter()
            .position(|a| a == "--exit-file")
            .map(|i| PathBuf::from(&argv[i + 1]));
        let mut sidecar = Container::sidecar(&argv, &env);
        let data = pod.data.path.clone();
        assert!(
            wait_until(Duration::from_secs(30), || top_at(
                &mountinfo_of("self"),
                &data
            )
            .is_some_and(|m| m.source == "drainfs" && m.parent == pod.data.id)),
            "{what}: drainfs's mount never reached the node:\n{}",
            sidecar.proc.stderr_text()
        );
        let inside = mountinfo_of(&sidecar.pid1.to_string());
        let in_sidecar = vec![
            pod.volume_mount(&inside, &pod.data.path),
            pod.volume_mount(&inside, &pod.lower.path),
        ];
        let body = format!("written through {what}\n");
        std::fs::write(data.join("hello.txt"), &body).unwrap();
        match &exit_file {
            Some(f) => {
                std::fs::create_dir_all(f.parent().unwrap()).unwrap();
                std::fs::write(f, b"").unwrap();
            }
            None => sidecar.signal(Signal::SIGTERM),
        }
        let st = sidecar
            .wait_timeout(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{what}: drainfs did not stop"));
        assert_eq!(
            st.code(),
            Some(0),
            "{what}:\n{}",
            sidecar.proc.stderr_text()
        );
        assert_eq!(
            std::fs::read_to_string(pod.path("bucket/hello.txt")).unwrap_or_default(),
            body,
            "{what}: the object"
        );
        pod.assert_volumes_intact(&sidecar, &in_sidecar);
    }
}

/// The manifests' comments cannot drift from the binary and the docs: every flag and
/// `DRAINFS_*` variable they name is one `--help` lists, every termination-message path is
/// `.state.terminated.message` in the right status list, and the claims the checker knows
/// (the lower's stop signal as root, `drainfs wait`'s timeout code, a shell in the drainfs
/// image, links into docs/) hold (`extract-drainfs-invocations.py --check-comments`).
#[test]
fn manifest_comments_agree_with_the_binary_and_the_docs() {
    let out = Command::new("python3")
        .arg(repo().join("docker/extract-drainfs-invocations.py"))
        .arg("--check-comments")
        .arg(bin("drainfs"))
        .current_dir(repo())
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

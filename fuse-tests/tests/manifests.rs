//! The Kubernetes manifests cannot drift from the CLI (issue #7): every drainfs invocation in
//! `docker/k8s/*.yaml` (container commands and hooks, with their environment) is run against
//! the real binary. `run` invocations get `--check-config` (validate and print, mount nothing)
//! and must exit 0 with the configuration the manifest meant; the other subcommands must not
//! be rejected as usage errors (exit 2).

use std::path::PathBuf;
use std::process::Command;

use fuse_tests::harness::bin;

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
        let mut cmd = Command::new(bin("drainfs"));
        cmd.args(&argv[1..])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        for (k, v) in inv["env"].as_object().unwrap() {
            cmd.env(k, v.as_str().unwrap());
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

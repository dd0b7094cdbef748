use super::*;

fn os(v: &[&str]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

fn pair(n: &str, v: &str) -> (String, String) {
    (n.to_string(), v.to_string())
}

/// The argv the sidecar mounter v1.24.4 builds (`--k=v`, flags in map order, bucket and
/// mount point last): drainfs's flags go, everything else stays in order.
#[test]
fn flags_are_taken_out_of_argv() {
    let argv = os(&[
        "--app-name=gke-gcs-fuse-csi",
        "--drainfs-mode=relay",
        "--foreground",
        "--uid=0",
        "bucket",
        "/dev/fd/3",
    ]);
    let (found, rest) = take_flags(&argv).unwrap();
    assert_eq!(found, [pair("drainfs-mode", "relay")]);
    assert_eq!(
        rest,
        os(&[
            "--app-name=gke-gcs-fuse-csi",
            "--foreground",
            "--uid=0",
            "bucket",
            "/dev/fd/3"
        ])
    );
    // v1.20-v1.22: `--k` `v` as two items.
    let (found, rest) = take_flags(&os(&["--drainfs-mode", "handoff", "b", "/dev/fd/3"])).unwrap();
    assert_eq!(
        (found, rest),
        (
            vec![pair("drainfs-mode", "handoff")],
            os(&["b", "/dev/fd/3"])
        )
    );
    // A bare option (mount option `drainfs-mode`) has no value.
    assert!(take_flags(&os(&["--drainfs-mode", "b", "/dev/fd/3"])).is_err());
    // Not drainfs's: untouched.
    let other = os(&[
        "--implicit-dirs",
        "drainfs-mode=relay",
        "---drainfs-mode=x",
        "b",
        "/m",
    ]);
    assert_eq!(take_flags(&other).unwrap(), (vec![], other.clone()));
}

/// The config file gopkg.in/yaml.v3 writes for the options `drainfs-mode:relay`,
/// `logging:severity:info`, `disable-metrics-for-gke:true` and the defaults: drainfs's key
/// goes, nested maps stay.
#[test]
fn keys_are_taken_out_of_the_config_file() {
    let text = "cache-dir: \"\"\ndrainfs-mode: relay\nlogging:\n    file-path: /dev/fd/1\n    format: json\n    severity: info\n";
    let (found, kept) = take_yaml_keys(text).unwrap();
    assert_eq!(found, [pair("drainfs-mode", "relay")]);
    assert_eq!(
        kept.unwrap(),
        "cache-dir: \"\"\nlogging:\n    file-path: /dev/fd/1\n    format: json\n    severity: info\n"
    );
    let (found, kept) = take_yaml_keys("drainfs-idle-window: \"3s\"\n").unwrap();
    assert_eq!(
        (found, kept.as_deref()),
        (vec![pair("drainfs-idle-window", "3s")], Some(""))
    );
    assert_eq!(
        take_yaml_keys("logging:\n    drainfs-mode: relay\n").unwrap(),
        (vec![], None)
    );
    assert!(take_yaml_keys("drainfs-mode:\n    a: b\n").is_err());
}

/// `DRAINFS_DROPIN_MODE` (the image's environment) sets the default; a volume's option wins.
#[test]
fn the_image_environment_sets_the_default_mode() {
    assert_eq!(choose(&[], Some("relay")).unwrap(), (Mode::Relay, None));
    let handoff = [pair(MODE, "handoff")];
    assert_eq!(
        choose(&handoff, Some("relay")).unwrap(),
        (Mode::Handoff, None)
    );
    let e = choose(&[], Some("fast")).unwrap_err();
    assert!(e.contains("DRAINFS_DROPIN_MODE=fast"), "{e}");
    assert!(choose(&[pair(IDLE_WINDOW, "1s")], Some("relay")).is_err());
}

#[test]
fn the_mode_is_handoff_unless_relay_is_asked_for() {
    assert_eq!(choose(&[], None).unwrap(), (Mode::Handoff, None));
    assert_eq!(
        choose(&[pair(MODE, "relay")], None).unwrap(),
        (Mode::Relay, None)
    );
    let both = [
        pair(MODE, "handoff"),
        pair(IDLE_WINDOW, "3s"),
        pair(MODE, "handoff"),
    ];
    assert_eq!(
        choose(&both, None).unwrap(),
        (Mode::Handoff, Some("3s".into()))
    );
    for bad in [
        vec![pair(MODE, "Relay")],
        vec![pair(MODE, "relay"), pair(MODE, "handoff")],
        vec![pair("drainfs-modes", "relay")],
        vec![pair(IDLE_WINDOW, "soon")],
        vec![pair(MODE, "relay"), pair(IDLE_WINDOW, "1s")],
    ] {
        assert!(choose(&bad, None).is_err(), "accepted {bad:?}");
    }
    let e = choose(&[pair(MODE, "fast")], None).unwrap_err();
    assert!(
        e.contains("drainfs-mode=fast") && e.contains("handoff") && e.contains("relay"),
        "{e}"
    );
}

/// The whole plan over a real config file: the option in either place, gcsfuse's argv and
/// config without it, the copy beside the original and read-only; a directory mount point
/// is not an fd mount.
#[test]
fn the_plan_consumes_the_option_from_argv_or_the_config_file() {
    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("config.yaml");
    std::fs::write(&cfg, "drainfs-mode: relay\nlogging:\n    format: json\n").unwrap();
    let joined = format!("--config-file={}", cfg.display());
    let p = plan(&os(&["--foreground", &joined, "b", "/dev/fd/3"]), None).unwrap();
    let copy = d.path().join("drainfs-config.yaml");
    assert_eq!((p.mode, p.fd_mount), (Mode::Relay, true));
    assert_eq!(
        p.args[1],
        OsString::from(format!("--config-file={}", copy.display()))
    );
    assert_eq!(
        std::fs::read_to_string(&copy).unwrap(),
        "logging:\n    format: json\n"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777,
        0o400
    );
    // Again (a stale read-only copy is replaced), the two-item form.
    let p = plan(
        &os(&["--config-file", cfg.to_str().unwrap(), "b", "/mnt"]),
        None,
    )
    .unwrap();
    assert_eq!(p.args[1], copy.clone().into_os_string());
    assert!(!p.fd_mount);
    // No key in the file: the file is passed as it is.
    std::fs::write(d.path().join("plain.yaml"), "cache-dir: \"\"\n").unwrap();
    let plain = format!("--config-file={}", d.path().join("plain.yaml").display());
    let p = plan(
        &os(&["--drainfs-mode=relay", &plain, "b", "/dev/fd/3"]),
        None,
    )
    .unwrap();
    assert_eq!(
        (p.mode, p.args),
        (Mode::Relay, os(&[&plain, "b", "/dev/fd/3"]))
    );
    // An unknown mode is a usage error; an unreadable config file is a failure.
    let e = plan(&os(&["--drainfs-mode=fast", "b", "/dev/fd/3"]), None).unwrap_err();
    assert_eq!(e.0, ExitCode::Usage);
    let e = plan(
        &os(&["--config-file=/nonexistent/c.yaml", "b", "/dev/fd/3"]),
        None,
    )
    .unwrap_err();
    assert_eq!(e.0, ExitCode::Failed);
}

#[test]
fn the_handoff_command_line() {
    let p = Plan {
        mode: Mode::Handoff,
        idle_window: Some("3s".into()),
        args: os(&["--foreground", "b", "/dev/fd/3"]),
        fd_mount: true,
    };
    let a = handoff_args("/gcsfuse.real".into(), p.clone(), |_| None);
    assert_eq!(
        a,
        os(&[
            "drainfs",
            "handoff",
            "--log-to-stdout",
            "--log-format=json",
            "--idle-window=3s",
            "--",
            "/gcsfuse.real",
            "--foreground",
            "b",
            "/dev/fd/3"
        ])
    );
    let a = handoff_args("/g".into(), p, |k| {
        (k == "DRAINFS_LOG_FORMAT").then(|| "text".into())
    });
    assert!(!a.iter().any(|x| x == "--log-format=json"));
}

use super::*;
use clap::Parser;

#[test]
fn durations() {
    let cases = [
        ("30", Some(Duration::from_secs(30))),
        ("30s", Some(Duration::from_secs(30))),
        ("1500ms", Some(Duration::from_millis(1500))),
        ("0.5", Some(Duration::from_millis(500))),
        ("1m 30s", Some(Duration::from_secs(90))),
        ("-1", None),
        ("soon", None),
        ("", None),
        ("365days", Some(MAX_DURATION)),
        ("31536000", Some(MAX_DURATION)),
        // Longer than 365 days, or beyond what a Duration holds: refused, never a panic
        // (1e30 and 18446744073709551615 panicked in Duration::from_secs_f64; 9e18 s was
        // accepted and overflowed the deadline's arithmetic at the first SIGTERM).
        ("31536001", None),
        ("366days", None),
        ("9000000000000000000s", None),
        ("18446744073709551615", None),
        ("100000000000000000000", None),
        ("1e30", None),
        ("inf", None),
        ("NaN", None),
    ];
    for (input, want) in cases {
        assert_eq!(parse_duration(input).ok(), want, "input {input:?}");
    }
}

/// An explicit `--native-sidecar false` (or `DRAINFS_NATIVE_SIDECAR`) wins over GKE's
/// `NATIVE_SIDECAR=TRUE`; without one, `NATIVE_SIDECAR` decides.
#[test]
fn an_explicit_native_sidecar_flag_wins_over_gkes_variable() {
    let base = ["--lower", "/l", "--mountpoint", "/m"];
    let native = |extra: &[&str], env: Option<&str>| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        run_config(&args, env).unwrap().lifecycle.native_sidecar
    };
    assert!(native(&[], Some("TRUE")));
    assert!(!native(&[], None));
    assert!(!native(&["--native-sidecar", "false"], Some("TRUE")));
    assert!(!native(&["--native-sidecar=false"], Some("TRUE")));
    assert!(native(&["--native-sidecar"], Some("FALSE")));
    assert!(native(&["--native-sidecar"], None));
}

#[test]
fn a_watched_pid_is_positive() {
    for bad in ["0", "-1"] {
        let args = ["--lower", "/l", "--mountpoint", "/m", "--watch-pid", bad];
        assert!(run_config(&args, None).is_err(), "--watch-pid {bad}");
    }
    let args = ["--lower", "/l", "--mountpoint", "/m", "--watch-pid", "1"];
    assert_eq!(
        run_config(&args, None).unwrap().lifecycle.watch_pid,
        Some(1)
    );
}

#[test]
fn signals() {
    use nix::sys::signal::Signal;
    let cases = [
        ("SIGINT", Some(Signal::SIGINT)),
        ("int", Some(Signal::SIGINT)),
        ("TERM", Some(Signal::SIGTERM)),
        ("9", Some(Signal::SIGKILL)),
        ("SIGNOPE", None),
        ("999", None),
    ];
    for (input, want) in cases {
        assert_eq!(parse_signal(input).ok(), want, "input {input:?}");
    }
}

fn run_config(args: &[&str], native_env: Option<&str>) -> Result<RunConfig, String> {
    let mut argv = vec!["drainfs", "run"];
    argv.extend_from_slice(args);
    match Cli::try_parse_from(argv)
        .map_err(|e| e.to_string())?
        .command
    {
        Command::Run(a) => a.into_config(native_env),
        other => panic!("parsed {other:?}"),
    }
}

#[test]
fn go_bools_exactly() {
    for t in ["1", "t", "T", "TRUE", "true", "True"] {
        assert_eq!(parse_go_bool(t), Ok(true), "{t}");
    }
    for f in ["0", "f", "F", "FALSE", "false", "False"] {
        assert_eq!(parse_go_bool(f), Ok(false), "{f}");
    }
    for bad in [
        "", "yes", "no", "on", "off", "y", "n", "tRuE", "fALSE", " true", "2", "TRUE ",
    ] {
        assert!(parse_go_bool(bad).is_err(), "accepted {bad:?}");
    }
}

#[test]
fn native_sidecar_env_is_strict() {
    let base = ["--lower", "/l", "--mountpoint", "/m"];
    for (v, want) in [
        ("TRUE", true),
        ("t", true),
        ("1", true),
        ("False", false),
        ("0", false),
    ] {
        let c = run_config(&base, Some(v)).unwrap();
        assert_eq!(c.lifecycle.native_sidecar, want, "NATIVE_SIDECAR={v}");
    }
    for bad in ["yes", "on", "", "tRUE", "enabled"] {
        let e = run_config(&base, Some(bad)).unwrap_err();
        assert!(e.starts_with("NATIVE_SIDECAR="), "{bad:?}: {e}");
    }
}

#[test]
fn log_levels() {
    for ok in [
        "info",
        "WARN",
        "off",
        "info,drainfs=debug",
        "drainfs::relay=trace",
        "info,fuser=error",
    ] {
        assert_eq!(parse_log_level(ok).as_deref(), Ok(ok), "{ok}");
    }
    for bad in [
        "warning",
        "",
        "drainfs=loud",
        "info,verbose",
        "=debug",
        "fatal",
    ] {
        assert!(parse_log_level(bad).is_err(), "accepted {bad:?}");
    }
}

fn env_check(sub: &str, vars: &[(&str, &str)]) -> Vec<String> {
    let args: Vec<std::ffi::OsString> = ["drainfs", sub].iter().map(|a| a.into()).collect();
    env_problems_from(&args, |name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| std::ffi::OsString::from(v))
    })
}

#[test]
fn env_values_are_checked_and_named() {
    let good = [
        ("DRAINFS_GRACE_PERIOD", "60"),
        ("DRAINFS_NATIVE_SIDECAR", "TRUE"),
        ("DRAINFS_LOG_LEVEL", "info"),
        ("DRAINFS_PASSTHROUGH", "reads"),
        ("DRAINFS_EXIT_FILE", "/a,/b"),
        ("DRAINFS_ADMIN_ADDR", "0.0.0.0:9090"),
        ("DRAINFS_RELAY", "false"),
    ];
    assert_eq!(env_check("run", &good), Vec::<String>::new());
    let bad = [
        ("DRAINFS_GRACE_PERIOD", "soon", "run"),
        ("DRAINFS_GRACE_PERIOD", "soon", "relay"),
        ("DRAINFS_LOG_LEVEL", "warning", "run"),
        ("DRAINFS_LOG_LEVEL", "warning", "relay"),
        ("DRAINFS_NATIVE_SIDECAR", "yes", "run"),
        ("DRAINFS_LOG_TO_STDOUT", "on", "relay"),
        ("DRAINFS_PASSTHROUGH", "maybe", "run"),
        ("DRAINFS_THREADS", "0", "run"),
        ("DRAINFS_ADMIN_ADDR", "localhost", "run"),
        ("DRAINFS_EOF_EXIT_CODES", "0,x", "relay"),
        ("DRAINFS_SPIN", "fast", "relay"),
        ("DRAINFS_RELAY", "no", "run"),
        ("DRAINFS_QUIET_PERIOD", "", "run"),
    ];
    for (k, v, sub) in bad {
        let p = env_check(sub, &[(k, v)]);
        assert_eq!(p.len(), 1, "{sub} {k}={v}: {p:?}");
        assert!(p[0].starts_with(k), "{sub} {k}={v}: {p:?}");
    }
    // Every problem is reported, not only the first.
    let p = env_check(
        "run",
        &[
            ("DRAINFS_GRACE_PERIOD", "soon"),
            ("DRAINFS_LOG_LEVEL", "warning"),
        ],
    );
    assert_eq!(p.len(), 2, "{p:?}");
    // Control commands read DRAINFS_CONTROL_SOCKET only; unknown subcommands nothing.
    assert!(env_check("status", &[("DRAINFS_GRACE_PERIOD", "soon")]).is_empty());
    assert!(env_check("nope", &[("DRAINFS_GRACE_PERIOD", "soon")]).is_empty());
}

#[test]
fn relay_flag_rules() {
    assert!(
        run_config(
            &["--mountpoint", "/m", "--relay", "--", "d", "/dev/fd/3"],
            None
        )
        .unwrap()
        .relay
        .is_some()
    );
    assert!(run_config(&["--mountpoint", "/m", "--relay"], None).is_err());
    assert!(
        run_config(
            &["--lower", "/l", "--mountpoint", "/m", "--relay", "--", "d"],
            None
        )
        .is_err()
    );
    assert!(
        run_config(
            &["--lower", "/l", "--mountpoint", "/m", "--relay=false"],
            None
        )
        .unwrap()
        .relay
        .is_none()
    );
}

#[test]
fn run_args_table() {
    let c = run_config(&["--lower", "/l", "--mountpoint", "/m"], None).unwrap();
    assert_eq!(c.lifecycle.grace_period, Duration::from_secs(30));
    assert_eq!(c.lifecycle.grace_margin, Duration::from_secs(3));
    assert!(!c.lifecycle.native_sidecar);
    assert!(matches!(
        c.lifecycle.lower_process,
        LowerProcess::Adopted { pid: None }
    ));

    let c = run_config(
        &[
            "--lower",
            "/l",
            "--mountpoint",
            "/m",
            "--grace-period",
            "3s",
        ],
        Some("TRUE"),
    )
    .unwrap();
    assert_eq!(c.lifecycle.grace_margin, Duration::from_millis(300));
    assert!(c.lifecycle.native_sidecar);

    let c = run_config(
        &[
            "--lower",
            "/l",
            "--mountpoint",
            "/m",
            "--exit-file",
            "/a",
            "--exit-file",
            "/b",
            "--",
            "gcsfuse",
            "--foreground",
            "b",
            "/l",
        ],
        Some("false"),
    )
    .unwrap();
    assert_eq!(
        c.lifecycle.exit_files,
        vec![PathBuf::from("/a"), PathBuf::from("/b")]
    );
    assert!(!c.lifecycle.native_sidecar);
    match c.lifecycle.lower_process {
        LowerProcess::Spawn { argv } => assert_eq!(argv.len(), 4),
        other => panic!("{other:?}"),
    }

    for bad in [
        vec!["--mountpoint", "/m"],
        vec![
            "--lower",
            "/l",
            "--mountpoint",
            "/m",
            "--grace-period",
            "soon",
        ],
        vec![
            "--lower",
            "/l",
            "--mountpoint",
            "/m",
            "--passthrough",
            "maybe",
        ],
        vec!["--lower", "/l", "--mountpoint", "/m", "--threads", "0"],
        vec![
            "--lower",
            "/l",
            "--mountpoint",
            "/m",
            "--lower-signal",
            "SIGNOPE",
        ],
        vec![
            "--lower",
            "/l",
            "--mountpoint",
            "/m",
            "--lower-pid",
            "1",
            "--",
            "x",
        ],
    ] {
        assert!(run_config(&bad, None).is_err(), "accepted {bad:?}");
    }
}

#[test]
fn lower_is_marked_required_unless_relay() {
    use clap::CommandFactory;
    // clap refuses a `run` without --lower (and says so in the usage line) ...
    let e = Cli::try_parse_from(["drainfs", "run", "--mountpoint", "/m"]).unwrap_err();
    assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
    assert!(e.to_string().contains("--lower"), "{e}");
    // ... but not with --relay.
    assert!(Cli::try_parse_from(["drainfs", "run", "--mountpoint", "/m", "--relay"]).is_ok());
    let mut cli = Cli::command();
    let run = cli.find_subcommand_mut("run").unwrap();
    let help = run.render_long_help().to_string();
    assert!(help.contains("Required (unless `--relay`)"), "{help}");
}

#[test]
fn help_says_what_surprises() {
    use clap::CommandFactory;
    let mut cli = Cli::command();
    let top = cli.render_long_help().to_string();
    // argv[0] = gcsfuse, and the exit codes with wait's own.
    for want in [
        "Invoked as `gcsfuse`",
        "/gcsfuse.real",
        "--log-format json",
        "124 `drainfs wait` timed out",
        "75 data may be incomplete",
    ] {
        assert!(top.contains(want), "drainfs --help lacks {want:?}:\n{top}");
    }
    let mut cli = Cli::command();
    let run = cli
        .find_subcommand_mut("run")
        .unwrap()
        .render_long_help()
        .to_string();
    assert!(run.contains("no signal is sent"), "{run}");
    assert!(run.contains("the gcsfuse drop-in's default"), "{run}");
    assert!(run.contains("use `drainfs relay`"), "{run}");
    let mut cli = Cli::command();
    let relay = cli
        .find_subcommand_mut("relay")
        .unwrap()
        .render_long_help()
        .to_string();
    assert!(relay.contains("5 s by default"), "{relay}");
    let mut cli = Cli::command();
    let wait = cli
        .find_subcommand_mut("wait")
        .unwrap()
        .render_long_help()
        .to_string();
    assert!(wait.contains("exit 124"), "{wait}");
    assert!(!wait.contains("75"), "{wait}");
}

#[test]
fn dropin_args_default_to_json_logs_and_a_signal_ending() {
    let rest: Vec<std::ffi::OsString> = vec!["--foreground".into(), "b".into(), "/dev/fd/3".into()];
    let none = |_: &str| None;
    let args = dropin_args("/gcsfuse.real".into(), rest.clone(), none);
    let want: Vec<std::ffi::OsString> = [
        "drainfs",
        "relay",
        "--log-to-stdout",
        "--log-format=json",
        "--clean-sigterm-exit=signal",
        "--",
        "/gcsfuse.real",
        "--foreground",
        "b",
        "/dev/fd/3",
    ]
    .iter()
    .map(Into::into)
    .collect();
    assert_eq!(args, want);
    // The variables decide when set: their flags are left out.
    let set = |k: &str| {
        ["DRAINFS_LOG_FORMAT", "DRAINFS_CLEAN_SIGTERM_EXIT"]
            .contains(&k)
            .then(|| "x".into())
    };
    let args = dropin_args("/r".into(), rest, set);
    assert!(!args.iter().any(|a| a == "--log-format=json"));
    assert!(!args.iter().any(|a| a == "--clean-sigterm-exit=signal"));
    // And they parse into a relay that logs JSON to stdout.
    let args = dropin_args("/r".into(), vec!["/dev/fd/3".into()], none);
    let Command::Relay(r) = Cli::try_parse_from(args).unwrap().command else {
        panic!("not a relay");
    };
    let cfg = r.into_config();
    assert_eq!(cfg.log.format, LogFormat::Json);
    assert!(cfg.log.to_stdout);
    assert_eq!(cfg.lifecycle.grace_period, Duration::from_secs(5));
}

/// The command line's surface, as `docs/cli-surface.txt` publishes it (docs/stable-surface.md):
/// every verb, and every visible argument of each (long flag, else short, else `<ID>` for a
/// positional) with the `DRAINFS_*` variable it reads, one per line. A flag removed, renamed
/// or moved fails here; so does one added without its line. `DRAINFS_BLESS=1 cargo test
/// the_cli_surface` rewrites the file (then read the diff: a removal needs a deprecation).
#[test]
fn the_cli_surface_is_the_published_one() {
    use clap::CommandFactory;
    fn walk(cmd: &clap::Command, path: &str, lines: &mut Vec<String>) {
        for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            let id = a.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let name = match (a.get_long(), a.get_short()) {
                (Some(l), _) => format!("--{l}"),
                (None, Some(s)) => format!("-{s}"),
                (None, None) => format!("<{}>", id.to_uppercase()),
            };
            let env = a
                .get_env()
                .map(|e| format!(" {}", e.to_string_lossy()))
                .unwrap_or_default();
            lines.push(format!("{path} {name}{env}"));
        }
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            let p = format!("{path} {}", sub.get_name());
            lines.push(p.clone());
            walk(sub, &p, lines);
        }
    }
    let mut lines = Vec::new();
    walk(&Cli::command(), "drainfs", &mut lines);
    let got = lines.join("\n") + "\n";
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli-surface.txt");
    if std::env::var_os("DRAINFS_BLESS").is_some() {
        std::fs::write(path, &got).unwrap();
    }
    let want = std::fs::read_to_string(path).unwrap_or_default();
    assert_eq!(
        got, want,
        "the CLI differs from docs/cli-surface.txt (left: the binary's)"
    );
}

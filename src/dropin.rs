//! The gcsfuse drop-in (drainfs exec'ed as `gcsfuse` by GKE's sidecar mounter): which mode
//! runs, chosen per volume through the volume's `mountOptions`, and the command line it runs.
//!
//! GKE's webhook discards the sidecar container's env and args, so the only per-volume
//! channel that reaches the drop-in is the volume's `mountOptions`: the sidecar mounter
//! v1.24.4 (`pkg/sidecar_mounter/sidecar_mounter_config.go`, `prepareMountArgs`) turns an
//! option `k=v` (or `k`) into the argv item `--k=v` (`--k`), and an option `k:v` (no `=`,
//! a `:`) into the key `k: v` of the YAML config file it passes as `--config-file=PATH`
//! (written by gopkg.in/yaml.v3: top-level keys at column 0). gcsfuse rejects flags and
//! config keys it does not know, so drainfs consumes its own ([`OPTIONS`]) from both places:
//! it removes them from argv, and for the config file it writes a copy without them beside
//! it and passes that path instead. gcsfuse never sees them.
//!
//! - `drainfs-mode=handoff|relay` (`drainfs-mode:relay`): `handoff` (the default) runs
//!   `drainfs handoff`, `relay` runs `drainfs relay` (drainfs in the data path).
//! - `drainfs-idle-window=DURATION`: the hand-off's `--idle-window`.
//!
//! Without `drainfs-mode`, `DRAINFS_DROPIN_MODE` (the image's environment) chooses, else the
//! hand-off.
//!
//! A mount point that is not `/dev/fd/N` (GKE's shared-mount mode, where gcsfuse mounts a
//! directory itself) has no connection to hand off or relay: the real gcsfuse is exec'ed
//! with the arguments (drainfs's options removed).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::drain::ExitCode;

/// The mount option that chooses the mode.
pub const MODE: &str = "drainfs-mode";
/// The mount option that sets the hand-off's idle window.
pub const IDLE_WINDOW: &str = "drainfs-idle-window";
/// Every option drainfs consumes.
pub const OPTIONS: [&str; 2] = [MODE, IDLE_WINDOW];

/// drainfs's options found, as `(name, value)` pairs in the order found.
pub type Found = Vec<(String, String)>;

/// The drop-in's mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `drainfs handoff`: gcsfuse holds the kernel's connection; drainfs ends it once idle.
    Handoff,
    /// `drainfs relay`: drainfs relays every FUSE message to gcsfuse.
    Relay,
}

/// What the drop-in runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The mode chosen.
    pub mode: Mode,
    /// The hand-off's idle window, as given (`drainfs-idle-window`).
    pub idle_window: Option<String>,
    /// gcsfuse's arguments, drainfs's options removed (and `--config-file` pointing at the
    /// copy without them, when the file had any).
    pub args: Vec<OsString>,
    /// Whether the mount point (the last argument) is `/dev/fd/N`.
    pub fd_mount: bool,
}

/// Takes drainfs's flags out of gcsfuse's argv: `--NAME=V` (sidecar mounter v1.23+), `--NAME
/// V` (v1.20-v1.22) and a bare `--NAME`, for each name in [`OPTIONS`] (one or two dashes).
/// Returns the `(name, value)` pairs found and the remaining arguments.
///
/// # Errors
/// A flag of drainfs's given without a value.
pub fn take_flags(args: &[OsString]) -> Result<(Found, Vec<OsString>), String> {
    let mut found = Vec::new();
    let mut rest = Vec::new();
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        let Some(s) = a.to_str() else {
            rest.push(a.clone());
            continue;
        };
        let bare = s.trim_start_matches('-');
        let dashed = bare.len() + 1 == s.len() || bare.len() + 2 == s.len();
        let (name, value) = match bare.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (bare, None),
        };
        if !dashed || !name.starts_with("drainfs-") {
            rest.push(a.clone());
            continue;
        }
        let value = match value {
            Some(v) => v,
            None => match it.peek().and_then(|n| n.to_str()) {
                // The old two-item form; never the bucket and mount point at the end.
                Some(v) if !v.starts_with('-') && it.len() > 2 => {
                    let v = v.to_string();
                    it.next();
                    v
                }
                _ => return Err(format!("mount option {name} needs a value ({name}=VALUE)")),
            },
        };
        found.push((name.to_string(), value));
    }
    Ok((found, rest))
}

/// Takes drainfs's keys (top-level `drainfs-...: VALUE` lines) out of a gcsfuse config file's
/// YAML text. Returns the `(name, value)` pairs found (quotes removed) and the text without
/// those lines; `None` for the text when nothing was taken.
///
/// # Errors
/// A key of drainfs's whose value is empty or a nested map (`drainfs-mode:a:b`).
pub fn take_yaml_keys(text: &str) -> Result<(Found, Option<String>), String> {
    let mut found = Vec::new();
    let mut kept = String::with_capacity(text.len());
    let mut lines = text.split_inclusive('\n').peekable();
    while let Some(line) = lines.next() {
        let Some((k, v)) = line
            .split_once(':')
            .filter(|(k, _)| k.starts_with("drainfs-"))
        else {
            kept.push_str(line);
            continue;
        };
        let v = v.trim();
        let nested = lines.peek().is_some_and(|n| n.starts_with([' ', '\t']));
        if v.is_empty() || nested {
            return Err(format!(
                "config-file key {k} needs a single value (mount option {k}:VALUE)"
            ));
        }
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
            .unwrap_or(v);
        found.push((k.to_string(), v.to_string()));
    }
    let changed = !found.is_empty();
    Ok((found, changed.then_some(kept)))
}

/// The environment variable that sets the drop-in's mode when no volume asks for one: the
/// image's environment reaches the drop-in (GKE's webhook discards only the pod's), so an image
/// built for the relay sets `DRAINFS_DROPIN_MODE=relay`.
pub const MODE_ENV: &str = "DRAINFS_DROPIN_MODE";

/// Chooses the mode and the idle window from drainfs's options (from argv and the config
/// file); without `drainfs-mode`, the mode is `env_mode` (`DRAINFS_DROPIN_MODE`), else
/// [`Mode::Handoff`].
///
/// # Errors
/// An unknown `drainfs-*` option, an unknown mode (in an option or in `env_mode`), two
/// different values for one option, or an idle window with the relay (which has none).
pub fn choose(
    options: &[(String, String)],
    env_mode: Option<&str>,
) -> Result<(Mode, Option<String>), String> {
    let mut mode = None;
    let mut idle = None;
    for (name, value) in options {
        let slot = match name.as_str() {
            MODE => &mut mode,
            IDLE_WINDOW => &mut idle,
            _ => {
                return Err(format!(
                    "unknown mount option {name}: drainfs takes {}",
                    OPTIONS.join(", ")
                ));
            }
        };
        if let Some(old) = slot.as_ref().filter(|old| *old != value) {
            return Err(format!(
                "mount option {name} is given twice: {old} and {value}"
            ));
        }
        *slot = Some(value.clone());
    }
    let parse = |v: &str| match v {
        "handoff" => Some(Mode::Handoff),
        "relay" => Some(Mode::Relay),
        _ => None,
    };
    let mode = match (mode.as_deref(), env_mode) {
        (Some(v), _) => parse(v).ok_or_else(|| {
            format!("mount option {MODE}={v}: unknown mode; use handoff (the default) or relay")
        })?,
        (None, Some(v)) => parse(v).ok_or_else(|| {
            format!("{MODE_ENV}={v}: unknown mode; use handoff (the default) or relay")
        })?,
        (None, None) => Mode::Handoff,
    };
    if let Some(w) = &idle {
        crate::cli::parse_duration(w).map_err(|e| format!("mount option {IDLE_WINDOW}: {e}"))?;
        if mode == Mode::Relay {
            return Err(format!(
                "mount option {IDLE_WINDOW} applies to {MODE}=handoff only, not relay"
            ));
        }
    }
    Ok((mode, idle))
}

/// The `--config-file` argument: its index in `args`, whether it is the `--config-file=PATH`
/// form (else PATH is the next item), and PATH.
fn config_file(args: &[OsString]) -> Option<(usize, bool, PathBuf)> {
    use std::os::unix::ffi::OsStrExt;
    for (i, a) in args.iter().enumerate() {
        let b = a.as_bytes();
        let Some(b) = b.strip_prefix(b"--").or_else(|| b.strip_prefix(b"-")) else {
            continue;
        };
        let b = if let Some(p) = b.strip_prefix(b"config-file=") {
            p
        } else if b == b"config-file" {
            return Some((i, false, PathBuf::from(args.get(i + 1)?)));
        } else {
            continue;
        };
        return Some((i, true, PathBuf::from(std::ffi::OsStr::from_bytes(b))));
    }
    None
}

/// Where the copy of config file `path` without drainfs's keys goes: beside it (the sidecar
/// mounter writes it in the volume's own directory, which the sidecar may write).
pub fn cleaned_config_path(path: &Path) -> PathBuf {
    let name = path.file_name().map_or_else(
        || "config.yaml".into(),
        |n| n.to_string_lossy().into_owned(),
    );
    path.with_file_name(format!("drainfs-{name}"))
}

/// The drop-in's plan for gcsfuse's arguments `args`: drainfs's options taken from argv and
/// from the config file (a copy without them is written beside it, mode 0400 as the sidecar
/// mounter writes its own, and `--config-file` points at the copy).
///
/// # Errors
/// Exit 2 with a message for a bad option ([`take_flags`], [`take_yaml_keys`], [`choose`]);
/// exit 1 when the config file cannot be read or its copy cannot be written.
pub fn plan(args: &[OsString], env_mode: Option<&str>) -> Result<Plan, (ExitCode, String)> {
    let usage = |e: String| (ExitCode::Usage, e);
    let (mut options, mut args) = take_flags(args).map_err(usage)?;
    if let Some((i, joined, path)) = config_file(&args) {
        let text = std::fs::read_to_string(&path).map_err(|e| {
            (
                ExitCode::Failed,
                format!("cannot read gcsfuse's config file {}: {e}", path.display()),
            )
        })?;
        let (found, cleaned) = take_yaml_keys(&text).map_err(usage)?;
        if let Some(cleaned) = cleaned {
            let copy = cleaned_config_path(&path);
            write_private(&copy, cleaned.as_bytes()).map_err(|e| {
                (
                    ExitCode::Failed,
                    format!(
                        "cannot write {} (gcsfuse's config file without drainfs's keys): {e}",
                        copy.display()
                    ),
                )
            })?;
            if joined {
                let mut a = OsString::from("--config-file=");
                a.push(&copy);
                args[i] = a;
            } else {
                args[i + 1] = copy.into_os_string();
            }
            options.extend(found);
        }
    }
    let (mode, idle_window) = choose(&options, env_mode).map_err(usage)?;
    let fd_mount = crate::handoff::kernel_fd(&args).is_some();
    Ok(Plan {
        mode,
        idle_window,
        args,
        fd_mount,
    })
}

/// Writes `data` to a new file at `path`, mode 0400 (a stale copy, read-only, is removed
/// first).
fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(path)?;
    f.write_all(data)
}

/// The hand-off's command line for the drop-in: `drainfs handoff --log-to-stdout
/// [--log-format=json] [--idle-window=W] -- REAL ARGS...`. Logs go to stdout as JSON (GKE's
/// sidecar mounter copies its child's stderr into the volume's error file); `--log-format`
/// is left out when `DRAINFS_LOG_FORMAT` is set (`env` reads the environment).
pub fn handoff_args(
    real: OsString,
    plan: Plan,
    env: impl Fn(&str) -> Option<OsString>,
) -> Vec<OsString> {
    let mut args: Vec<OsString> =
        vec!["drainfs".into(), "handoff".into(), "--log-to-stdout".into()];
    if env("DRAINFS_LOG_FORMAT").is_none() {
        args.push("--log-format=json".into());
    }
    if let Some(w) = plan.idle_window {
        args.push(format!("--idle-window={w}").into());
    }
    args.push("--".into());
    args.push(real);
    args.extend(plan.args);
    args
}

/// Runs the drop-in's choice: for `gcsfuse ARGS...` (`rest`), returns drainfs's own command
/// line (hand-off or relay, with `real` the real gcsfuse). Does not return when the real
/// gcsfuse is exec'ed instead (`--version`, `--help`, a mount point that is not
/// `/dev/fd/N`), or on a bad option (exit 2, a `drainfs: error:` line on stderr).
pub fn command_line(real: OsString, rest: Vec<OsString>) -> Vec<OsString> {
    let env = |k: &str| std::env::var_os(k);
    // `gcsfuse --version` / `--help` (no connection to hand over): the real gcsfuse answers.
    if let [only] = rest.as_slice()
        && ["--version", "-v", "version", "--help", "-h", "help"]
            .iter()
            .any(|a| only == *a)
    {
        exec(&real, &rest);
    }
    let env_mode = std::env::var_os(MODE_ENV).map(|v| v.to_string_lossy().into_owned());
    let plan = match plan(&rest, env_mode.as_deref()) {
        Ok(p) => p,
        Err((code, e)) => {
            eprintln!("drainfs: error: {e}");
            std::process::exit(code.code());
        }
    };
    if !plan.fd_mount {
        exec(&real, &plan.args);
    }
    match plan.mode {
        Mode::Handoff => handoff_args(real, plan, env),
        Mode::Relay => crate::cli::dropin_args(real, plan.args, env),
    }
}

/// Replaces drainfs with `real ARGS`; exits 69 if that fails.
fn exec(real: &OsString, args: &[OsString]) -> ! {
    use std::os::unix::process::CommandExt;
    let e = std::process::Command::new(real).args(args).exec();
    eprintln!("drainfs: error: cannot run {}: {e}", real.to_string_lossy());
    std::process::exit(ExitCode::LowerFailed.code());
}

#[cfg(test)]
mod tests;

//! Sets `DRAINFS_COMMIT` for the crate (`drainfs --version`, the summaries'
//! `drainfs_version`): the build environment's `DRAINFS_COMMIT` when it is set (a build from a
//! tree without `.git`, such as `docker/Dockerfile`'s context, passes it as a build argument),
//! else `git rev-parse --short=12 HEAD`, with `-dirty` when tracked files differ from that
//! commit; `unknown` when neither is available. Cargo reruns this when the variable, `HEAD`,
//! the branch it names, `src/` or this file change.

use std::path::Path;
use std::process::Command;

/// `git ARGS` in the package's directory: its trimmed stdout, `None` when git is missing or fails.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=DRAINFS_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src");
    let commit = match std::env::var("DRAINFS_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_owned(),
        _ => from_git().unwrap_or_else(|| "unknown".to_owned()),
    };
    println!("cargo:rustc-env=DRAINFS_COMMIT={commit}");
}

fn from_git() -> Option<String> {
    let sha = git(&["rev-parse", "--short=12", "HEAD"])?;
    // HEAD, the branch it names (a loose ref) and packed-refs: a commit or a checkout moves one.
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(branch);
    for name in watched {
        match git(&["rev-parse", "--git-path", &name]) {
            Some(p) if Path::new(&p).exists() => println!("cargo:rerun-if-changed={p}"),
            _ => {}
        }
    }
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{sha}-dirty") } else { sha })
}

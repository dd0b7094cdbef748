//! The bound every mount test runs under: no test can hang the suite or wedge the machine.
//!
//! Each test's harness objects record what the test made, in a registry of this test process,
//! keyed by the test (libtest runs every test on a thread named after it; a thread without a
//! name is its own key):
//! - the processes it started ([`Proc`](crate::process::Proc) records its PID and stderr),
//! - the directories its FUSE mounts live in ([`own_dir`]: the scratch directories, the
//!   mountpoints the topologies make, and every directory argument of a started process that
//!   lies inside a temporary directory, which is unique to the test that made it).
//!
//! A watchdog thread (started with the first record) checks every second. A key older than its
//! bound ([`bound`]: 420 s, or `DRAINFS_TEST_BOUND` seconds) is cut off:
//! 1. every FUSE mount at or under one of its directories has its connection aborted through
//!    `/sys/fs/fuse/connections/<N>/abort`, opened while the mount is still there (so the number
//!    is that mount's and not a newer one's), then the mount is detached: a reader stuck in
//!    that file system (D state, even when killed) gets `ECONNABORTED` and moves on;
//! 2. its processes and everything below them are SIGKILLed, by PID;
//! 3. what they wrote on stderr is printed, with the test's name and what was cut.
//!
//! The test then fails on its own (its calls get errors) or is still stuck: either way, 30 s
//! later (or the bound, when shorter) the watchdog does the same for every other key and ends the test process with exit
//! status 101, so `cargo test` reports a failure instead of waiting. Nothing here touches a
//! mount, a process or a connection that no record of this process names, and nothing reads
//! `/proc/PID/cmdline` or `maps` (which block behind a process stuck in a page fault).
//!
//! # Machine-wide state
//! The bound keeps a test from hanging; it does not keep tests apart. A test that depends on
//! state no test owns (the kernel's FUSE connection numbers, the whole mount table, fusectl's
//! list of connections, a port nobody reserved) runs alone: it goes in
//! `tests/machine_wide.rs`, whose tests take that file's lock (`alone()`) first. `cargo test`
//! runs one test binary at a time, so while such a test runs no other test of the suite does.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::process::Lines;

/// Writes a line to this process's stderr itself, past libtest's output capture (a thread
/// spawned from a test inherits that test's capture, which is lost when the process exits).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// What one record names.
enum Item {
    /// A started process and its stderr lines.
    Pid(i32, Lines),
    /// A directory whose FUSE mounts (at it or below) are the test's.
    Dir(PathBuf),
}

/// One test's records.
struct Key {
    name: String,
    started: Instant,
    items: HashMap<u64, Item>,
    /// When the watchdog cut it off.
    cut: Option<Instant>,
}

#[derive(Default)]
struct Registry {
    keys: HashMap<u64, Key>,
}

fn registry() -> &'static Mutex<Registry> {
    static REG: OnceLock<Mutex<Registry>> = OnceLock::new();
    REG.get_or_init(|| {
        std::thread::Builder::new()
            .name("fuse-tests bound".into())
            .spawn(watchdog)
            .expect("the bound's watchdog thread");
        Mutex::new(Registry::default())
    })
}

fn lock() -> std::sync::MutexGuard<'static, Registry> {
    registry().lock().unwrap_or_else(|e| e.into_inner())
}

static NEXT: AtomicU64 = AtomicU64::new(1);

/// The key of the current thread: created with its first record, removed when the thread
/// ends (a thread-local's destructor).
struct Scope(u64);

impl Drop for Scope {
    fn drop(&mut self) {
        lock().keys.remove(&self.0);
    }
}

thread_local! {
    static SCOPE: Scope = {
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let t = std::thread::current();
        let name = t.name().map_or_else(|| format!("{:?}", t.id()), str::to_string);
        lock().keys.insert(id, Key { name, started: Instant::now(), items: HashMap::new(), cut: None });
        Scope(id)
    };
}

/// A record that lasts as long as this guard (dropped: the record goes).
#[must_use]
pub struct Record {
    key: u64,
    id: u64,
}

impl Drop for Record {
    fn drop(&mut self) {
        if let Some(k) = lock().keys.get_mut(&self.key) {
            k.items.remove(&self.id);
        }
    }
}

fn record(item: Item) -> Record {
    let key = SCOPE.with(|s| s.0);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    if let Some(k) = lock().keys.get_mut(&key) {
        k.items.insert(id, item);
    }
    Record { key, id }
}

/// Records a started process (its PID and the lines it writes on stderr) for the current test.
pub fn process(pid: i32, stderr: Lines) -> Record {
    record(Item::Pid(pid, stderr))
}

/// Records `dir` for the current test, for as long as the test runs: its FUSE mounts (at it or
/// below) are aborted and detached when the test outlives its bound.
pub fn own_dir(dir: &Path) {
    std::mem::forget(record(Item::Dir(dir.to_path_buf())));
}

/// The directory inside a temporary directory that `arg` names, if any: the top directory
/// under `/tmp`, `/dev/shm` or `/var/tmp` whose name starts with `.tmp` (tempfile's default)
/// or `drainfs-` (the harness's scratch directories), which is this test's alone.
pub fn temp_root(arg: &Path) -> Option<PathBuf> {
    let mut it = arg.components();
    let mut root = PathBuf::from("/");
    if it.next()? != std::path::Component::RootDir {
        return None;
    }
    let first = it.next()?.as_os_str().to_str()?;
    let base = match first {
        "tmp" => root.join("tmp"),
        "dev" | "var" => {
            let second = it.next()?.as_os_str().to_str()?;
            if (first, second) != ("dev", "shm") && (first, second) != ("var", "tmp") {
                return None;
            }
            root.join(first).join(second)
        }
        _ => return None,
    };
    let top = it.next()?.as_os_str().to_str()?;
    if !(top.starts_with(".tmp") || top.starts_with("drainfs-")) {
        return None;
    }
    root = base.join(top);
    Some(root)
}

/// Records, for the current test, the temporary directory each argument of a process lies in
/// ([`temp_root`]).
pub fn own_args<'a>(args: impl IntoIterator<Item = &'a std::ffi::OsStr>) {
    for a in args {
        let s = a.to_string_lossy();
        // `--opt=/tmp/x/y`, `fd=3,lowerdir=/tmp/...`: every absolute path inside.
        for part in s.split(['=', ',', ':']) {
            // A file there (the suite's ports counter) is no directory of the test's.
            if let Some(root) = temp_root(Path::new(part)).filter(|r| r.is_dir()) {
                own_dir(&root);
            }
        }
    }
}

/// The bound of one test: `DRAINFS_TEST_BOUND` seconds, or 420 (the slowest tests, the fd
/// budget over 100,000 files, took 131 s on a 2-core machine at load 40).
pub fn bound() -> Duration {
    let secs = std::env::var("DRAINFS_TEST_BOUND")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(420);
    Duration::from_secs(secs)
}

/// How long a cut-off test gets to end before the whole test process does: 30 s, or the
/// bound when that is shorter.
fn after_cut(bound: Duration) -> Duration {
    bound.min(Duration::from_secs(30))
}

fn watchdog() {
    let bound = bound();
    let grace = after_cut(bound);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = Instant::now();
        let mut reg = lock();
        let mut give_up = false;
        for key in reg.keys.values_mut() {
            match key.cut {
                None if now.duration_since(key.started) > bound => {
                    say!(
                        "\nfuse-tests bound: {} outlived its bound of {bound:?}: cutting it off",
                        key.name
                    );
                    cut(key);
                    key.cut = Some(now);
                }
                Some(at) if now.duration_since(at) > grace => give_up = true,
                _ => {}
            }
        }
        // A key that was cut and has ended leaves the registry with its thread: fail the run.
        let ended_after_cut =
            CUT_ANY.load(Ordering::Relaxed) && !reg.keys.values().any(|k| k.cut.is_some());
        if give_up || ended_after_cut {
            for key in reg.keys.values_mut() {
                if key.cut.is_none() {
                    say!(
                        "fuse-tests bound: also stopping {} (the test process ends)",
                        key.name
                    );
                    cut(key);
                }
            }
            say!("fuse-tests bound: a test outlived its bound; the test process exits 101");
            std::process::exit(101);
        }
    }
}

static CUT_ANY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Aborts and detaches the key's FUSE mounts, SIGKILLs its processes and what is below them,
/// and prints their stderr.
fn cut(key: &mut Key) {
    CUT_ANY.store(true, Ordering::Relaxed);
    let dirs: Vec<PathBuf> = key
        .items
        .values()
        .filter_map(|i| match i {
            Item::Dir(d) => Some(d.clone()),
            Item::Pid(..) => None,
        })
        .collect();
    let pids: Vec<i32> = key
        .items
        .values()
        .filter_map(|i| match i {
            Item::Pid(p, _) => Some(*p),
            Item::Dir(_) => None,
        })
        .collect();
    // The whole trees first: a SIGKILLed parent's children are reparented out of reach.
    let mut all = Vec::new();
    for &p in &pids {
        descendants(p, &mut all);
    }
    for m in fuse_mounts_under(&dirs) {
        let aborted = abort_connection(&m);
        let _ = nix::mount::umount2(&m.path, nix::mount::MntFlags::MNT_DETACH);
        say!(
            "fuse-tests bound: {}: {} (connection {}) {}, detached",
            key.name,
            m.path.display(),
            m.minor,
            if aborted {
                "aborted"
            } else {
                "not aborted (gone)"
            }
        );
    }
    for &p in &all {
        crate::process::send(p, nix::sys::signal::Signal::SIGKILL);
    }
    say!("fuse-tests bound: {}: SIGKILLed {all:?}", key.name);
    for i in key.items.values() {
        if let Item::Pid(p, lines) = i {
            let text = lines.lock().map(|l| l.join("\n")).unwrap_or_default();
            say!("fuse-tests bound: {}: stderr of {p}:\n{text}", key.name);
        }
    }
}

/// `pid` and every process below it (from `/proc/PID/task/*/children`, which takes no lock of
/// the process's memory).
fn descendants(pid: i32, out: &mut Vec<i32>) {
    if pid <= 0 || out.contains(&pid) {
        return;
    }
    out.push(pid);
    for c in crate::process::child_pids(pid) {
        descendants(c, out);
    }
}

/// A FUSE mount of this process's mount namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct FuseMount {
    /// Its mount point.
    pub path: PathBuf,
    /// Its connection number (the minor of its device number).
    pub minor: u32,
    /// Its device number as mountinfo shows it (`0:NN`).
    devno: String,
}

/// The FUSE mounts (type `fuse` or `fuse.*`, not `fuseblk`) at or under any of `dirs`, deepest
/// first.
pub fn fuse_mounts_under(dirs: &[PathBuf]) -> Vec<FuseMount> {
    let mut out: Vec<FuseMount> = crate::mounts::mountinfo_of("self")
        .into_iter()
        .filter(|m| m.fstype == "fuse" || m.fstype.starts_with("fuse."))
        .filter(|m| dirs.iter().any(|d| m.mount_point.starts_with(d)))
        .filter_map(|m| {
            let minor = m.devno.split(':').nth(1)?.parse().ok()?;
            Some(FuseMount {
                path: m.mount_point.clone(),
                minor,
                devno: m.devno.clone(),
            })
        })
        .collect();
    out.sort_by_key(|m| std::cmp::Reverse(m.path.components().count()));
    out.dedup();
    out
}

/// Aborts `m`'s connection: opens `/sys/fs/fuse/connections/<minor>`, then checks that `m` is
/// still mounted with that device number (so the directory is its connection's, not a later
/// one's with a reused number), then writes `1` to `abort` through the open directory (a
/// directory of an ended connection refuses it). Returns whether the write went through.
pub fn abort_connection(m: &FuseMount) -> bool {
    let dir = format!("{}/{}", crate::mounts::FUSECTL, m.minor);
    let Ok(d) = std::fs::File::open(&dir) else {
        return false;
    };
    let still = crate::mounts::mountinfo_of("self")
        .iter()
        .any(|x| x.mount_point == m.path && x.devno == m.devno);
    if !still || d.metadata().map(|md| md.nlink()).unwrap_or(0) == 0 {
        return false;
    }
    let abort = nix::fcntl::openat(
        &d,
        "abort",
        nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    );
    match abort {
        Ok(fd) => nix::unistd::write(&fd, b"1").is_ok(),
        Err(_) => false,
    }
}

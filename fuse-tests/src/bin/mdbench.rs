//! `mdbench`: a small metadata benchmark for `fuse-tests/bench/` (not part of the test suite).
//!
//! In a fresh directory it runs, one phase after the other, over `--files` files split evenly
//! between `--threads` threads (all threads work in the same directory, each on its own names):
//!
//! - `create`: `openat(O_CREAT|O_EXCL|O_WRONLY)` + `close` of every file;
//! - `stat`: `fstatat` of every file once (right after `create`: with a short entry/attribute
//!   TTL the older entries have expired, so this is a mix of cached and uncached stats);
//! - `stat_hot`: as many `fstatat` calls again, but cycling over a small hot set (the first
//!   [`HOT_SET`] files of each thread), so nearly every one is answered from the kernel's cache:
//!   this is the "cached stat" figure;
//! - `open_close`: `openat(O_RDONLY)` + `close` of every file;
//! - `unlink`: `unlinkat` of every file.
//!
//! Names are built before the clock starts and every call is made relative to a directory fd,
//! so the figures are the cost of the system calls alone. All threads start a phase together
//! (a barrier); each takes its own start and end time, and the phase lasts from the earliest
//! start to the latest end (a timer in a separate thread could be descheduled past the start). It prints one JSON document:
//! `ops_per_sec` is the aggregate throughput (all threads), `us_per_op` the mean time one
//! operation takes as seen by its thread (`elapsed * threads / ops`; for one thread, simply
//! `1e6 / ops_per_sec`).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use clap::Parser;

/// Files per thread that `stat_hot` cycles over.
const HOT_SET: usize = 256;

/// Phases, in the order they run.
const PHASES: [&str; 5] = ["create", "stat", "stat_hot", "open_close", "unlink"];

/// Metadata benchmark: create, stat, open+close and unlink of many files in one directory.
#[derive(Debug, Parser)]
#[command(name = "mdbench")]
struct Args {
    /// Directory to work in; created (must not exist), removed again at the end.
    #[arg(long)]
    dir: PathBuf,
    /// Total number of files (split evenly between the threads).
    #[arg(long, default_value_t = 10_000)]
    files: usize,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Keep the directory (do not rmdir it at the end).
    #[arg(long)]
    keep_dir: bool,
}

fn die(what: &str, name: &CString) -> ! {
    let e = std::io::Error::last_os_error();
    eprintln!("mdbench: {what} {}: {e}", name.to_string_lossy());
    std::process::exit(1);
}

/// Runs `phase` over `names` (this thread's files) against directory fd `dfd`.
fn run_phase(phase: &str, dfd: i32, names: &[CString]) {
    match phase {
        "create" => {
            for n in names {
                // SAFETY: `n` is NUL-terminated and `dfd` is a directory fd open for this whole run.
                let fd = unsafe {
                    libc::openat(
                        dfd,
                        n.as_ptr(),
                        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o644,
                    )
                };
                if fd < 0 {
                    die("create", n);
                }
                // SAFETY: `fd` was just returned by openat and is closed once, here.
                if unsafe { libc::close(fd) } != 0 {
                    die("close", n);
                }
            }
        }
        "stat" => {
            // SAFETY: an all-zero `struct stat` is a valid value (plain integers).
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            for n in names {
                // SAFETY: `n` is NUL-terminated, `dfd` is open, and `st` is a `struct stat` out-buffer.
                if unsafe { libc::fstatat(dfd, n.as_ptr(), &mut st, 0) } != 0 {
                    die("stat", n);
                }
            }
        }
        "stat_hot" => {
            // SAFETY: an all-zero `struct stat` is a valid value (plain integers).
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            let hot = &names[..names.len().min(HOT_SET)];
            for n in hot.iter().cycle().take(names.len()) {
                // SAFETY: `n` is NUL-terminated, `dfd` is open, and `st` is a `struct stat` out-buffer.
                if unsafe { libc::fstatat(dfd, n.as_ptr(), &mut st, 0) } != 0 {
                    die("stat", n);
                }
            }
        }
        "open_close" => {
            for n in names {
                // SAFETY: `n` is NUL-terminated and `dfd` is a directory fd open for this whole run.
                let fd = unsafe { libc::openat(dfd, n.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
                if fd < 0 {
                    die("open", n);
                }
                // SAFETY: `fd` was just returned by openat and is closed once, here.
                if unsafe { libc::close(fd) } != 0 {
                    die("close", n);
                }
            }
        }
        "unlink" => {
            for n in names {
                // SAFETY: `n` is NUL-terminated and `dfd` is a directory fd open for this whole run.
                if unsafe { libc::unlinkat(dfd, n.as_ptr(), 0) } != 0 {
                    die("unlink", n);
                }
            }
        }
        other => unreachable!("phase {other}"),
    }
}

fn main() {
    let args = Args::parse();
    let threads = args.threads.max(1);
    let per_thread = (args.files / threads).max(1);
    let total = per_thread * threads;

    if let Err(e) = std::fs::create_dir(&args.dir) {
        eprintln!("mdbench: mkdir {}: {e}", args.dir.display());
        std::process::exit(1);
    }
    let cdir = CString::new(args.dir.as_os_str().as_bytes()).expect("dir has no NUL");
    // SAFETY: opening a directory by a NUL-terminated path.
    let raw = unsafe {
        libc::open(
            cdir.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if raw < 0 {
        die("open dir", &cdir);
    }
    // SAFETY: `raw` is a fresh fd we own.
    let dir_fd = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });

    // One barrier wait per phase: all workers start it together and time themselves.
    let barrier = Arc::new(Barrier::new(threads));
    let mut workers = Vec::with_capacity(threads);
    for t in 0..threads {
        let names: Vec<CString> = (0..per_thread)
            .map(|i| CString::new(format!("t{t}-f{i:07}")).expect("no NUL"))
            .collect();
        let barrier = Arc::clone(&barrier);
        let dir_fd = Arc::clone(&dir_fd);
        workers.push(std::thread::spawn(move || {
            let dfd = dir_fd.as_raw_fd();
            let mut times = Vec::with_capacity(PHASES.len());
            for phase in PHASES {
                barrier.wait();
                let start = Instant::now();
                run_phase(phase, dfd, &names);
                times.push((start, Instant::now()));
            }
            times
        }));
    }

    let times: Vec<Vec<(Instant, Instant)>> = workers
        .into_iter()
        .map(|w| w.join().expect("worker panicked"))
        .collect();
    let mut phases = serde_json::Map::new();
    for (i, phase) in PHASES.iter().enumerate() {
        let start = times.iter().map(|t| t[i].0).min().expect("a thread");
        let end = times.iter().map(|t| t[i].1).max().expect("a thread");
        let secs = end.duration_since(start).as_secs_f64();
        let ops_per_sec = total as f64 / secs;
        let us_per_op = secs * 1e6 * threads as f64 / total as f64;
        phases.insert(
            phase.to_string(),
            serde_json::json!({
                "ops": total,
                "secs": secs,
                "ops_per_sec": ops_per_sec,
                "us_per_op": us_per_op,
            }),
        );
    }
    drop(dir_fd);
    if !args.keep_dir {
        if let Err(e) = std::fs::remove_dir(&args.dir) {
            eprintln!("mdbench: rmdir {}: {e}", args.dir.display());
            std::process::exit(1);
        }
    }

    let doc = serde_json::json!({
        "dir": args.dir,
        "files": total,
        "threads": threads,
        "hot_set": HOT_SET,
        "phases": phases,
    });
    println!("{}", serde_json::to_string_pretty(&doc).expect("json"));
}

//! A FUSE mount that stops answering, on purpose, with processes stuck on it: the object
//! drainfs does not own and must never block on (issue 28).
//!
//! [`WedgedFuse`] serves one directory with files `a` to `z` from a fuser session inside the
//! test process. It answers INIT, LOOKUP, GETATTR, OPEN (keeping the page cache, so an open
//! never waits on another process's pending read), FLUSH and RELEASE, and takes every READ
//! without ever answering it: a process that reads a file sleeps in the kernel until the
//! answer comes (interruptibly at first; once it is killed, uninterruptibly, because the
//! request is in the daemon's hands), and one that faults in a page of a mapping of it waits
//! for the page's lock (`D`). An open with `O_DSYNC` is answered with direct I/O, whose
//! private `mmap` first drops the file's page cache, with the process's memory-map lock held
//! for writing (see `wedge-victim mmaplock`). [`WedgedFuse::hang`] makes it take every
//! later request the same way (a daemon that hangs outright).
//!
//! Everything it wedges is bounded and cleaned up by its own record, at its deadline (a
//! watchdog thread) or on drop, whichever comes first, also when the test panics: the FUSE
//! connection it made is aborted through the FUSE control file system's directory of that
//! connection, checked by the directory's inode taken right after the mount and by the
//! mount's device number (a connection number is reused on the node once its connection is
//! gone), which fails every pending request; then the processes it started are SIGKILLed and
//! reaped by PID, and the mount is detached while it is still its own.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, ReplyAttr, ReplyData, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};
use parking_lot::Mutex;

use crate::mounts::{FUSECTL, mountinfo_of, top_at};

/// The size of every file.
pub const FILE_SIZE: u64 = 1 << 20;

const TTL: Duration = Duration::from_secs(3600);
const ROOT: INodeNo = INodeNo(1);

/// The inode of the file `name` (`a` to `z`).
fn file_ino(name: &OsStr) -> Option<INodeNo> {
    match name.as_encoded_bytes() {
        [c @ b'a'..=b'z'] => Some(INodeNo(2 + u64::from(c - b'a'))),
        _ => None,
    }
}

/// What the session shares with the test: whether it hangs, and the replies it keeps.
#[derive(Default)]
struct State {
    hang: AtomicBool,
    /// Replies never sent; dropped (answered with an error nobody reads) after the abort.
    kept: Mutex<Vec<Box<dyn Send>>>,
    /// READs taken (and kept).
    reads: std::sync::atomic::AtomicUsize,
}

struct Wedge(Arc<State>);

impl Wedge {
    /// Keeps `reply` unanswered when hanging; otherwise hands it back.
    fn hold<R: Send + 'static>(&self, reply: R) -> Option<R> {
        if self.0.hang.load(Ordering::SeqCst) {
            self.0.kept.lock().push(Box::new(reply));
            None
        } else {
            Some(reply)
        }
    }
}

fn attr(ino: INodeNo) -> FileAttr {
    let (kind, perm, size, nlink) = if ino == ROOT {
        (FileType::Directory, 0o755, 0, 2)
    } else {
        (FileType::RegularFile, 0o644, FILE_SIZE, 1)
    };
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    FileAttr {
        ino,
        size,
        blocks: size / 512,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        kind,
        perm,
        nlink,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Filesystem for Wedge {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(reply) = self.hold(reply) else {
            return;
        };
        if let Some(ino) = file_ino(name).filter(|_| parent == ROOT) {
            reply.entry(&TTL, &attr(ino), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let Some(reply) = self.hold(reply) else {
            return;
        };
        reply.attr(&TTL, &attr(ino));
    }

    fn open(&self, _req: &Request, _ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let Some(reply) = self.hold(reply) else {
            return;
        };
        // An O_DSYNC open gets direct I/O (see `wedge-victim mmaplock`).
        let direct = if flags.0 & libc::O_DSYNC != 0 {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        };
        reply.opened(FileHandle(1), FopenFlags::FOPEN_KEEP_CACHE | direct);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // Never answered: the reader waits for as long as the connection lives.
        self.0.reads.fetch_add(1, Ordering::SeqCst);
        self.0.kept.lock().push(Box::new(reply));
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let Some(reply) = self.hold(reply) else {
            return;
        };
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let Some(reply) = self.hold(reply) else {
            return;
        };
        reply.statfs(0, 0, 0, 0, 0, 4096, 255, 0);
    }
}

/// The connection a [`WedgedFuse`] made, as recorded right after mounting: its number, the
/// inode of its directory under [`FUSECTL`], and the mount's device number.
#[derive(Clone, Copy, Debug)]
struct Record {
    minor: u32,
    ctl_ino: u64,
    dev: u64,
}

impl Record {
    /// Writes `FUSECTL/<minor>/abort` if that directory is still this connection's (same
    /// inode, opened first, so the abort file belongs to the directory checked). Returns
    /// whether it wrote.
    fn abort(&self) -> bool {
        use std::os::fd::AsRawFd;
        let dir = format!("{FUSECTL}/{}", self.minor);
        let Ok(d) = std::fs::File::open(&dir) else {
            return false;
        };
        if d.metadata().map(|m| m.ino()).ok() != Some(self.ctl_ino) {
            return false;
        }
        let name = c"abort";
        // SAFETY: openat on a directory fd we hold and a NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                d.as_raw_fd(),
                name.as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return false;
        }
        // SAFETY: fd is a fresh fd we own.
        let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        std::io::Write::write_all(&mut &f, b"1").is_ok()
    }
}

/// Everything to undo, shared by the guard and its watchdog: done once, by whichever comes
/// first.
struct Cleanup {
    record: Record,
    path: PathBuf,
    victims: Mutex<Vec<Child>>,
    done: AtomicBool,
}

impl Cleanup {
    fn run(&self) {
        if self.done.swap(true, Ordering::SeqCst) {
            return;
        }
        // First the connection: every request pending on it fails, so nothing sleeps on it.
        self.record.abort();
        for mut c in self.victims.lock().drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Detach the mount only while the topmost mount at the path is still this one.
        if top_at(&mountinfo_of("self"), &self.path).is_some_and(|m| {
            m.devno
                == format!(
                    "{}:{}",
                    libc::major(self.record.dev),
                    libc::minor(self.record.dev)
                )
        }) {
            let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// A FUSE mount whose READs (and, after [`WedgedFuse::hang`], every request) are never
/// answered; see the module's doc.
pub struct WedgedFuse {
    /// Where it is mounted.
    pub path: PathBuf,
    state: Arc<State>,
    cleanup: Arc<Cleanup>,
    session: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl WedgedFuse {
    /// Mounts it at the directory `path` (as root, `mount(2)` on a fresh `/dev/fuse`), and
    /// starts a watchdog that cleans everything up `deadline` from now.
    ///
    /// # Panics
    /// When the mount fails or cannot be found and recorded.
    pub fn mount(path: &Path, deadline: Duration) -> WedgedFuse {
        use std::os::fd::{AsRawFd, OwnedFd};
        let dev: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .expect("open /dev/fuse")
            .into();
        let data = format!(
            "fd={},rootmode=40000,user_id=0,group_id=0,allow_other",
            dev.as_raw_fd()
        );
        nix::mount::mount(
            Some("wedged"),
            path,
            Some("fuse.wedged"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(data.as_str()),
        )
        .unwrap_or_else(|e| panic!("mount a wedged FUSE file system at {}: {e}", path.display()));
        let m = top_at(&mountinfo_of("self"), path).expect("the wedged mount in mountinfo");
        let (major, minor) = m.devno.split_once(':').expect("major:minor");
        let (major, minor): (u32, u32) = (major.parse().unwrap(), minor.parse().unwrap());
        let ctl_ino = std::fs::metadata(format!("{FUSECTL}/{minor}"))
            .expect("the connection's fusectl directory (mount fusectl first)")
            .ino();
        let record = Record {
            minor,
            ctl_ino,
            dev: libc::makedev(major, minor),
        };
        let state = Arc::new(State::default());
        let mut config = fuser::Config::default();
        config.n_threads = Some(2);
        let session = fuser::Session::from_fd(
            Wedge(Arc::clone(&state)),
            dev,
            fuser::SessionACL::All,
            config,
        )
        .expect("a session on the wedged mount");
        let session = std::thread::Builder::new()
            .name("wedged-fuse".into())
            .spawn(move || session.run())
            .expect("the session thread");
        let cleanup = Arc::new(Cleanup {
            record,
            path: path.to_path_buf(),
            victims: Mutex::new(Vec::new()),
            done: AtomicBool::new(false),
        });
        let watchdog = Arc::clone(&cleanup);
        let until = Instant::now() + deadline;
        std::thread::spawn(move || {
            while Instant::now() < until && !watchdog.done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(50));
            }
            if !watchdog.done.load(Ordering::SeqCst) {
                eprintln!("wedge: deadline reached: aborting the wedged connection");
                watchdog.run();
            }
        });
        let w = WedgedFuse {
            path: path.to_path_buf(),
            state,
            cleanup,
            session: Some(session),
        };
        // INIT went through once a request is answered.
        assert!(
            crate::wait::wait_until(Duration::from_secs(10), || std::fs::metadata(
                w.path.join("a")
            )
            .is_ok()),
            "the wedged mount does not answer LOOKUP"
        );
        w
    }

    /// The file `name` (`a` to `z`), whose READs are never answered.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// From now on every request is taken and never answered.
    pub fn hang(&self) {
        self.state.hang.store(true, Ordering::SeqCst);
    }

    /// How many READs were taken (and never answered).
    pub fn reads(&self) -> usize {
        self.state.reads.load(Ordering::SeqCst)
    }

    /// Starts `cmd` (stdin, stdout and stderr null) as a process this guard kills by PID at
    /// the cleanup; returns its PID.
    ///
    /// # Panics
    /// When it cannot be spawned.
    pub fn start(&self, mut cmd: Command) -> i32 {
        let c = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn a process for the wedged mount");
        let pid = c.id() as i32;
        self.cleanup.victims.lock().push(c);
        pid
    }

    /// Aborts its connection now (by its record) and leaves the mount in place: a dead FUSE
    /// mount ("Transport endpoint is not connected"), as a killed daemon leaves it.
    pub fn kill_connection(&self) {
        self.cleanup.record.abort();
    }

    /// Whether the connection was aborted (by the deadline or the drop).
    pub fn cleaned_up(&self) -> bool {
        self.cleanup.done.load(Ordering::SeqCst)
    }
}

impl Drop for WedgedFuse {
    fn drop(&mut self) {
        self.cleanup.run();
        if let Some(s) = self.session.take() {
            // The abort ends the session's reads with ENODEV.
            let until = Instant::now() + Duration::from_secs(5);
            while !s.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
            if s.is_finished() {
                let _ = s.join();
            }
        }
        self.state.kept.lock().clear();
    }
}

/// The scheduler state (`R`, `S`, `D`, `Z`...) of every thread of `pid`, from
/// `/proc/PID/task/*/stat` (which takes no lock of the process's memory map).
pub fn thread_states(pid: i32) -> Vec<(i32, char)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let tid: i32 = t.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            let state = stat[stat.rfind(')')? + 1..].trim_start().chars().next()?;
            Some((tid, state))
        })
        .collect()
}

/// Whether some thread of `pid` is in uninterruptible sleep (`D`).
pub fn has_d_thread(pid: i32) -> bool {
    thread_states(pid).iter().any(|(_, s)| *s == 'D')
}

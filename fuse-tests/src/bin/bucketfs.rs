//! `bucketfs`: a gcsfuse-like FUSE filesystem used as the *lower* filesystem in drainfs's
//! end-to-end tests.
//!
//! drainfs stands in front of gcsfuse, and what it has to get right at shutdown is exactly
//! what makes gcsfuse different from a local disk. Running real gcsfuse in tests needs a
//! bucket and credentials, so this binary mimics the behaviours that matter, on top of a
//! plain local directory that plays the bucket:
//!
//! - **Data is published only at FLUSH or FSYNC.** Writes go to a per-inode, anonymous
//!   staging file (in `--staging`, a temporary directory by default), never to the bucket.
//!   When a handle of a dirty file is flushed (the application's `close()`) or fsynced, the
//!   whole staged content is "uploaded": after `--upload-delay` it is copied into a
//!   `.bucketfs-tmp-*` file in the bucket root and renamed onto its key, so readers of the
//!   bucket see either the old or the new object, never a torn one. Temp files are hidden
//!   from the mount. Dirty data that was never flushed is **lost** when the filesystem is
//!   unmounted or the process dies, as with gcsfuse.
//! - **FLUSH is synchronous**: `close(2)` waits for the upload, so `--upload-delay 2s` makes
//!   every `close()` of a written file take two seconds.
//! - **Upload failures and hangs can be injected** per key (`--fail-upload SUBSTR` answers
//!   the FLUSH/FSYNC with `EIO` and publishes nothing; `--hang-upload SUBSTR` never answers,
//!   while other requests keep being served by the other worker threads).
//! - **Signals as gcsfuse handles them**: SIGINT (and SIGTERM since gcsfuse v2.6.0) unmount
//!   and exit 0 once the session loop ends; an unmount that fails with `EBUSY` is logged and
//!   the process keeps serving. `--sigterm instant` reproduces gcsfuse before v2.6.0: SIGTERM
//!   kills the process at once, leaving a dead mount (`Transport endpoint is not connected`).
//!   Signals are blocked in every thread and consumed by one `sigwait` thread, so they never
//!   interrupt a worker blocked in an upload.
//! - **`--mountpoint /dev/fd/N` serves an already-open connection**, as gcsfuse does in GKE's
//!   CSI sidecar: fd N is a `/dev/fuse` fd someone else mounted, or a relay's socket. Nothing
//!   is mounted or unmounted; SIGINT/SIGTERM are logged as "externally managed" and the process
//!   keeps serving (so only SIGKILL stops it, as with gcsfuse). End-of-stream on a socket (the
//!   relay's `shutdown(SHUT_WR)`) is a clean stop: the workers finish what they are serving
//!   and the process exits 0. fuser answers INIT with `max_write` = 16 MiB.
//! - **`--rename-new-inode` renames as gcsfuse does**: a rename is a copy and a delete of
//!   objects, so the new name (and every name under a renamed directory) is a new inode with a
//!   new number, the old inodes are gone, and entries are given to the kernel with TTL 0.
//!   Without it a rename keeps the inode, as on a local disk.
//! - **Inode numbers come from a counter**, the mount uses `allow_other` and
//!   `default_permissions`, and readiness is announced with gcsfuse's stdout line
//!   `File system has been successfully mounted.`
//!
//! - **Daemon-side edges for the relay's tests**: `--notify-on-read SUBSTR` and
//!   `--notify-on-lookup SUBSTR` send `NOTIFY_INVAL_INODE` / `NOTIFY_INVAL_ENTRY` from a
//!   thread of their own while the READ / LOOKUP that prompted them is still pending (answered
//!   `--notify-lead` later), as jacobsa/fuse daemons do from their notifier goroutine, once
//!   per key;
//!   `--open-enosys` answers OPEN with ENOSYS (the kernel's no-open mode);
//!   `--oversized-read SUBSTR` answers READs one byte longer than asked, a reply the kernel
//!   refuses with EINVAL (after failing the READ with EIO itself).
//!
//! With `--events FILE` every interesting moment (mount, upload start/done/failure, signal,
//! unmount, exit) is appended to `FILE` as one JSON object per line, for tests to assert
//! on; see `fuse_tests::bucket` for a reader.
//!
//! Object keys are bucket-relative paths with `/` separators and must be UTF-8 (as GCS
//! object names are). Only regular files and directories of the bucket are shown.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, Session,
    SessionACL, TimeOrNow, WriteFlags,
};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
use nix::sys::stat::{Mode, fchmod, futimens};
use nix::sys::time::TimeSpec;
use parking_lot::Mutex;
use serde_json::json;

/// Name prefix of the temporary objects an upload writes before renaming them onto their
/// key. Entries with this prefix are invisible through the mount.
const TMP_PREFIX: &str = ".bucketfs-tmp-";

/// How long the kernel may cache entries and attributes (gcsfuse caches for longer; a short
/// TTL keeps tests that look at the bucket directly honest).
const TTL: Duration = Duration::from_secs(1);

/// The line gcsfuse prints once the file system is mounted and serving.
const MOUNTED_LINE: &str = "File system has been successfully mounted.";

/// Command line of `bucketfs`.
#[derive(Parser, Debug)]
#[command(
    name = "bucketfs",
    version,
    about = "A gcsfuse-like FUSE test backend: a local directory as a bucket, objects \
             published only on flush/fsync"
)]
struct Args {
    /// Directory that plays the bucket (must exist).
    #[arg(long, value_name = "DIR")]
    bucket: PathBuf,

    /// Where to mount (must exist and be a directory), or `/dev/fd/N`: serve the FUSE
    /// connection already open as fd N (a mounted `/dev/fuse` fd, or one end of a relay's
    /// socketpair) instead of mounting, as gcsfuse does in GKE's CSI sidecar.
    #[arg(long, value_name = "DIR|/dev/fd/N")]
    mountpoint: PathBuf,

    /// Directory for staging files (created if missing). Default: `$TMPDIR/bucketfs-staging`
    /// (`/tmp` without `TMPDIR`), shared by every bucketfs and created mode 1777. Staging files
    /// are anonymous (`tempfile::tempfile_in`: `O_TMPFILE`, or unlinked at creation), so the
    /// directory stays empty and a killed bucketfs leaves nothing behind.
    #[arg(long, value_name = "DIR")]
    staging: Option<PathBuf>,

    /// Time every upload takes before its object is published (e.g. `2s`, `500ms`).
    #[arg(long, value_name = "DUR", default_value = "0s", value_parser = humantime::parse_duration)]
    upload_delay: Duration,

    /// Apply `--upload-delay` only to keys containing SUBSTR (default: every key).
    #[arg(long, value_name = "SUBSTR")]
    slow_upload: Option<String>,

    /// Uploads of keys containing SUBSTR fail: FLUSH/FSYNC answer EIO, nothing is published.
    #[arg(long, value_name = "SUBSTR")]
    fail_upload: Option<String>,

    /// Uploads of keys containing SUBSTR never return (the FLUSH/FSYNC is never answered).
    #[arg(long, value_name = "SUBSTR")]
    hang_upload: Option<String>,

    /// Answer the kernel's INIT with ENOSYS (a daemon that refuses the connection); on a
    /// `/dev/fd/N` connection, then keep it open until its end-of-stream and exit.
    #[arg(long)]
    refuse_init: bool,

    /// Reads of keys containing SUBSTR first sleep `--read-delay` (the worker thread is busy
    /// meanwhile; other workers keep serving).
    #[arg(long, value_name = "SUBSTR")]
    slow_read: Option<String>,

    /// How long each read of a `--slow-read` key sleeps before answering (cut short when a
    /// stop signal makes bucketfs unmount).
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = humantime::parse_duration)]
    read_delay: Duration,

    /// READs of keys containing SUBSTR are answered with one byte more than the kernel asked
    /// for: a reply the kernel refuses (the write gives EINVAL), failing that READ with EIO
    /// itself.
    #[arg(long, value_name = "SUBSTR")]
    oversized_read: Option<String>,

    /// What SIGTERM does: `graceful` (unmount and exit, gcsfuse >= v2.6.0) or `instant` (die at
    /// once without unmounting, gcsfuse < v2.6.0).
    #[arg(long, value_enum, default_value_t = SigtermMode::Graceful)]
    sigterm: SigtermMode,

    /// Append one JSON object per line to FILE for every mount, upload, signal and exit.
    #[arg(long, value_name = "FILE")]
    events: Option<PathBuf>,

    /// The first READ of a key containing SUBSTR: another thread sends NOTIFY_INVAL_INODE for
    /// the inode (all its pages), and the READ is answered `--notify-lead` later, while the
    /// notification may be waiting for the folio that READ holds.
    #[arg(long, value_name = "SUBSTR")]
    notify_on_read: Option<String>,

    /// The first LOOKUP of a name containing SUBSTR: another thread sends NOTIFY_INVAL_ENTRY for
    /// the name, and the LOOKUP is answered `--notify-lead` later, while the notification may be
    /// waiting for the directory that LOOKUP holds.
    #[arg(long, value_name = "SUBSTR")]
    notify_on_lookup: Option<String>,

    /// How long a READ or LOOKUP that sent a notification waits before it is answered.
    #[arg(long, value_name = "DUR", default_value = "300ms", value_parser = humantime::parse_duration)]
    notify_lead: Duration,

    /// Answer OPEN with ENOSYS: the kernel then stops sending OPEN and RELEASE for files (its
    /// no-open mode), as some daemons choose.
    #[arg(long)]
    open_enosys: bool,

    /// Renames as gcsfuse makes them (a copy of the objects under the new key and a delete
    /// of the old ones): the new name, and every name under a renamed directory, is a new
    /// inode (a new number at its next lookup) and the old inodes are gone; entries and
    /// attributes are given to the kernel with TTL 0, as gcsfuse (without its dentry cache)
    /// gives entries, so each path walk looks the name up again.
    #[arg(long)]
    rename_new_inode: bool,

    /// Number of FUSE worker threads (each with its own cloned /dev/fuse fd).
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
}

/// What SIGTERM does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum SigtermMode {
    /// Like SIGINT: unmount, then exit 0 when the session ends (gcsfuse v2.6.0 and later).
    Graceful,
    /// Die immediately by SIGTERM without unmounting (gcsfuse before v2.6.0).
    Instant,
}

/// Milliseconds since the UNIX epoch, the `t_ms` of every event.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The `--events` log: one JSON object per line, each appended with a single `write(2)` on an
/// `O_APPEND` file, so lines from concurrent threads never interleave and are visible at once.
struct Events {
    /// The open log, if `--events` was given.
    file: Option<Mutex<File>>,
}

impl Events {
    /// Opens (creating if needed) the log file in append mode.
    fn open(path: Option<&Path>) -> io::Result<Events> {
        let file = match path {
            Some(p) => Some(Mutex::new(
                OpenOptions::new().create(true).append(true).open(p)?,
            )),
            None => None,
        };
        Ok(Events { file })
    }

    /// Appends `value` (a JSON object) with a `t_ms` timestamp added.
    fn log(&self, mut value: serde_json::Value) {
        let Some(file) = &self.file else { return };
        value["t_ms"] = json!(now_ms());
        let mut line = value.to_string();
        line.push('\n');
        let guard = file.lock();
        let mut f: &File = &guard;
        if let Err(e) = f.write_all(line.as_bytes()) {
            eprintln!("bucketfs: cannot write event log: {e}");
        }
    }
}

/// Upload and read behaviour chosen on the command line.
#[derive(Debug, Clone)]
struct UploadPolicy {
    /// Sleep before each upload publishes.
    delay: Duration,
    /// Only keys containing this are delayed (`None`: every key).
    slow_upload: Option<String>,
    /// Keys containing this fail to upload.
    fail: Option<String>,
    /// Keys containing this hang forever.
    hang: Option<String>,
    /// Reads of keys containing this sleep `read_delay` first.
    slow_read: Option<String>,
    /// Sleep before each slow read.
    read_delay: Duration,
    /// READs of keys containing this are answered with one byte more than asked for.
    oversized_read: Option<String>,
}

/// One inode: a directory or an object (regular file) of the bucket.
struct Node {
    /// Inode number handed to the kernel (from a counter, root is 1).
    ino: u64,
    /// `Directory` or `RegularFile`; never changes for a given inode.
    kind: FileType,
    /// Mutable state. Lock order: `BucketFs::tables` before any node's state, and never more
    /// than one node's state at a time.
    state: Mutex<NodeState>,
}

/// Mutable part of a [`Node`].
struct NodeState {
    /// Bucket-relative key with `/` separators; empty for the root.
    key: String,
    /// Removed from the namespace (unlinked, rmdir'ed or replaced by a rename).
    unlinked: bool,
    /// Created through the mount and never published: exists only as its staging file.
    local: bool,
    /// Staged content, if the file was created or written through the mount. Anonymous
    /// (already unlinked), so it vanishes with the process.
    staging: Option<File>,
    /// The staged content differs from the published object.
    dirty: bool,
    /// Number of open file handles.
    handles: u32,
}

/// Inode table: numbers to nodes and keys to numbers.
struct Tables {
    /// All live inodes by number.
    nodes: HashMap<u64, Arc<Node>>,
    /// Current key of every inode still in the namespace.
    by_key: HashMap<String, u64>,
    /// Next inode number to hand out.
    next_ino: u64,
}

impl Tables {
    /// Allocates a new inode for `key`, replacing (and unlinking) any previous one.
    fn alloc(&mut self, key: &str, kind: FileType, local: bool) -> Arc<Node> {
        let ino = self.next_ino;
        self.next_ino += 1;
        let node = Arc::new(Node {
            ino,
            kind,
            state: Mutex::new(NodeState {
                key: key.to_owned(),
                unlinked: false,
                local,
                staging: None,
                dirty: false,
                handles: 0,
            }),
        });
        if let Some(old) = self.by_key.insert(key.to_owned(), ino) {
            self.forget_unlinked(old);
        }
        self.nodes.insert(ino, node.clone());
        node
    }

    /// Returns the inode currently at `key` if it has `kind`, or allocates one.
    fn get_or_alloc(&mut self, key: &str, kind: FileType) -> Arc<Node> {
        if let Some(node) = self.by_key.get(key).and_then(|ino| self.nodes.get(ino)) {
            if node.kind == kind {
                return node.clone();
            }
        }
        self.alloc(key, kind, false)
    }

    /// Takes the inode at `key` out of the namespace (it stays usable through open handles).
    fn unlink_key(&mut self, key: &str) {
        if let Some(ino) = self.by_key.remove(key) {
            self.forget_unlinked(ino);
        }
    }

    /// Marks `ino` unlinked; drops it from the table right away if nothing has it open.
    fn forget_unlinked(&mut self, ino: u64) {
        let Some(node) = self.nodes.get(&ino).cloned() else {
            return;
        };
        let mut st = node.state.lock();
        st.unlinked = true;
        if st.handles == 0 {
            st.staging = None;
            st.dirty = false;
            drop(st);
            self.nodes.remove(&ino);
        }
    }
}

/// A directory listing taken at `opendir`: inode number, type and name of each entry.
type DirListing = Vec<(u64, FileType, String)>;

/// An open file handle.
struct Handle {
    /// Inode the handle belongs to.
    ino: u64,
    /// The published object as it was at open time, for reads while no staging file exists.
    object: Option<Arc<File>>,
}

/// The filesystem: a bucket directory seen through staged, flush-published objects.
struct BucketFs {
    /// Canonical path of the bucket directory.
    bucket: PathBuf,
    /// Directory where anonymous staging files are created.
    staging_dir: PathBuf,
    /// Upload delay and fault injection.
    policy: UploadPolicy,
    /// Event log.
    events: Arc<Events>,
    /// Inode table.
    tables: Mutex<Tables>,
    /// Open file handles.
    handles: Mutex<HashMap<u64, Handle>>,
    /// Directory listings taken at `opendir`, by handle.
    dirs: Mutex<HashMap<u64, DirListing>>,
    /// Next file or directory handle.
    next_fh: AtomicU64,
    /// Counter for unique temp object names.
    next_tmp: AtomicU64,
    /// `--refuse-init`.
    refuse_init: bool,
    /// `--notify-on-read`, `--notify-on-lookup`, `--notify-lead`.
    notify: NotifyPolicy,
    /// The (kind, key) pairs a notification was sent for: each is sent once.
    notified: Mutex<std::collections::HashSet<(&'static str, String)>>,
    /// The session's notifier, once the session exists.
    notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    /// `--open-enosys`.
    open_enosys: bool,
    /// `--rename-new-inode`.
    rename_new_inode: bool,
    /// Entry and attribute TTL given to the kernel ([`TTL`], or zero with
    /// `--rename-new-inode`).
    ttl: Duration,
}

/// Which requests send a notification first, and how long they then wait to be answered.
#[derive(Debug, Clone, Default)]
struct NotifyPolicy {
    /// READs of keys containing this send NOTIFY_INVAL_INODE.
    read: Option<String>,
    /// LOOKUPs of names containing this send NOTIFY_INVAL_ENTRY.
    lookup: Option<String>,
    /// The wait before the request is answered.
    lead: Duration,
}

/// Converts an I/O error to the errno the kernel should see.
fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

/// Converts a nix error to a fuser errno.
fn nix_errno(e: nix::errno::Errno) -> Errno {
    Errno::from_i32(e as i32)
}

/// Converts seconds and nanoseconds since the epoch (as in `stat`) to a `SystemTime`.
fn system_time(sec: i64, nsec: i64) -> SystemTime {
    let nsec = u32::try_from(nsec.clamp(0, 999_999_999)).unwrap_or(0);
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec.unsigned_abs(), nsec)
    } else {
        UNIX_EPOCH - Duration::new(sec.unsigned_abs(), 0) + Duration::new(0, nsec)
    }
}

/// Converts a `SystemTime` to a `TimeSpec` for `futimens`.
fn timespec(t: SystemTime) -> TimeSpec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => TimeSpec::from_duration(d),
        Err(_) => TimeSpec::new(0, 0),
    }
}

/// Converts a setattr time to a `TimeSpec` (`UTIME_OMIT` when absent).
fn time_or_now(t: Option<TimeOrNow>) -> TimeSpec {
    match t {
        None => TimeSpec::UTIME_OMIT,
        Some(TimeOrNow::Now) => TimeSpec::UTIME_NOW,
        Some(TimeOrNow::SpecificTime(t)) => timespec(t),
    }
}

/// Builds the attributes of inode `ino` from the metadata of its backing file.
fn attr_from_meta(ino: u64, kind: FileType, m: &fs::Metadata) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: m.size(),
        blocks: m.blocks(),
        atime: system_time(m.atime(), m.atime_nsec()),
        mtime: system_time(m.mtime(), m.mtime_nsec()),
        ctime: system_time(m.ctime(), m.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind,
        perm: u16::try_from(m.mode() & 0o7777).unwrap_or(0o644),
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid: m.uid(),
        gid: m.gid(),
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// Whether `name` is one of bucketfs's own temp objects.
fn is_hidden(name: &str) -> bool {
    name.starts_with(TMP_PREFIX)
}

/// Joins a parent key and a child name into a key.
fn join_key(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}/{name}")
    }
}

/// The parent key of `key` (empty for top-level keys).
fn parent_key(key: &str) -> &str {
    key.rsplit_once('/').map_or("", |(p, _)| p)
}

/// Checks a name coming from the kernel: it must be UTF-8 (object names are).
fn utf8_name(name: &OsStr) -> Result<&str, Errno> {
    name.to_str().ok_or(Errno::EINVAL)
}

/// Reads up to `size` bytes at `offset`, stopping early only at end of file.
fn read_full(file: &File, offset: u64, size: u32) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; size as usize];
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(done);
    Ok(buf)
}

/// Copies the whole of `src` (from offset 0) to the current position of `dst`.
fn copy_all(src: &File, dst: &mut File) -> io::Result<u64> {
    let mut src = src;
    src.seek(SeekFrom::Start(0))?;
    io::copy(&mut src, dst)
}

impl BucketFs {
    /// Creates the filesystem over `bucket` (canonical) with staging files in `staging_dir`.
    fn new(
        bucket: PathBuf,
        staging_dir: PathBuf,
        policy: UploadPolicy,
        events: Arc<Events>,
    ) -> BucketFs {
        let mut tables = Tables {
            nodes: HashMap::new(),
            by_key: HashMap::new(),
            next_ino: 1,
        };
        let root = tables.alloc("", FileType::Directory, false);
        debug_assert_eq!(root.ino, INodeNo::ROOT.0);
        BucketFs {
            bucket,
            staging_dir,
            policy,
            events,
            tables: Mutex::new(tables),
            handles: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            next_tmp: AtomicU64::new(1),
            refuse_init: false,
            notify: NotifyPolicy::default(),
            notified: Mutex::new(std::collections::HashSet::new()),
            notifier: Arc::new(std::sync::OnceLock::new()),
            open_enosys: false,
            rename_new_inode: false,
            ttl: TTL,
        }
    }

    /// Sends a notification from a thread of its own (logging `notify_sent` with its result
    /// once the kernel took it), then waits `--notify-lead` so that it reaches the connection
    /// before the reply of the request that prompted it. Once per (`what`, `key`): a READ that
    /// invalidated its own inode's pages on every call would make a loop of the kernel's
    /// (the reader loses the pages before it copies them, reads again, and the new READ
    /// invalidates them again), which under load kept a 256 KiB read going for 30 s.
    fn notify_then_wait(
        &self,
        what: &'static str,
        key: String,
        send: impl FnOnce(&fuser::Notifier) -> io::Result<()> + Send + 'static,
    ) {
        if !self.notified.lock().insert((what, key.clone())) {
            return;
        }
        let Some(n) = self.notifier.get().cloned() else {
            return;
        };
        let events = self.events.clone();
        std::thread::spawn(move || {
            let r = send(&n);
            events.log(json!({
                "event": "notify_sent",
                "kind": what,
                "key": key,
                "error": r.err().map(|e| e.to_string()),
            }));
        });
        std::thread::sleep(self.notify.lead);
    }

    /// Path of `key` inside the bucket directory.
    fn object_path(&self, key: &str) -> PathBuf {
        if key.is_empty() {
            self.bucket.clone()
        } else {
            self.bucket.join(key)
        }
    }

    /// The node with number `ino`.
    fn node(&self, ino: INodeNo) -> Result<Arc<Node>, Errno> {
        self.tables
            .lock()
            .nodes
            .get(&ino.0)
            .cloned()
            .ok_or(Errno::ENOENT)
    }

    /// The current key of directory `ino`.
    fn dir_key(&self, ino: INodeNo) -> Result<String, Errno> {
        let node = self.node(ino)?;
        if node.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        let st = node.state.lock();
        if st.unlinked {
            return Err(Errno::ENOENT);
        }
        Ok(st.key.clone())
    }

    /// The key of child `name` of directory `parent`.
    fn child_key(&self, parent: INodeNo, name: &OsStr) -> Result<String, Errno> {
        let name = utf8_name(name)?;
        Ok(join_key(&self.dir_key(parent)?, name))
    }

    /// Attributes of `node`: from its staging file if it has one, else from its object.
    fn attr_of(&self, node: &Node, st: &NodeState) -> Result<FileAttr, Errno> {
        let meta = match &st.staging {
            Some(f) => f.metadata().map_err(errno)?,
            None => {
                if st.unlinked {
                    return Err(Errno::ENOENT);
                }
                fs::symlink_metadata(self.object_path(&st.key)).map_err(errno)?
            }
        };
        let kind_ok = match node.kind {
            FileType::Directory => meta.is_dir(),
            _ => meta.is_file(),
        };
        if !kind_ok {
            return Err(Errno::ENOENT);
        }
        Ok(attr_from_meta(node.ino, node.kind, &meta))
    }

    /// Resolves `key` to an inode and its attributes (the core of `lookup`).
    fn resolve(&self, key: &str) -> Result<(Arc<Node>, FileAttr), Errno> {
        let mut t = self.tables.lock();
        if let Some(node) = t.by_key.get(key).and_then(|ino| t.nodes.get(ino)).cloned() {
            let st = node.state.lock();
            if st.local || st.staging.is_some() {
                let attr = self.attr_of(&node, &st)?;
                drop(st);
                return Ok((node, attr));
            }
        }
        let meta = fs::symlink_metadata(self.object_path(key)).map_err(errno)?;
        let kind = if meta.is_dir() {
            FileType::Directory
        } else if meta.is_file() {
            FileType::RegularFile
        } else {
            return Err(Errno::ENOENT);
        };
        let node = t.get_or_alloc(key, kind);
        Ok((node.clone(), attr_from_meta(node.ino, kind, &meta)))
    }

    /// Gives `st` a staging file: a copy of the published object if `copy` (and the object
    /// exists), else empty.
    fn ensure_staging(&self, st: &mut NodeState, copy: bool) -> Result<(), Errno> {
        if st.staging.is_some() {
            return Ok(());
        }
        let mut staging = tempfile::tempfile_in(&self.staging_dir).map_err(errno)?;
        let mut perm = 0o644;
        if !st.local && !st.unlinked {
            match File::open(self.object_path(&st.key)) {
                Ok(object) => {
                    perm = object.metadata().map_err(errno)?.mode() & 0o7777;
                    if copy {
                        copy_all(&object, &mut staging).map_err(errno)?;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(errno(e)),
            }
        }
        staging
            .set_permissions(Permissions::from_mode(perm))
            .map_err(errno)?;
        st.staging = Some(staging);
        Ok(())
    }

    /// Copies the staged content of `node` into the bucket atomically (temp object + rename).
    /// Returns the key and size published, or `None` if there was nothing to publish.
    fn publish(&self, node: &Node) -> io::Result<Option<(String, u64)>> {
        let mut st = node.state.lock();
        if st.unlinked || !st.dirty {
            st.dirty = false;
            return Ok(None);
        }
        let Some(staging) = &st.staging else {
            st.dirty = false;
            return Ok(None);
        };
        let meta = staging.metadata()?;
        let tmp_path = self.bucket.join(format!(
            "{TMP_PREFIX}{}-{}",
            std::process::id(),
            self.next_tmp.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| -> io::Result<u64> {
            let mut tmp = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp_path)?;
            let size = copy_all(staging, &mut tmp)?;
            tmp.set_permissions(Permissions::from_mode(meta.mode() & 0o7777))?;
            let atime = timespec(system_time(meta.atime(), meta.atime_nsec()));
            let mtime = timespec(system_time(meta.mtime(), meta.mtime_nsec()));
            futimens(tmp.as_fd(), &atime, &mtime).map_err(io::Error::from)?;
            drop(tmp);
            fs::rename(&tmp_path, self.object_path(&st.key))?;
            Ok(size)
        })();
        match result {
            Ok(size) => {
                st.dirty = false;
                st.local = false;
                Ok(Some((st.key.clone(), size)))
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp_path);
                Err(e)
            }
        }
    }

    /// Uploads `node` if it is dirty: the work behind FLUSH and FSYNC. Honours the upload
    /// delay and the injected failures and hangs. No lock is held while sleeping.
    fn upload(&self, node: &Node) -> Result<(), Errno> {
        if node.kind != FileType::RegularFile {
            return Ok(());
        }
        let key = {
            let mut st = node.state.lock();
            if !st.dirty {
                return Ok(());
            }
            if st.unlinked {
                st.dirty = false;
                return Ok(());
            }
            st.key.clone()
        };
        self.events
            .log(json!({"event": "upload_start", "key": key}));
        if !self.policy.delay.is_zero()
            && self
                .policy
                .slow_upload
                .as_ref()
                .is_none_or(|s| key.contains(s.as_str()))
        {
            std::thread::sleep(self.policy.delay);
        }
        if self.policy.hang.as_ref().is_some_and(|s| key.contains(s)) {
            eprintln!("bucketfs: upload of {key:?} hangs forever (--hang-upload)");
            loop {
                std::thread::park();
            }
        }
        if self.policy.fail.as_ref().is_some_and(|s| key.contains(s)) {
            eprintln!("bucketfs: upload of {key:?} fails (--fail-upload)");
            self.events.log(json!({
                "event": "upload_failed", "key": key, "error": "injected failure"
            }));
            return Err(Errno::EIO);
        }
        match self.publish(node) {
            Ok(Some((key, size))) => {
                self.events
                    .log(json!({"event": "upload_done", "key": key, "size": size}));
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => {
                eprintln!("bucketfs: upload of {key:?} failed: {e}");
                self.events.log(json!({
                    "event": "upload_failed", "key": key, "error": e.to_string()
                }));
                Err(Errno::EIO)
            }
        }
    }

    /// Lists directory `key`: the bucket's files and directories plus files created through
    /// the mount and not yet published. Temp objects are hidden.
    fn list_dir(&self, dir: &Node, key: &str) -> Result<DirListing, Errno> {
        let path = self.object_path(key);
        let mut names: Vec<(String, FileType)> = Vec::new();
        for entry in fs::read_dir(&path).map_err(errno)? {
            let entry = entry.map_err(errno)?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if is_hidden(&name) {
                continue;
            }
            let ft = entry.file_type().map_err(errno)?;
            let kind = if ft.is_dir() {
                FileType::Directory
            } else if ft.is_file() {
                FileType::RegularFile
            } else {
                continue;
            };
            names.push((name, kind));
        }
        let mut t = self.tables.lock();
        let mut out = Vec::with_capacity(names.len() + 2);
        let parent_ino = t
            .by_key
            .get(parent_key(key))
            .copied()
            .unwrap_or(INodeNo::ROOT.0);
        out.push((dir.ino, FileType::Directory, ".".to_owned()));
        out.push((
            if key.is_empty() { dir.ino } else { parent_ino },
            FileType::Directory,
            "..".to_owned(),
        ));
        for (name, kind) in &names {
            let node = t.get_or_alloc(&join_key(key, name), *kind);
            out.push((node.ino, *kind, name.clone()));
        }
        for node in t.nodes.values() {
            if node.kind != FileType::RegularFile {
                continue;
            }
            let st = node.state.lock();
            if !st.local || st.unlinked || parent_key(&st.key) != key || st.key.is_empty() {
                continue;
            }
            let name = st.key.rsplit('/').next().unwrap_or(&st.key).to_owned();
            if !names.iter().any(|(n, _)| *n == name) {
                out.push((node.ino, FileType::RegularFile, name));
            }
        }
        Ok(out)
    }

    /// Whether any unpublished (local) file lives under directory `key`.
    fn has_local_children(t: &Tables, key: &str) -> bool {
        let prefix = format!("{key}/");
        t.nodes.values().any(|n| {
            let st = n.state.lock();
            st.local && !st.unlinked && st.key.starts_with(&prefix)
        })
    }

    /// The rename itself, under the table lock.
    fn do_rename(&self, from: &str, to: &str, noreplace: bool) -> Result<(), Errno> {
        let mut t = self.tables.lock();
        let from_node = t.by_key.get(from).and_then(|i| t.nodes.get(i)).cloned();
        let from_local = from_node.as_ref().is_some_and(|n| n.state.lock().local);
        let from_path = self.object_path(from);
        let to_path = self.object_path(to);
        let from_meta = fs::symlink_metadata(&from_path).ok();
        if from_meta.is_none() && !from_local {
            return Err(Errno::ENOENT);
        }
        let to_node = t.by_key.get(to).and_then(|i| t.nodes.get(i)).cloned();
        let to_local = to_node.as_ref().is_some_and(|n| n.state.lock().local);
        let to_meta = fs::symlink_metadata(&to_path).ok();
        if noreplace && (to_meta.is_some() || to_local) {
            return Err(Errno::EEXIST);
        }
        if from_meta.is_some() {
            fs::rename(&from_path, &to_path).map_err(errno)?;
        } else if let Some(m) = &to_meta {
            // A local (unpublished) file replaces an existing object.
            if m.is_dir() {
                return Err(Errno::EISDIR);
            }
            fs::remove_file(&to_path).map_err(errno)?;
        }
        if let Some(to_node) = &to_node {
            if from_node.as_ref().is_none_or(|f| f.ino != to_node.ino) {
                t.unlink_key(to);
            }
        }
        let Some(from_node) = from_node else {
            return Ok(());
        };
        if self.rename_new_inode && !from_local {
            // gcsfuse: the objects were copied and the old ones deleted; the old inodes are
            // gone, and the next lookup of each new name makes a new one.
            let prefix = format!("{from}/");
            let under: Vec<String> = t
                .by_key
                .keys()
                .filter(|k| k.starts_with(&prefix))
                .cloned()
                .collect();
            t.unlink_key(from);
            for k in under {
                t.unlink_key(&k);
            }
            return Ok(());
        }
        t.by_key.remove(from);
        t.by_key.insert(to.to_owned(), from_node.ino);
        from_node.state.lock().key = to.to_owned();
        if from_node.kind == FileType::Directory {
            let prefix = format!("{from}/");
            let moved: Vec<(String, u64)> = t
                .by_key
                .iter()
                .filter(|(k, _)| k.starts_with(&prefix))
                .map(|(k, i)| (k.clone(), *i))
                .collect();
            for (old_key, ino) in moved {
                let new_key = format!("{to}/{}", &old_key[prefix.len()..]);
                t.by_key.remove(&old_key);
                t.by_key.insert(new_key.clone(), ino);
                if let Some(n) = t.nodes.get(&ino) {
                    n.state.lock().key = new_key;
                }
            }
        }
        Ok(())
    }

    /// Allocates a file or directory handle number.
    fn new_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }
}

impl Filesystem for BucketFs {
    fn init(&mut self, _req: &Request, _config: &mut KernelConfig) -> io::Result<()> {
        if self.refuse_init {
            eprintln!("bucketfs: refusing INIT (--refuse-init)");
            return Err(io::Error::from_raw_os_error(libc::ENOSYS));
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = (|| {
            if utf8_name(name).is_ok_and(is_hidden) {
                return Err(Errno::ENOENT);
            }
            let key = self.child_key(parent, name)?;
            if let Some(sub) = &self.notify.lookup
                && key.contains(sub.as_str())
            {
                let name = name.to_owned();
                self.notify_then_wait("inval_entry", key.clone(), move |n| {
                    n.inval_entry(parent, &name)
                });
            }
            self.resolve(&key)
        })();
        match result {
            Ok((_, attr)) => reply.entry(&self.ttl, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let result = self.node(ino).and_then(|node| {
            let st = node.state.lock();
            self.attr_of(&node, &st)
        });
        match result {
            Ok(attr) => reply.attr(&self.ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = (|| {
            let node = self.node(ino)?;
            let mut st = node.state.lock();
            if let Some(size) = size {
                if node.kind == FileType::Directory {
                    return Err(Errno::EISDIR);
                }
                self.ensure_staging(&mut st, size > 0)?;
                if let Some(staging) = &st.staging {
                    staging.set_len(size).map_err(errno)?;
                }
                st.dirty = true;
            }
            if let Some(mode) = mode {
                let perm = Permissions::from_mode(mode & 0o7777);
                if let Some(staging) = &st.staging {
                    staging.set_permissions(perm.clone()).map_err(errno)?;
                }
                if !st.local && !st.unlinked {
                    match fs::set_permissions(self.object_path(&st.key), perm) {
                        Err(e) if st.staging.is_none() || e.kind() != io::ErrorKind::NotFound => {
                            return Err(errno(e));
                        }
                        _ => {}
                    }
                }
            }
            if atime.is_some() || mtime.is_some() {
                let (a, m) = (time_or_now(atime), time_or_now(mtime));
                if let Some(staging) = &st.staging {
                    futimens(staging.as_fd(), &a, &m).map_err(nix_errno)?;
                } else if !st.unlinked {
                    let f = File::open(self.object_path(&st.key)).map_err(errno)?;
                    futimens(f.as_fd(), &a, &m).map_err(nix_errno)?;
                }
            }
            // truncate(2) on a path has no handle, so no FLUSH will follow: publish now.
            let publish_now = size.is_some() && fh.is_none() && st.handles == 0 && !st.unlinked;
            drop(st);
            if publish_now {
                self.upload(&node)?;
            }
            let st = node.state.lock();
            self.attr_of(&node, &st)
        })();
        match result {
            Ok(attr) => reply.attr(&self.ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let result = (|| {
            if is_hidden(utf8_name(name)?) {
                return Err(Errno::EPERM);
            }
            let key = self.child_key(parent, name)?;
            fs::DirBuilder::new()
                .mode(mode & !umask & 0o7777)
                .create(self.object_path(&key))
                .map_err(errno)?;
            self.resolve(&key)
        })();
        match result {
            Ok((_, attr)) => reply.entry(&self.ttl, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = (|| {
            let key = self.child_key(parent, name)?;
            let mut t = self.tables.lock();
            let node = t.by_key.get(&key).and_then(|i| t.nodes.get(i)).cloned();
            let local = node.as_ref().is_some_and(|n| n.state.lock().local);
            match fs::remove_file(self.object_path(&key)) {
                Ok(()) => {}
                Err(e) if local && e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(errno(e)),
            }
            t.unlink_key(&key);
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = (|| {
            let key = self.child_key(parent, name)?;
            let mut t = self.tables.lock();
            if Self::has_local_children(&t, &key) {
                return Err(Errno::ENOTEMPTY);
            }
            fs::remove_dir(self.object_path(&key)).map_err(errno)?;
            t.unlink_key(&key);
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let result = (|| {
            if flags.contains(RenameFlags::RENAME_EXCHANGE)
                || flags.contains(RenameFlags::RENAME_WHITEOUT)
            {
                return Err(Errno::EINVAL);
            }
            if is_hidden(utf8_name(newname)?) {
                return Err(Errno::EPERM);
            }
            let from = self.child_key(parent, name)?;
            let to = self.child_key(newparent, newname)?;
            if from == to {
                return Ok(());
            }
            self.do_rename(&from, &to, flags.contains(RenameFlags::RENAME_NOREPLACE))
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.open_enosys {
            reply.error(Errno::ENOSYS);
            return;
        }
        let result = (|| {
            let node = self.node(ino)?;
            if node.kind == FileType::Directory {
                return Err(Errno::EISDIR);
            }
            let mut st = node.state.lock();
            let object = if st.staging.is_none() {
                if st.unlinked {
                    return Err(Errno::ENOENT);
                }
                Some(Arc::new(
                    File::open(self.object_path(&st.key)).map_err(errno)?,
                ))
            } else {
                None
            };
            st.handles += 1;
            drop(st);
            let fh = self.new_fh();
            self.handles
                .lock()
                .insert(fh, Handle { ino: ino.0, object });
            Ok(fh)
        })();
        match result {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let result = (|| {
            if is_hidden(utf8_name(name)?) {
                return Err(Errno::EPERM);
            }
            let key = self.child_key(parent, name)?;
            let mut t = self.tables.lock();
            let exists_local = t
                .by_key
                .get(&key)
                .and_then(|i| t.nodes.get(i))
                .is_some_and(|n| {
                    let st = n.state.lock();
                    st.local || st.staging.is_some()
                });
            if exists_local || fs::symlink_metadata(self.object_path(&key)).is_ok() {
                return Err(Errno::EEXIST);
            }
            let staging = tempfile::tempfile_in(&self.staging_dir).map_err(errno)?;
            fchmod(
                staging.as_fd(),
                Mode::from_bits_truncate(mode & !umask & 0o7777),
            )
            .map_err(nix_errno)?;
            let node = t.alloc(&key, FileType::RegularFile, true);
            drop(t);
            let mut st = node.state.lock();
            st.staging = Some(staging);
            st.dirty = true;
            st.handles = 1;
            let attr = self.attr_of(&node, &st)?;
            drop(st);
            let fh = self.new_fh();
            self.handles.lock().insert(
                fh,
                Handle {
                    ino: node.ino,
                    object: None,
                },
            );
            Ok((attr, fh))
        })();
        match result {
            Ok((attr, fh)) => reply.created(
                &self.ttl,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut oversized = false;
        let result = (|| {
            let node = self.node(ino)?;
            if let Some(sub) = &self.policy.oversized_read {
                oversized = node.state.lock().key.contains(sub.as_str());
            }
            if let Some(sub) = &self.notify.read {
                let key = node.state.lock().key.clone();
                if key.contains(sub.as_str()) {
                    self.notify_then_wait("inval_inode", key, move |n| n.inval_inode(ino, 0, 0));
                }
            }
            if let Some(slow) = &self.policy.slow_read {
                let key = node.state.lock().key.clone();
                if key.contains(slow.as_str()) {
                    slow_read_sleep(self.policy.read_delay);
                }
            }
            let object = self
                .handles
                .lock()
                .get(&fh.0)
                .and_then(|h| h.object.clone());
            let st = node.state.lock();
            if let Some(staging) = &st.staging {
                return read_full(staging, offset, size).map_err(errno);
            }
            match object {
                Some(object) => read_full(&object, offset, size).map_err(errno),
                None => {
                    let f = File::open(self.object_path(&st.key)).map_err(errno)?;
                    read_full(&f, offset, size).map_err(errno)
                }
            }
        })();
        match result {
            Ok(mut data) => {
                if oversized {
                    data.resize(size as usize + 1, 0);
                }
                reply.data(&data)
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let result = (|| {
            let node = self.node(ino)?;
            let mut st = node.state.lock();
            self.ensure_staging(&mut st, true)?;
            if let Some(staging) = &st.staging {
                staging.write_all_at(data, offset).map_err(errno)?;
            }
            st.dirty = true;
            u32::try_from(data.len()).map_err(|_| Errno::EINVAL)
        })();
        match result {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        match self.node(ino).and_then(|node| self.upload(&node)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.node(ino).and_then(|node| self.upload(&node)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let handle = self.handles.lock().remove(&fh.0);
        let ino = handle.map_or(ino.0, |h| h.ino);
        let mut t = self.tables.lock();
        if let Some(node) = t.nodes.get(&ino).cloned() {
            let mut st = node.state.lock();
            st.handles = st.handles.saturating_sub(1);
            if st.handles == 0 {
                if st.unlinked {
                    st.staging = None;
                    st.dirty = false;
                    drop(st);
                    t.nodes.remove(&ino);
                } else if !st.dirty && !st.local {
                    // Published and closed: forget the local copy, read the object next time.
                    st.staging = None;
                }
                // A dirty file whose upload failed keeps its staging file, like gcsfuse; it
                // is lost if the process goes away before a later flush succeeds.
            }
        }
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let result = (|| {
            let node = self.node(ino)?;
            if node.kind != FileType::Directory {
                return Err(Errno::ENOTDIR);
            }
            let key = {
                let st = node.state.lock();
                if st.unlinked {
                    return Err(Errno::ENOENT);
                }
                st.key.clone()
            };
            let listing = self.list_dir(&node, &key)?;
            let fh = self.new_fh();
            self.dirs.lock().insert(fh, listing);
            Ok(fh)
        })();
        match result {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let dirs = self.dirs.lock();
        let Some(listing) = dirs.get(&fh.0) else {
            reply.error(Errno::EBADF);
            return;
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (ino, kind, name)) in listing.iter().enumerate().skip(start) {
            if reply.add(INodeNo(*ino), (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match nix::sys::statvfs::statvfs(&self.bucket) {
            Ok(s) => reply.statfs(
                s.blocks(),
                s.blocks_free(),
                s.blocks_available(),
                s.files(),
                s.files_free(),
                u32::try_from(s.block_size()).unwrap_or(4096),
                u32::try_from(s.name_max()).unwrap_or(255),
                u32::try_from(s.fragment_size()).unwrap_or(4096),
            ),
            Err(e) => reply.error(nix_errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let result = (|| {
            if mode != 0 {
                return Err(Errno::from_i32(libc::EOPNOTSUPP));
            }
            let node = self.node(ino)?;
            let mut st = node.state.lock();
            self.ensure_staging(&mut st, true)?;
            if let Some(staging) = &st.staging {
                let off = i64::try_from(offset).map_err(|_| Errno::EFBIG)?;
                let len = i64::try_from(length).map_err(|_| Errno::EFBIG)?;
                nix::fcntl::fallocate(
                    staging.as_fd(),
                    nix::fcntl::FallocateFlags::empty(),
                    off,
                    len,
                )
                .map_err(nix_errno)?;
            }
            st.dirty = true;
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

/// Makes sure fds 0, 1 and 2 are open (on `/dev/null` if not), so that `/dev/fuse` never
/// lands on one of them.
fn ensure_std_fds() {
    for fd in 0..3 {
        // SAFETY: F_GETFD only queries the descriptor table.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            // SAFETY: opening /dev/null with a static NUL-terminated path; the new fd is the
            // lowest free one, i.e. the missing standard descriptor, and is meant to stay open.
            unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
        }
    }
}

/// Resets SIGINT and SIGTERM to their default actions (a shell's `cmd &` starts children with
/// SIGINT ignored) and then blocks both in the calling thread, so that every thread spawned
/// afterwards inherits the block and only the `sigwait` thread ever sees them.
fn block_termination_signals() -> nix::Result<SigSet> {
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: installing SIG_DFL involves no handler code.
        unsafe { sigaction(sig, &default) }?;
    }
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block()?;
    Ok(set)
}

/// Unmounts `mountpoint`: `umount(2)` (we are normally root), falling back to
/// `fusermount3 -u` when that is not permitted. `EBUSY` is reported, never forced.
fn unmount(mountpoint: &Path) -> Result<(), String> {
    match nix::mount::umount(mountpoint) {
        Ok(()) => Ok(()),
        // Not a mount point (any more): someone else unmounted it.
        Err(nix::errno::Errno::EINVAL) => Ok(()),
        Err(nix::errno::Errno::EBUSY) => Err("umount: EBUSY (mount is busy)".to_owned()),
        Err(e) => {
            let out = std::process::Command::new("fusermount3")
                .arg("-u")
                .arg(mountpoint)
                .output()
                .map_err(|err| format!("umount: {e}; fusermount3: {err}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "umount: {e}; fusermount3 -u: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        }
    }
}

/// Dies from SIGTERM's default action right now (no unmount, no cleanup), like gcsfuse
/// before v2.6.0; `_exit(143)` if the signal somehow does not kill us.
fn die_by_sigterm() -> ! {
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: installing SIG_DFL involves no handler code.
    let _ = unsafe { sigaction(Signal::SIGTERM, &default) };
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    let _ = set.thread_unblock();
    let _ = nix::sys::signal::raise(Signal::SIGTERM);
    // SAFETY: _exit ends the process without running any Rust code.
    unsafe { libc::_exit(128 + libc::SIGTERM) }
}

/// Set (and its condvar notified) once a stop signal asks bucketfs to unmount: the remaining
/// delay of every `--slow-read` read ends then, so a stopping bucketfs never keeps a worker
/// asleep past its unmount (the read is then served normally).
static STOPPING: (std::sync::Mutex<bool>, std::sync::Condvar) =
    (std::sync::Mutex::new(false), std::sync::Condvar::new());

/// Sleeps `delay`, or less if a stop signal comes meanwhile ([`STOPPING`]).
fn slow_read_sleep(delay: Duration) {
    let (lock, cv) = &STOPPING;
    let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
    let _ = cv.wait_timeout_while(guard, delay, |stopping| !*stopping);
}

/// The signal thread: waits for SIGINT/SIGTERM with `sigwait` and reacts like gcsfuse: unmount
/// (`mountpoint` given), or log and keep serving (`None`: a `/dev/fd/N` connection someone
/// else mounted; gcsfuse logs "externally managed" and waits for EOF or SIGKILL).
fn signal_loop(set: SigSet, mountpoint: Option<PathBuf>, mode: SigtermMode, events: Arc<Events>) {
    loop {
        let sig = match set.wait() {
            Ok(sig) => sig,
            Err(e) => {
                eprintln!("bucketfs: sigwait failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let name = sig.as_str();
        events.log(json!({"event": "signal", "signal": name}));
        if sig == Signal::SIGTERM && mode == SigtermMode::Instant {
            eprintln!("bucketfs: {name}: exiting at once without unmounting (--sigterm instant)");
            die_by_sigterm();
        }
        let Some(mountpoint) = &mountpoint else {
            // gcsfuse on a /dev/fd/N mount: it cannot unmount, says so and keeps serving.
            eprintln!("bucketfs: {name}: the mount is externally managed; will not unmount");
            events.log(json!({"event": "unmount_failed", "error": "externally managed"}));
            continue;
        };
        eprintln!("bucketfs: {name}: unmounting {}", mountpoint.display());
        {
            let (lock, cv) = &STOPPING;
            *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
            cv.notify_all();
        }
        if let Err(e) = unmount(mountpoint) {
            eprintln!(
                "bucketfs: unmount of {} failed: {e}; still serving",
                mountpoint.display()
            );
            events.log(json!({"event": "unmount_failed", "error": e}));
        }
    }
}

/// Checks that `path` is an existing directory and returns its canonical form.
fn existing_dir(what: &str, path: &Path) -> Result<PathBuf, String> {
    match fs::metadata(path) {
        Ok(m) if m.is_dir() => path
            .canonicalize()
            .map_err(|e| format!("{what} {}: {e}", path.display())),
        Ok(_) => Err(format!("{what} {} is not a directory", path.display())),
        Err(e) => Err(format!("{what} {}: {e}", path.display())),
    }
}

/// Parses a `/dev/fd/N` mountpoint argument: `Some(N)`, or `None` for any other path.
fn dev_fd(path: &Path) -> Option<i32> {
    path.to_str()?
        .strip_prefix("/dev/fd/")?
        .parse()
        .ok()
        .filter(|n| *n >= 0)
}

/// Takes ownership of the inherited connection fd `n` (marking it close-on-exec) and returns it
/// with a duplicate kept to look at the connection after the session has closed its copy.
fn take_connection_fd(n: i32) -> Result<(OwnedFd, OwnedFd), String> {
    // SAFETY: F_GETFD only queries the descriptor table.
    if unsafe { libc::fcntl(n, libc::F_GETFD) } == -1 {
        return Err(format!("/dev/fd/{n}: {}", io::Error::last_os_error()));
    }
    // SAFETY: fd n is open (checked above), was inherited for us to serve, and nothing else in
    // this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(n) };
    nix::fcntl::fcntl(
        &fd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(|e| format!("/dev/fd/{n}: {e}"))?;
    let probe = fd.try_clone().map_err(|e| format!("/dev/fd/{n}: {e}"))?;
    Ok((fd, probe))
}

/// Whether `fd` is a socket whose peer has shut down its sending side: a relay's end-of-stream,
/// which fuser's loop reports as an invalid (zero-length) request.
fn peer_closed(fd: &OwnedFd) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        nix::sys::socket::recv(
            fd.as_raw_fd(),
            &mut byte,
            nix::sys::socket::MsgFlags::MSG_PEEK | nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        ),
        Ok(0)
    )
}

/// The default staging directory, `$TMPDIR/bucketfs-staging`, shared by every bucketfs, root's
/// and uid 65534's alike. The first one builds it mode 1777 (sticky, writable by all) under a
/// private name and renames it into place with `RENAME_NOREPLACE`, so no instance ever sees it
/// with the umask's mode.
///
/// # Errors
/// When it cannot be created, or exists and is not a directory.
fn shared_staging_dir() -> Result<PathBuf, String> {
    let tmp = std::env::temp_dir();
    let dir = tmp.join("bucketfs-staging");
    if !dir.is_dir() {
        let err = |e: &dyn std::fmt::Display| format!("staging {}: {e}", dir.display());
        let fresh = tempfile::Builder::new()
            .prefix(".bucketfs-staging-")
            .tempdir_in(&tmp)
            .map_err(|e| err(&e))?;
        fs::set_permissions(fresh.path(), fs::Permissions::from_mode(0o1777))
            .map_err(|e| err(&e))?;
        match nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            fresh.path(),
            nix::fcntl::AT_FDCWD,
            &dir,
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        ) {
            // Renamed: the guard's removal at drop finds nothing.
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(err(&e)),
        }
    }
    existing_dir("staging", &dir)
}

/// Mounts (or takes the `/dev/fd/N` connection), serves until unmounted or until the
/// connection's peer closes, and returns the exit code: 0 when the session ended by unmount
/// (`ENODEV`) or by end-of-stream on a `/dev/fd/N` socket, 1 when it ended with an error.
fn run(args: Args) -> Result<ExitCode, String> {
    let bucket = existing_dir("bucket", &args.bucket)?;
    let connection = match dev_fd(&args.mountpoint) {
        Some(n) => Some(take_connection_fd(n)?),
        None => None,
    };
    let mountpoint = match connection {
        Some(_) => None,
        None => Some(existing_dir("mountpoint", &args.mountpoint)?),
    };
    let staging_dir = match &args.staging {
        Some(dir) => {
            fs::create_dir_all(dir).map_err(|e| format!("staging {}: {e}", dir.display()))?;
            existing_dir("staging", dir)?
        }
        None => shared_staging_dir()?,
    };
    let events =
        Arc::new(Events::open(args.events.as_deref()).map_err(|e| format!("events file: {e}"))?);

    let sigset = block_termination_signals().map_err(|e| format!("signal setup: {e}"))?;

    let policy = UploadPolicy {
        delay: args.upload_delay,
        slow_upload: args.slow_upload.clone(),
        fail: args.fail_upload.clone(),
        hang: args.hang_upload.clone(),
        slow_read: args.slow_read.clone(),
        read_delay: args.read_delay,
        oversized_read: args.oversized_read.clone(),
    };
    let mut fs = BucketFs::new(bucket.clone(), staging_dir, policy, events.clone());
    fs.refuse_init = args.refuse_init;
    fs.open_enosys = args.open_enosys;
    fs.rename_new_inode = args.rename_new_inode;
    if args.rename_new_inode {
        fs.ttl = Duration::ZERO;
    }
    fs.notify = NotifyPolicy {
        read: args.notify_on_read.clone(),
        lookup: args.notify_on_lookup.clone(),
        lead: args.notify_lead,
    };
    let notifier = fs.notifier.clone();
    let mut config = Config::default();
    config.acl = SessionACL::All;
    config.n_threads = Some(usize::from(args.threads));
    let (session, probe) = match (connection, &mountpoint) {
        (Some((fd, probe)), _) => {
            // Every worker reads the same fd: a socket cannot be cloned with
            // FUSE_DEV_IOC_CLONE. fuser answers INIT with max_write = 16 MiB.
            config.clone_fd = false;
            let session = Session::from_fd(fs, fd, SessionACL::All, config)
                .map_err(|e| format!("cannot serve {}: {e}", args.mountpoint.display()))?;
            (session, Some(probe))
        }
        (None, Some(mountpoint)) => {
            config.clone_fd = true;
            let session = mount_session(fs, mountpoint, &config, &bucket)
                .map_err(|e| format!("cannot mount on {}: {e}", mountpoint.display()))?;
            (session, None)
        }
        (None, None) => unreachable!("a mountpoint is resolved whenever there is no fd"),
    };

    let _ = notifier.set(session.notifier());
    events.log(json!({"event": "mounted"}));
    {
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "{MOUNTED_LINE}");
        let _ = out.flush();
    }

    let sig_events = events.clone();
    let mode = args.sigterm;
    let sig_mountpoint = mountpoint.clone();
    std::thread::Builder::new()
        .name("signals".to_owned())
        .spawn(move || signal_loop(sigset, sig_mountpoint, mode, sig_events))
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;

    let result = session.run();
    if args.refuse_init
        && let Some(probe) = &probe
    {
        // A daemon that refused INIT but keeps its connection open, until its end-of-stream.
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match nix::unistd::read(probe, &mut buf) {
                Ok(0) => break,
                Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
    }
    events.log(json!({"event": "unmounted"}));
    let code = match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) if probe.as_ref().is_some_and(peer_closed) => {
            eprintln!("bucketfs: end of stream on the connection: stopping");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bucketfs: session ended with an error: {e}");
            ExitCode::FAILURE
        }
    };
    drop(probe);
    events.log(json!({"event": "exit"}));
    Ok(code)
}

/// Mounts like gcsfuse does: one mount, removed once. As root the mount is made here with
/// `mount(2)` and handed to fuser as an fd, because a session that fuser mounted unmounts its
/// mountpoint again *by path* when it ends, which after an unmount removes whatever is
/// underneath (a Kubernetes volume's bind mount). Without CAP_SYS_ADMIN fuser mounts through
/// fusermount3.
fn mount_session(
    fs: BucketFs,
    mountpoint: &Path,
    config: &Config,
    bucket: &Path,
) -> io::Result<Session<BucketFs>> {
    use nix::mount::MsFlags;
    use std::os::fd::{AsRawFd, OwnedFd};
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let fd: OwnedFd = dev.into();
    let data = format!(
        "fd={},rootmode=40000,user_id={},group_id={},default_permissions,allow_other",
        fd.as_raw_fd(),
        nix::unistd::getuid(),
        nix::unistd::getgid()
    );
    let source = format!("bucketfs:{}", bucket.display());
    match nix::mount::mount(
        Some(source.as_str()),
        mountpoint,
        Some("fuse.bucketfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    ) {
        Ok(()) => Session::from_fd(fs, fd, config.acl, config.clone()),
        Err(nix::errno::Errno::EPERM) => Session::new(fs, mountpoint, config),
        Err(e) => Err(e.into()),
    }
}

/// Entry point: parse the command line, mount, serve, and map errors to a one-line message
/// and exit status 1 (2 for usage errors, from clap).
fn main() -> ExitCode {
    ensure_std_fds();
    let args = Args::parse();
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bucketfs: {e}");
            ExitCode::FAILURE
        }
    }
}

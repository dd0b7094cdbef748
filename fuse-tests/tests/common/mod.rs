//! Helpers shared by the mount tests: per-mode test wrappers, errno assertions, thin `libc`
//! wrappers that return `io::Result` (so every failure is asserted by `raw_os_error()`), a
//! forked child that runs as another user, views of the drainfs process from `/proc`, and
//! drainfs's state as it reports it (`/status` through the control socket, the admin server's
//! address from its command line), so tests key on state and never on log wording.

#![allow(dead_code, unused_imports)]

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use fuse_tests::harness::{MountOpts, Mounted};

/// Generates a `#[test]` per passthrough mode for each generic test body `fn name(mode: &str)`:
/// `name::always` runs it with `--passthrough always`, `name::never` with `--passthrough never`.
#[allow(unused_macros)]
macro_rules! both_modes {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[test]
                fn always() {
                    super::$name("always")
                }

                #[test]
                fn never() {
                    super::$name("never")
                }

                #[test]
                fn reads() {
                    super::$name("reads")
                }
            }
        )+
    };
}

/// Mounts drainfs over a fresh temporary lower with `--passthrough <mode>` and `extra` args.
pub fn mount(mode: &str, extra: &[&str]) -> Mounted {
    let mut args = vec!["--passthrough".to_string(), mode.to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    Mounted::start(MountOpts {
        args,
        ..Default::default()
    })
}

/// Like [`mount`], but with the lower on tmpfs (`/dev/shm`, when it is there): for tests that
/// create many inodes, where the lower's own metadata cost (ext4 on a virtual disk: ~0.7 ms
/// per create) would dominate.
pub fn mount_on_tmpfs(mode: &str, extra: &[&str]) -> Mounted {
    let base = if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    };
    let mut args = vec!["--passthrough".to_string(), mode.to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    Mounted::start_under(
        base,
        MountOpts {
            args,
            ..Default::default()
        },
    )
}

/// drainfs over the gcsfuse-like `bucketfs` backend (objects published only at FLUSH/FSYNC).
pub type OverBucket = fuse_tests::harness::BucketStack;

/// Mounts drainfs (`--passthrough <mode>`) over a bucketfs started with `bucketfs_args`.
pub fn over_bucketfs(mode: &str, bucketfs_args: &[&str]) -> OverBucket {
    fuse_tests::harness::over_bucketfs(&["--passthrough", mode], bucketfs_args, true)
}

/// Runs `program args` as `uid:gid` with no supplementary groups and returns its output.
///
/// Stands in for `harness::run_as`, whose `pre_exec` `setgroups(0)` runs after std's own
/// `setuid` (std runs `pre_exec` closures last) and so always fails with EPERM. std already
/// drops the supplementary groups when it changes the uid of a root parent.
pub fn run_user(uid: u32, gid: u32, program: &str, args: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    std::process::Command::new(program)
        .args(args)
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap_or_else(|e| panic!("run {program} as {uid}:{gid}: {e}"))
}

/// The symbolic name of an errno (`ENOENT`), for assertion messages.
pub fn errno_name(e: i32) -> String {
    format!("{:?}", nix::errno::Errno::from_raw(e))
}

/// The errno of a failed result; panics (with the value) when it succeeded.
#[track_caller]
pub fn errno_of<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("not an OS error: {e}")),
    }
}

/// Asserts that `r` failed with exactly `want`.
#[track_caller]
pub fn assert_errno<T: std::fmt::Debug>(r: io::Result<T>, want: i32, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected {}, got Ok({v:?})", errno_name(want)),
        Err(e) => assert_eq!(
            e.raw_os_error(),
            Some(want),
            "{what}: expected {}, got {e}",
            errno_name(want)
        ),
    }
}

/// A NUL-terminated copy of a path.
pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in test paths")
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_ss(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `open(2)` with raw flags and mode (`O_CLOEXEC` added).
pub fn open(p: &Path, flags: i32, mode: u32) -> io::Result<File> {
    let c = cpath(p);
    // SAFETY: NUL-terminated path; the returned fd is owned by the File alone.
    let fd = cvt(unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode) })?;
    // SAFETY: `fd` was just returned by open.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `close(2)` with its result (a `File` drop ignores it): FLUSH's errno arrives here.
pub fn close(f: File) -> io::Result<()> {
    let fd = f.into_raw_fd();
    // SAFETY: `fd` is owned by us and closed exactly once.
    cvt(unsafe { libc::close(fd) }).map(drop)
}

/// `renameat2(AT_FDCWD, old, AT_FDCWD, new, flags)`.
pub fn renameat2(old: &Path, new: &Path, flags: u32) -> io::Result<()> {
    let (o, n) = (cpath(old), cpath(new));
    // SAFETY: NUL-terminated paths.
    cvt(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            o.as_ptr(),
            libc::AT_FDCWD,
            n.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// `mknod(2)`.
pub fn mknod(p: &Path, mode: u32, dev: u64) -> io::Result<()> {
    let c = cpath(p);
    // SAFETY: NUL-terminated path.
    cvt(unsafe { libc::mknod(c.as_ptr(), mode, dev) }).map(drop)
}

/// `truncate(2)` by path (SETATTR without a file handle).
pub fn truncate(p: &Path, len: i64) -> io::Result<()> {
    let c = cpath(p);
    // SAFETY: NUL-terminated path.
    cvt(unsafe { libc::truncate(c.as_ptr(), len) }).map(drop)
}

/// A `timespec`.
pub fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
}

/// `UTIME_NOW`.
pub fn now_ts() -> libc::timespec {
    ts(0, libc::UTIME_NOW)
}

/// `UTIME_OMIT`.
pub fn omit_ts() -> libc::timespec {
    ts(0, libc::UTIME_OMIT)
}

/// `utimensat(AT_FDCWD, p, [atime, mtime], nofollow ? AT_SYMLINK_NOFOLLOW : 0)`.
pub fn utimens(
    p: &Path,
    atime: libc::timespec,
    mtime: libc::timespec,
    nofollow: bool,
) -> io::Result<()> {
    let c = cpath(p);
    let times = [atime, mtime];
    let flags = if nofollow {
        libc::AT_SYMLINK_NOFOLLOW
    } else {
        0
    };
    // SAFETY: NUL-terminated path, two timespecs.
    cvt(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), flags) }).map(drop)
}

/// `setxattr(2)`.
pub fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<()> {
    let (c, n) = (cpath(p), CString::new(name).unwrap());
    // SAFETY: NUL-terminated strings, value valid for its length.
    cvt(unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(drop)
}

/// `getxattr(2)` into a buffer of `size` bytes (`size == 0` asks for the value's size; the
/// returned vector is then empty and the size is returned alone).
pub fn getxattr_sized(p: &Path, name: &str, size: usize) -> io::Result<(usize, Vec<u8>)> {
    let (c, n) = (cpath(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; size];
    // SAFETY: buffer valid for its length (a zero length is a size query).
    let got = cvt_ss(unsafe {
        libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    })?;
    buf.truncate(got.min(size));
    Ok((got, buf))
}

/// `getxattr(2)`: the whole value (size query first, as applications do).
pub fn getxattr(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    let (size, _) = getxattr_sized(p, name, 0)?;
    let (_, v) = getxattr_sized(p, name, size)?;
    Ok(v)
}

/// `listxattr(2)`: the names.
pub fn listxattr(p: &Path) -> io::Result<Vec<String>> {
    let c = cpath(p);
    // SAFETY: a size query with a null buffer.
    let size = cvt_ss(unsafe { libc::listxattr(c.as_ptr(), std::ptr::null_mut(), 0) })?;
    let mut buf = vec![0u8; size];
    // SAFETY: buffer valid for its length.
    let n = cvt_ss(unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
    buf.truncate(n);
    Ok(buf
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect())
}

/// `removexattr(2)`.
pub fn removexattr(p: &Path, name: &str) -> io::Result<()> {
    let (c, n) = (cpath(p), CString::new(name).unwrap());
    // SAFETY: NUL-terminated strings.
    cvt(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) }).map(drop)
}

/// `fallocate(2)`.
pub fn fallocate(f: &File, mode: i32, off: i64, len: i64) -> io::Result<()> {
    // SAFETY: plain syscall on a valid fd.
    cvt(unsafe { libc::fallocate(f.as_raw_fd(), mode, off, len) }).map(drop)
}

/// `lseek(2)`.
pub fn lseek(f: &File, off: i64, whence: i32) -> io::Result<i64> {
    // SAFETY: plain syscall on a valid fd.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `copy_file_range(2)` at explicit offsets.
pub fn copy_file_range(
    fin: &File,
    off_in: i64,
    fout: &File,
    off_out: i64,
    len: usize,
) -> io::Result<usize> {
    let (mut oi, mut oo) = (off_in, off_out);
    // SAFETY: offsets are valid pointers for the call.
    cvt_ss(unsafe {
        libc::copy_file_range(fin.as_raw_fd(), &mut oi, fout.as_raw_fd(), &mut oo, len, 0)
    })
}

/// `statvfs(3)`.
pub fn statvfs(p: &Path) -> io::Result<libc::statvfs> {
    let c = cpath(p);
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: valid out-pointer.
    cvt(unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) })?;
    // SAFETY: initialised by the successful call.
    Ok(unsafe { st.assume_init() })
}

/// `pread` of exactly `len` bytes at `off` (short at EOF).
pub fn pread(f: &File, off: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = f.read_at(&mut buf[got..], off + got as u64).unwrap();
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    buf
}

/// A buffer aligned to 4096 bytes (for `O_DIRECT`).
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes, 4096-aligned.
    pub fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero size (asserted by the callers' lengths), valid layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        AlignedBuf { ptr, len }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes while self lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).unwrap();
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

/// The errno of the last failed libc call in this thread (for bodies run by [`in_child`]).
pub fn last_errno() -> i32 {
    // SAFETY: reads this thread's errno.
    unsafe { *libc::__errno_location() }
}

/// Who a forked child runs as: uid, gid and supplementary groups.
#[derive(Debug, Clone, Copy)]
pub struct Creds<'a> {
    /// Real, effective and saved uid.
    pub uid: u32,
    /// Real, effective and saved gid.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: &'a [u32],
}

/// Forks; the child optionally switches to `creds`, runs `body` and exits with its return
/// value; the parent returns that exit code.
///
/// The test process is multi-threaded, so `body` runs in a child where only async-signal-safe
/// work is allowed: raw libc calls on data prepared before the fork, no allocation, no locks,
/// no panics. Bodies return 0 for success or an errno.
pub fn in_child(creds: Option<Creds<'_>>, body: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child only makes raw syscalls (see above) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: raw syscalls in the single-threaded child; _exit never returns.
        unsafe {
            if let Some(c) = creds
                && (libc::syscall(libc::SYS_setgroups, c.groups.len(), c.groups.as_ptr()) != 0
                    || libc::syscall(libc::SYS_setresgid, c.gid, c.gid, c.gid) != 0
                    || libc::syscall(libc::SYS_setresuid, c.uid, c.uid, c.uid) != 0)
            {
                libc::_exit(250);
            }
            libc::_exit(body());
        }
    }
    assert!(pid > 0, "fork: {}", io::Error::last_os_error());
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        assert_eq!(last_errno(), libc::EINTR, "waitpid");
    }
    assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
    let code = libc::WEXITSTATUS(status);
    assert_ne!(code, 250, "could not switch to {creds:?}");
    code
}

/// Runs `body` as `uid:gid` without supplementary groups in a forked child (see
/// [`in_child`]); returns 0 or its errno.
pub fn as_user(uid: u32, gid: u32, body: impl FnOnce() -> i32) -> i32 {
    in_child(
        Some(Creds {
            uid,
            gid,
            groups: &[],
        }),
        body,
    )
}

/// `open(path, flags, mode)` then `close`, as a child body: 0 or the errno of `open`.
pub fn try_open(path: &CString, flags: i32, mode: u32) -> i32 {
    // SAFETY: raw syscalls on a NUL-terminated path prepared before the fork.
    unsafe {
        let fd = libc::open(path.as_ptr(), flags, mode);
        if fd < 0 {
            return last_errno();
        }
        libc::close(fd);
    }
    0
}

/// Number of fds the process `pid` holds.
pub fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// `(rchar, wchar)` of `/proc/<pid>/io`: bytes the process moved through read-like and
/// write-like syscalls (all its threads), whatever the file.
pub fn proc_io(pid: i32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().parse::<u64>().unwrap())
            .unwrap()
    };
    (field("rchar:"), field("wchar:"))
}

/// Sets RLIMIT_NOFILE of process `pid` (soft and hard).
pub fn set_nofile(pid: i32, soft: u64, hard: u64) {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: valid rlimit pointer; a null old-limit pointer is allowed.
    let r = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &lim, std::ptr::null_mut()) };
    assert_eq!(r, 0, "prlimit: {}", io::Error::last_os_error());
}

/// RLIMIT_NOFILE (soft, hard) of process `pid`.
pub fn get_nofile(pid: i32) -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out-pointer; a null new-limit pointer only reads.
    let r = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut lim) };
    assert_eq!(r, 0, "prlimit: {}", io::Error::last_os_error());
    (lim.rlim_cur, lim.rlim_max)
}

/// `len` pseudo-random bytes from `seed` (xorshift64*), reproducible.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        out.extend_from_slice(&s.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A 64-bit running checksum (FNV-1a over 8-byte words, then a byte tail), order-sensitive.
/// Feed it chunks whose lengths are multiples of 8, except the last.
pub struct Checksum {
    h: u64,
    len: u64,
}

impl Default for Checksum {
    fn default() -> Self {
        Checksum {
            h: 0xcbf2_9ce4_8422_2325,
            len: 0,
        }
    }
}

impl Checksum {
    /// Adds `data`.
    pub fn update(&mut self, data: &[u8]) {
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            self.h ^= u64::from_le_bytes(c.try_into().unwrap());
            self.h = self.h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        for b in chunks.remainder() {
            self.h ^= u64::from(*b);
            self.h = self.h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.len += data.len() as u64;
    }

    /// `(checksum, length)`.
    pub fn finish(&self) -> (u64, u64) {
        (self.h ^ self.len, self.len)
    }
}

/// `(checksum, length)` of `data`.
pub fn checksum(data: &[u8]) -> (u64, u64) {
    let mut c = Checksum::default();
    c.update(data);
    c.finish()
}

/// `(checksum, length)` of a whole file, read in full 1 MiB chunks.
pub fn file_checksum(p: &Path) -> (u64, u64) {
    use std::io::Read;
    let mut f = File::open(p).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut sum = Checksum::default();
    loop {
        let mut got = 0;
        while got < buf.len() {
            let n = f.read(&mut buf[got..]).unwrap();
            if n == 0 {
                break;
            }
            got += n;
        }
        sum.update(&buf[..got]);
        if got < buf.len() {
            break;
        }
    }
    sum.finish()
}

/// Polls `f` every 10 ms for up to `timeout`.
pub fn eventually(timeout: Duration, f: impl FnMut() -> bool) -> bool {
    fuse_tests::harness::wait_until(timeout, f)
}

/// Owns a raw fd (for fds made by libc calls).
pub fn owned(fd: i32) -> OwnedFd {
    assert!(fd >= 0, "{}", io::Error::last_os_error());
    // SAFETY: a fresh fd owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// `IP:PORT` with a port that was free on `ip` a moment ago, for `--admin-addr`.
pub fn free_addr(ip: &str) -> String {
    let l = std::net::TcpListener::bind((ip, 0)).expect("bind an ephemeral port");
    format!("{ip}:{}", l.local_addr().unwrap().port())
}

/// The admin server's base URL (`http://IP:PORT`) of the drainfs `m` runs, read from its
/// command line (`--admin-addr`), once the server accepts connections (up to 10 s); an
/// unspecified address (`0.0.0.0`) is reached on loopback.
pub fn admin_base(m: &Mounted) -> String {
    // Read once the process has exec'd drainfs (before, /proc shows the forked parent's).
    let addr_arg = || {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", m.proc.pid())).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let i = args.iter().position(|a| *a == b"--admin-addr")?;
        Some(String::from_utf8_lossy(args.get(i + 1)?).replace("0.0.0.0", "127.0.0.1"))
    };
    let mut addr = None;
    fuse_tests::harness::wait_until(Duration::from_secs(10), || {
        addr = addr_arg();
        addr.is_some()
    });
    let addr = addr.expect("drainfs runs with --admin-addr");
    assert!(
        !addr.ends_with(":0"),
        "pass a fixed port (free_addr), not 0"
    );
    assert!(
        fuse_tests::harness::wait_until(Duration::from_secs(10), || {
            std::net::TcpStream::connect(&addr).is_ok()
        }),
        "the admin server does not listen on {addr}"
    );
    format!("http://{addr}")
}

/// drainfs's `/status` JSON, asked through its control socket (`drainfs status --json`);
/// `None` while nothing answers there.
pub fn status(sock: &Path) -> Option<serde_json::Value> {
    let out = std::process::Command::new(fuse_tests::harness::bin("drainfs"))
        .args(["status", "--json", "--control-socket"])
        .arg(sock)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// Waits up to `timeout` for drainfs's `/status` phase to be `phase` (`door_closed`...).
pub fn wait_phase(sock: &Path, phase: &str, timeout: Duration) -> bool {
    fuse_tests::harness::wait_until(timeout, || {
        status(sock).is_some_and(|v| v["phase"] == phase)
    })
}

/// The `cause` of a summary file (`sigterm`, `exit_file`, `watched_pid_exited`...).
pub fn summary_cause(summary: &Path) -> String {
    let v = fuse_tests::wait::summary_at(summary);
    v["cause"]["cause"].as_str().unwrap_or_default().to_string()
}

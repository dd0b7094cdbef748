//! Small file helpers shared by the mount tests: a deterministic data pattern, `close(2)` with
//! its result (dropping a `File` ignores it), errno names for comparing outcomes across mounts,
//! and a shared mapping of a file ([`SharedMap`]) that outlives its fd if the test wants.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::path::Path;

/// `len` bytes of a deterministic pseudo-random pattern (xorshift64, seeded by `seed`).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The errno name of an I/O error (`ENOENT`...), or its text when it has no errno.
pub fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => format!("{:?}", nix::errno::Errno::from_raw(n)),
        None => e.to_string(),
    }
}

/// `Ok(v)` as `v`, an error as its errno name.
pub fn show<T: std::fmt::Debug>(r: io::Result<T>) -> String {
    match r {
        Ok(v) => format!("{v:?}"),
        Err(e) => errno_name(&e),
    }
}

/// `close(2)` of a file, returning its result (dropping a `File` ignores it).
pub fn close(f: File) -> io::Result<()> {
    let fd = f.into_raw_fd();
    // SAFETY: `fd` was just released by `into_raw_fd`, so it is open and owned by nobody else.
    if unsafe { libc::close(fd) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Writes `data` to a new file at `path` and closes it, returning close's result.
pub fn write_file(path: &Path, data: &[u8]) -> io::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(data)?;
    close(f)
}

/// Sorted entry names of a directory.
pub fn names(dir: &Path) -> io::Result<Vec<String>> {
    let mut v: Vec<String> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<io::Result<_>>()?;
    v.sort();
    Ok(v)
}

/// A `MAP_SHARED` mapping of the first `len` bytes of a file (`mmap(2)`), unmapped on drop
/// (or by [`SharedMap::unmap`], which asserts that `munmap(2)` succeeded). The mapping stays
/// valid after the file's fd is closed, as the kernel keeps the file open for it.
pub struct SharedMap {
    ptr: *mut libc::c_void,
    len: usize,
    writable: bool,
}

impl SharedMap {
    /// Maps `len` bytes of `f` from offset 0, read-write when `writable`, else read-only.
    ///
    /// # Panics
    /// If `mmap` fails (with its errno).
    pub fn new(f: &File, len: usize, writable: bool) -> SharedMap {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of an open file; nothing else in this process aliases
        // it, and it is unmapped once, by `unmap` or drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(
            ptr,
            libc::MAP_FAILED,
            "mmap: {}",
            io::Error::last_os_error()
        );
        SharedMap { ptr, len, writable }
    }

    /// The mapped bytes (reading faults them in).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes long and readable while `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }

    /// Copies `data` into the mapping at `off` (dirtying its pages; no WRITE is sent yet).
    ///
    /// # Panics
    /// If the mapping is read-only or `off + data.len()` is past its end.
    pub fn write_at(&mut self, off: usize, data: &[u8]) {
        assert!(self.writable, "a read-only mapping");
        assert!(off + data.len() <= self.len, "past the mapping's end");
        // SAFETY: in bounds (asserted) of a writable mapping owned by `self`.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.cast::<u8>().add(off), data.len())
        };
    }

    /// Fills the whole mapping with `byte`.
    pub fn fill(&mut self, byte: u8) {
        self.write_at(0, &vec![byte; self.len]);
    }

    /// `msync(MS_SYNC)` of the whole mapping.
    ///
    /// # Panics
    /// If it fails (with its errno).
    pub fn msync(&self) {
        // SAFETY: the mapping made by `new`, still mapped.
        let r = unsafe { libc::msync(self.ptr, self.len, libc::MS_SYNC) };
        assert_eq!(r, 0, "msync: {}", io::Error::last_os_error());
    }

    /// Unmaps it now.
    ///
    /// # Panics
    /// If `munmap` fails.
    pub fn unmap(self) {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: unmaps exactly what `new` mapped, once (drop does not run).
        let r = unsafe { libc::munmap(this.ptr, this.len) };
        assert_eq!(r, 0, "munmap: {}", io::Error::last_os_error());
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped, once.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// A read of `path` with O_DIRECT (so it reaches the FUSE daemon whatever the page cache
/// holds) on a thread of its own, for tests that need a read stuck in the daemon.
pub struct StuckReader {
    tid: i32,
    fd: i32,
    thread: std::thread::JoinHandle<io::Result<usize>>,
}

impl StuckReader {
    /// Opens `path` (O_RDONLY | O_DIRECT) and reads 1 MiB from it on a new thread; returns once
    /// the file is open.
    ///
    /// # Panics
    /// When the open does not finish within 10 s.
    pub fn start(path: &Path) -> StuckReader {
        use std::os::unix::fs::OpenOptionsExt;
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.to_path_buf();
        let thread = std::thread::spawn(move || {
            let mut f = fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(&p)?;
            let _ = tx.send((nix::unistd::gettid().as_raw(), f.as_raw_fd()));
            let mut buf = vec![0u8; 1 << 20];
            io::Read::read(&mut f, &mut buf)
        });
        let (tid, fd) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the reader did not open the file");
        StuckReader { tid, fd, thread }
    }

    /// Whether the thread is asleep in `read(2)` on its fd (from `/proc`, as `strace -p` sees
    /// it) and has not returned.
    pub fn in_read(&self) -> bool {
        let text =
            fs::read_to_string(format!("/proc/self/task/{}/syscall", self.tid)).unwrap_or_default();
        let mut f = text.split_whitespace();
        !self.thread.is_finished()
            && f.next() == Some(libc::SYS_read.to_string().as_str())
            && f.next() == Some(format!("{:#x}", self.fd).as_str())
    }

    /// Asserts that the read is stuck: in `read(2)` within 10 s and still there 500 ms later.
    /// A read that returned is reported with its result.
    pub fn assert_stuck(self) -> StuckReader {
        self.assert_stuck_noting(String::new)
    }

    /// [`StuckReader::assert_stuck`], adding `note()` (what the test knows of the state that
    /// should hold the read, e.g. its server's process state) to a failure.
    pub fn assert_stuck_noting(self, note: impl Fn() -> String) -> StuckReader {
        if !crate::wait::wait_until(std::time::Duration::from_secs(10), || {
            self.in_read() || self.thread.is_finished()
        }) || self.thread.is_finished()
        {
            let syscall = fs::read_to_string(format!("/proc/self/task/{}/syscall", self.tid))
                .unwrap_or_default();
            let note = note();
            if self.thread.is_finished() {
                panic!(
                    "the read returned instead of waiting: {:?} ({note})",
                    self.join()
                );
            }
            panic!("the reader is not in read(2) after 10 s: its syscall is {syscall:?} ({note})");
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert!(
            !self.thread.is_finished(),
            "the read returned (its thread finished)"
        );
        assert!(self.in_read(), "the reader left read(2) without returning");
        self
    }

    /// The read's result.
    pub fn join(self) -> io::Result<usize> {
        self.thread.join().expect("the reader panicked")
    }
}

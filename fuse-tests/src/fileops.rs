//! Small file helpers shared by the mount tests: a deterministic data pattern, `close(2)` with
//! its result (dropping a `File` ignores it), errno names for comparing outcomes across mounts.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::IntoRawFd;
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

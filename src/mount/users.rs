//! Who else uses a FUSE superblock: the processes that hold a file on it open for writing
//! (or map one shared and writable), found in `/proc` without touching the filesystem (no
//! `stat` of a path on it, which would wait on its daemon). drainfs asks this before it
//! ends a lower's connection: a writer that is not drainfs (a process working on the lower
//! directly) would lose what it has not closed yet.
//!
//! Reading another process's `/proc` files can block on that process (its memory-map lock,
//! see [`probe`]), and any process of drainfs's PID namespace may be stuck on a wedged FUSE
//! mount drainfs does not own. So the scan ([`scan::scan`]) reads each process on a helper
//! thread with a deadline, and a process that does not answer in time is reported as
//! *unanswered*: it may be a writer, and the caller treats it as one.

use std::path::Path;

use super::MountInfo;

pub mod scan;

/// The mounts of the superblock `devno` (`major:minor`, mountinfo's field 3) in `table`: the
/// lower's own mount and any bind mount of it.
pub fn mounts_of(table: &[MountInfo], devno: &str) -> Vec<u64> {
    table
        .iter()
        .filter(|m| m.devno == devno)
        .map(|m| m.id)
        .collect()
}

/// The mounts stacked under `id` (mounted somewhere inside it), by mount point.
pub fn children_of(table: &[MountInfo], id: u64) -> Vec<std::path::PathBuf> {
    table
        .iter()
        .filter(|m| m.parent_id == id && m.id != id)
        .map(|m| m.mount_point.clone())
        .collect()
}

/// Whether the process `pid` holds a file of the mounts `ids` open for writing, or maps one
/// of superblock `devno` shared and writable: `Some("pid comm")` when it does, `None` when it
/// does not or has gone. Reads only `/proc/PID` (never a path on any mounted file system):
///
/// - `fd/N` is read as a link first, and `fdinfo/N` only for an fd whose link is a path
///   (a file on a file system: sockets, pipes and anonymous inodes are skipped): an epoll's
///   or inotify's `fdinfo` takes that object's mutex, which a thread of the process can hold
///   while it waits on a wedged FUSE daemon (`epoll_ctl` polls the file it adds), and a
///   reader of it would sleep uninterruptibly;
/// - `maps` takes the process's memory-map lock (killably): a process with a thread stuck
///   in a page fault on a wedged FUSE mount, and another waiting to change its map, blocks
///   it. [`scan::scan`] bounds this with a deadline per process; `probe` itself may block.
pub fn probe(pid: i32, ids: &[u64], devno: &str) -> Option<String> {
    let dir = Path::new("/proc").join(pid.to_string());
    if writes_through_fds(&dir, ids) || maps_shared_writable(&dir, devno) {
        let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
        return Some(format!("{pid} {}", comm.trim()));
    }
    None
}

/// The processes of this PID namespace, by pid, from `/proc` (the directory listing takes no
/// lock of any process).
pub fn pids() -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|p| p.file_name().to_str()?.parse::<i32>().ok())
        .collect()
}

/// Whether an fd of the process at `dir` is open for writing on one of the mounts `ids`.
fn writes_through_fds(dir: &Path, ids: &[u64]) -> bool {
    let Ok(fds) = std::fs::read_dir(dir.join("fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        // A file on a file system has a path; skip everything else before its fdinfo.
        let is_file = std::fs::read_link(fd.path())
            .is_ok_and(|l| l.as_os_str().as_encoded_bytes().first() == Some(&b'/'));
        if !is_file {
            return false;
        }
        let text =
            std::fs::read_to_string(dir.join("fdinfo").join(fd.file_name())).unwrap_or_default();
        let field = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_string())
        };
        let on_lower = field("mnt_id:")
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|id| ids.contains(&id));
        let writable = field("flags:")
            .and_then(|v| i32::from_str_radix(&v, 8).ok())
            .is_some_and(|f| f & libc::O_ACCMODE != libc::O_RDONLY);
        on_lower && writable
    })
}

/// Whether the process at `dir` maps a file of superblock `devno` shared and writable.
fn maps_shared_writable(dir: &Path, devno: &str) -> bool {
    let Some((major, minor)) = devno.split_once(':') else {
        return false;
    };
    let (Ok(major), Ok(minor)) = (major.parse::<u32>(), minor.parse::<u32>()) else {
        return false;
    };
    // maps prints the device as hex `MM:mm`.
    let dev = format!("{major:02x}:{minor:02x}");
    std::fs::read_to_string(dir.join("maps"))
        .unwrap_or_default()
        .lines()
        .any(|l| {
            let mut f = l.split_whitespace();
            let perms = f.nth(1).unwrap_or("");
            let dev_field = f.nth(1).unwrap_or("");
            perms.starts_with("rw") && perms.ends_with('s') && dev_field == dev
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two child processes hold the same file open, one read-only and one for writing (by
    /// their shells' redirections): only the writer is listed.
    #[test]
    fn lists_a_process_writing_a_file_and_not_one_reading_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let devno = super::super::mounts()
            .into_iter()
            .filter(|m| dir.path().starts_with(&m.mount_point))
            .max_by_key(|m| m.mount_point.as_os_str().len())
            .expect("the temp dir's mount")
            .devno;
        let hold = |redirect: &str| {
            std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("exec 3{redirect}\"$0\"; echo; exec sleep 30"))
                .arg(&f)
                // Nothing inherited: the test's own stderr may be a file on the same
                // filesystem (a log under /tmp), which would make the reader a writer too.
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        };
        let mut reader = hold("<");
        let mut writer = hold(">>");
        for c in [&mut reader, &mut writer] {
            let mut line = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(c.stdout.as_mut().unwrap()),
                &mut line,
            )
            .unwrap();
        }
        let found = scan::scan(&devno, scan::PER_PROCESS);
        // Other processes of the machine may not answer; these two must.
        for c in [&reader, &writer] {
            assert!(!found.unanswered.contains(&(c.id() as i32)), "{found:?}");
        }
        let listed = found.writers;
        let has = |pid: u32| {
            listed
                .iter()
                .any(|w| w.split(' ').next() == Some(pid.to_string().as_str()))
        };
        let (r, w) = (has(reader.id()), has(writer.id()));
        for mut c in [reader, writer] {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert!(w, "the writer is not listed: {listed:?}");
        assert!(!r, "the reader is listed: {listed:?}");
    }

    #[test]
    fn mounts_and_children_from_a_table() {
        let text = "30 1 0:40 / /lower rw - fuse.gcsfuse b rw\n\
                    31 1 0:40 / /bind rw - fuse.gcsfuse b rw\n\
                    32 30 0:41 / /lower/sub rw - tmpfs t rw\n";
        let t = super::super::parse_mountinfo(text);
        assert_eq!(mounts_of(&t, "0:40"), vec![30, 31]);
        assert_eq!(
            children_of(&t, 30),
            vec![std::path::PathBuf::from("/lower/sub")]
        );
        assert!(children_of(&t, 31).is_empty());
    }
}

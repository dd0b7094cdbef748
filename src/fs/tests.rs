//! Core tests on a temp dir, without mounting.

use super::*;

use std::cell::RefCell;
use std::sync::atomic::Ordering::SeqCst;

/// Points in the core where a test can run code, to force an interleaving of two requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Point {
    /// `remember` found no inode under the read guard and is about to take the write guard.
    BeforeWriteGuard,
    /// `remember` found an existing inode under the write guard and has released it.
    AfterCountedUnderWriteGuard,
    /// `rename` renamed on the lower and has not yet checked the new names.
    AfterLowerRename,
}

type Hook = Box<dyn FnMut(Point)>;

thread_local! {
    static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

/// Runs this thread's hook at `point`; the hook is not re-entered by the calls it makes.
pub(super) fn hook(point: Point) {
    let Some(mut h) = HOOK.with_borrow_mut(Option::take) else {
        return;
    };
    h(point);
    HOOK.with_borrow_mut(|slot| {
        if slot.is_none() {
            *slot = Some(h);
        }
    });
}

fn set_hook(h: impl FnMut(Point) + 'static) {
    HOOK.with_borrow_mut(|slot| *slot = Some(Box::new(h)));
}

fn clear_hook() {
    HOOK.with_borrow_mut(|slot| *slot = None);
}

fn fs_on(dir: &Path, max_fds: usize) -> Fs {
    let acct = Accounting::new();
    Fs::new(
        dir,
        CoreConfig {
            max_lower_fds: max_fds,
        },
        Arc::clone(&acct),
        Admission::new(&acct),
    )
    .unwrap()
}

fn create(fs: &Fs, parent: u64, name: &str) -> (Entry, u64) {
    let (e, o) = fs
        .create(
            parent,
            OsStr::new(name),
            0o644,
            libc::O_RDWR,
            Caller::ROOT,
            None,
        )
        .unwrap();
    (e, o.fh)
}

#[test]
fn hard_links_share_a_nodeid_and_rename_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_on(dir.path(), 64);
    let (e, fh) = create(&fs, ROOT_ID, "a");
    assert_eq!(fs.write(e.nodeid, fh, 0, b"hello", None).unwrap(), 5);
    fs.release(e.nodeid, fh).unwrap();
    let l = fs.link(e.nodeid, ROOT_ID, OsStr::new("b")).unwrap();
    assert_eq!(l.nodeid, e.nodeid);
    assert_eq!(l.st.st_nlink, 2);
    let d = fs
        .mkdir(ROOT_ID, OsStr::new("d"), 0o755, Caller::ROOT)
        .unwrap();
    let renamed = fs
        .rename(ROOT_ID, OsStr::new("a"), d.nodeid, OsStr::new("c"), 0)
        .unwrap();
    assert!(renamed.stale.is_empty(), "a POSIX lower keeps the identity");
    assert_eq!(
        fs.lookup(d.nodeid, OsStr::new("c")).unwrap().nodeid,
        e.nodeid
    );
    assert_eq!(fs.getattr(e.nodeid, None).unwrap().st_size, 5);
    // RENAME_NOREPLACE onto an existing name is the lower's EEXIST.
    let err = fs
        .rename(
            d.nodeid,
            OsStr::new("c"),
            ROOT_ID,
            OsStr::new("b"),
            libc::RENAME_NOREPLACE,
        )
        .unwrap_err();
    assert_eq!(err.kind.errno(), Errno::EEXIST);
}

#[test]
fn lower_errnos_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_on(dir.path(), 64);
    assert_eq!(
        fs.lookup(ROOT_ID, OsStr::new("missing"))
            .unwrap_err()
            .kind
            .errno(),
        Errno::ENOENT
    );
    let d = fs
        .mkdir(ROOT_ID, OsStr::new("d"), 0o755, Caller::ROOT)
        .unwrap();
    create(&fs, d.nodeid, "f");
    assert_eq!(
        fs.unlink(ROOT_ID, OsStr::new("d"), true)
            .unwrap_err()
            .kind
            .errno(),
        Errno::ENOTEMPTY
    );
    assert_eq!(
        fs.mkdir(ROOT_ID, OsStr::new("d"), 0o755, Caller::ROOT)
            .unwrap_err()
            .kind
            .errno(),
        Errno::EEXIST
    );
}

#[test]
fn unlinked_open_file_keeps_working_with_an_empty_fd_cache() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_on(dir.path(), 16);
    let (e, fh) = create(&fs, ROOT_ID, "gone");
    fs.unlink(ROOT_ID, OsStr::new("gone"), false).unwrap();
    fs.fd_cache.lock().clear();
    assert_eq!(fs.write(e.nodeid, fh, 0, b"abc", None).unwrap(), 3);
    let st = fs.getattr(e.nodeid, None).unwrap();
    assert_eq!((st.st_size, st.st_nlink), (3, 0));
    let mut buf = [0u8; 8];
    assert_eq!(fs.read(e.nodeid, fh, 0, &mut buf).unwrap(), 3);
    fs.release(e.nodeid, fh).unwrap();
    assert!(fs.acct.outstanding().is_idle());
}

#[test]
fn fd_cache_stays_within_budget() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_on(dir.path(), 16);
    let mut dirs = vec![ROOT_ID];
    for i in 0..40 {
        dirs.push(
            fs.mkdir(
                dirs[i / 4],
                OsStr::new(&format!("d{i}")),
                0o755,
                Caller::ROOT,
            )
            .unwrap()
            .nodeid,
        );
    }
    for (i, d) in dirs.iter().enumerate() {
        let (e, fh) = create(&fs, *d, &format!("f{i}"));
        fs.release(e.nodeid, fh).unwrap();
        fs.setattr(e.nodeid, None, Some(0o600), None, None, None, None, None)
            .unwrap();
    }
    assert!(fs.cached_fds() <= 16, "{} cached", fs.cached_fds());
    for d in &dirs {
        fs.getattr(*d, None).unwrap();
    }
}

#[test]
fn closed_admission_refuses_opens_but_not_open_handles() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_on(dir.path(), 64);
    let (e, fh) = create(&fs, ROOT_ID, "f");
    fs.admission.close();
    assert_eq!(
        fs.open(e.nodeid, libc::O_RDONLY, Caller::ROOT, None)
            .err()
            .unwrap()
            .kind
            .errno(),
        Errno::ESHUTDOWN
    );
    assert_eq!(
        fs.mkdir(ROOT_ID, OsStr::new("x"), 0o755, Caller::ROOT)
            .unwrap_err()
            .kind
            .errno(),
        Errno::ESHUTDOWN
    );
    assert_eq!(fs.write(e.nodeid, fh, 0, b"late", None).unwrap(), 4);
    fs.flush(e.nodeid, fh).unwrap();
    fs.release(e.nodeid, fh).unwrap();
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"late");
}

#[test]
fn forget_removes_at_zero_and_saturates() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_on(dir.path(), 64);
    let (e, fh) = create(&fs, ROOT_ID, "f");
    fs.release(e.nodeid, fh).unwrap();
    fs.lookup(ROOT_ID, OsStr::new("f")).unwrap();
    assert_eq!(fs.inode_count(), 2);
    fs.forget(e.nodeid, 1);
    assert_eq!(fs.inode_count(), 2);
    fs.forget(e.nodeid, 5);
    assert_eq!(fs.inode_count(), 1);
    fs.forget(e.nodeid, 1);
    assert_eq!(
        fs.getattr(e.nodeid, None).unwrap_err().kind.errno(),
        Errno::ESTALE
    );
}

/// A caller allowed into a directory only by a supplementary group (a pod's fsGroup) creates
/// entries there: its groups are read from `/proc/<pid>/status` and switched to for the lower
/// call. Without them the lower refuses. Switching credentials needs root, which the suite
/// runs as: without it the test fails rather than passing untested.
#[test]
fn creates_use_the_callers_supplementary_groups() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    assert!(
        rustix::process::geteuid().is_root(),
        "this test switches credentials and must run as root"
    );
    const TEAM: u32 = 5151;
    let dir = tempfile::tempdir().unwrap();
    let team = dir.path().join("team");
    std::fs::create_dir(&team).unwrap();
    std::os::unix::fs::chown(&team, Some(0), Some(TEAM)).unwrap();
    std::fs::set_permissions(&team, std::fs::Permissions::from_mode(0o770)).unwrap();
    let fs = fs_on(dir.path(), 64);
    let team_id = fs.lookup(ROOT_ID, OsStr::new("team")).unwrap().nodeid;

    // A process whose only supplementary group is TEAM stands for the caller.
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("30");
    // SAFETY: setgroups in the child before exec (still root there: no uid change is set).
    unsafe {
        cmd.pre_exec(|| {
            if libc::setgroups(1, &TEAM) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut member = cmd.spawn().unwrap();
    assert_eq!(sys::caller_groups(member.id()), vec![TEAM]);
    let caller = Caller {
        uid: 4242,
        gid: 4343,
        pid: member.id(),
    };
    let d = fs.mkdir(team_id, OsStr::new("d"), 0o750, caller);
    let f = fs.create(
        team_id,
        OsStr::new("f"),
        0o640,
        libc::O_WRONLY,
        caller,
        None,
    );
    let _ = member.kill();
    let _ = member.wait();
    let d = d.unwrap();
    assert_eq!((d.st.st_uid, d.st.st_gid), (4242, 4343));
    let (e, o) = f.unwrap();
    assert_eq!((e.st.st_uid, e.st.st_gid), (4242, 4343));
    fs.release(e.nodeid, o.fh).unwrap();

    // A caller whose groups cannot be read (pid 0) gets none: the lower refuses.
    let stranger = Caller {
        uid: 4242,
        gid: 4343,
        pid: 0,
    };
    assert_eq!(
        fs.mkdir(team_id, OsStr::new("x"), 0o750, stranger)
            .unwrap_err()
            .kind
            .errno(),
        Errno::EACCES
    );
    // The thread is root with its own groups again.
    let r = fs
        .mkdir(ROOT_ID, OsStr::new("mine"), 0o755, Caller::ROOT)
        .unwrap();
    assert_eq!((r.st.st_uid, r.st.st_gid), (0, 0));
    assert_eq!(
        sys::caller_groups(std::process::id()),
        sys::caller_groups(nix::unistd::gettid().as_raw() as u32)
    );
}

#[test]
fn privs_to_kill_follows_the_vfs() {
    use libc::{S_IFDIR, S_IFREG, S_ISGID, S_ISUID};
    let user = Caller {
        uid: 4242,
        gid: 4343,
        pid: 0,
    };
    // (mode, file gid, bits a write by `user` clears)
    let cases = [
        (S_IFREG | 0o755, 0, 0),
        (S_IFREG | S_ISUID | 0o755, 0, S_ISUID),
        (S_IFREG | S_ISUID | S_ISGID | 0o775, 0, S_ISUID | S_ISGID),
        // Group-executable: S_ISGID goes even for a member of the group.
        (S_IFREG | S_ISGID | 0o775, 4343, S_ISGID),
        // Not group-executable: S_ISGID stays for a member, goes for anyone else.
        (S_IFREG | S_ISGID | 0o664, 4343, 0),
        (S_IFREG | S_ISGID | 0o664, 0, S_ISGID),
        // Directories keep theirs.
        (S_IFDIR | S_ISGID | S_ISUID | 0o775, 0, 0),
    ];
    for (mode, gid, want) in cases {
        assert_eq!(
            privs_to_kill(mode, gid, &user),
            want,
            "mode {mode:o} gid {gid}"
        );
    }
}

/// Opens that must not be kernel passthrough: an unprivileged writer of a set-user-ID file
/// (its WRITEs must reach drainfs to clear the bit), and any open next to opens served by
/// drainfs (the kernel refuses to mix them with EIO). With passthrough opens already there, the
/// writer gets passthrough too and the bit is cleared at open.
#[test]
fn suid_writers_and_cached_inodes_are_not_passthrough() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("suid");
    std::fs::write(&path, b"x").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let fs = fs_on(dir.path(), 64);
    let id = fs.lookup(ROOT_ID, OsStr::new("suid")).unwrap().nodeid;
    let registered = std::sync::atomic::AtomicUsize::new(0);
    let register = |_: BorrowedFd<'_>| -> std::io::Result<Backing> {
        registered.fetch_add(1, SeqCst);
        Ok(Arc::new(()))
    };
    let register = Passthrough {
        register: &register,
        only_if_shared: false,
    };
    let user = Caller {
        uid: 4242,
        gid: 4343,
        pid: 0,
    };
    let mode = || std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;

    let w = fs.open(id, libc::O_WRONLY, user, Some(register)).unwrap();
    assert!(
        w.backing.is_none(),
        "an unprivileged suid writer is served by drainfs"
    );
    assert_eq!(mode(), 0o4755, "cleared on write, not at open");
    let r = fs
        .open(id, libc::O_RDONLY, Caller::ROOT, Some(register))
        .unwrap();
    assert!(r.backing.is_none(), "next to a drainfs-served open");
    assert_eq!(registered.load(SeqCst), 0);
    fs.release(id, w.fh).unwrap();
    fs.release(id, r.fh).unwrap();

    let r = fs
        .open(id, libc::O_RDONLY, Caller::ROOT, Some(register))
        .unwrap();
    assert!(r.backing.is_some());
    let w = fs.open(id, libc::O_WRONLY, user, Some(register)).unwrap();
    assert!(w.backing.is_some(), "next to a passthrough open");
    assert_eq!(mode(), 0o755, "cleared at open instead");
    assert_eq!(registered.load(SeqCst), 1, "one backing id shared");
    // Root writing needs neither.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let rw = fs
        .open(id, libc::O_WRONLY, Caller::ROOT, Some(register))
        .unwrap();
    assert!(rw.backing.is_some());
    assert_eq!(mode(), 0o4755);
    for fh in [r.fh, w.fh, rw.fh] {
        fs.release(id, fh).unwrap();
    }
}

/// An O_DIRECT open served by drainfs writes and reads its lower fd with O_DIRECT (as the
/// kernel's backing file of a passthrough open does), from aligned buffers; an I/O the
/// lower's direct I/O refuses (`EINVAL`: on ext4 an unaligned offset) is done buffered, and
/// the handle stays buffered. A passthrough open's own lower fd is not O_DIRECT.
#[test]
fn o_direct_opens_served_by_drainfs_write_the_lower_directly() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_on(dir.path(), 64);
    let is_direct = |id: u64, fh: u64| {
        let h = fs.handle(id, fh).unwrap();
        rustix::fs::fcntl_getfl(h.fd.as_fd())
            .unwrap()
            .contains(rustix::fs::OFlags::DIRECT)
    };
    let (e, o) = fs
        .create(
            ROOT_ID,
            OsStr::new("f"),
            0o644,
            libc::O_RDWR | libc::O_DIRECT,
            Caller::ROOT,
            None,
        )
        .unwrap();
    let id = e.nodeid;
    assert!(is_direct(id, o.fh));
    // An aligned offset and length from an unaligned buffer.
    let data: Vec<u8> = (0..4097u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(fs.write(id, o.fh, 0, &data[1..], None).unwrap(), 4096);
    assert!(is_direct(id, o.fh), "the lower took the direct write");
    let mut buf = vec![0u8; 4097];
    assert_eq!(fs.read(id, o.fh, 0, &mut buf[1..]).unwrap(), 4096);
    assert_eq!(buf[1..], data[1..]);
    // An unaligned offset: buffered if the lower refuses it.
    assert_eq!(fs.write(id, o.fh, 3, b"0123456789", None).unwrap(), 10);
    let mut want = data[1..].to_vec();
    want[3..13].copy_from_slice(b"0123456789");
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), want);
    fs.release(id, o.fh).unwrap();

    let register = |_: BorrowedFd<'_>| -> std::io::Result<Backing> { Ok(Arc::new(())) };
    let register = Passthrough {
        register: &register,
        only_if_shared: false,
    };
    let p = fs
        .open(
            id,
            libc::O_RDWR | libc::O_DIRECT,
            Caller::ROOT,
            Some(register),
        )
        .unwrap();
    assert!(p.backing.is_some());
    assert!(
        !is_direct(id, p.fh),
        "the kernel's backing file has O_DIRECT, not drainfs's fd"
    );
    fs.release(id, p.fh).unwrap();
}

/// `--passthrough reads`: a writable open joins passthrough only when readers already hold the
/// inode's backing id (the kernel requires it); alone it is served by drainfs.
#[test]
fn writers_join_passthrough_only_when_shared() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    let fs = fs_on(dir.path(), 64);
    let id = fs.lookup(ROOT_ID, OsStr::new("f")).unwrap().nodeid;
    let register = |_: BorrowedFd<'_>| -> std::io::Result<Backing> { Ok(Arc::new(())) };
    let join = Passthrough {
        register: &register,
        only_if_shared: true,
    };
    let plain = Passthrough {
        register: &register,
        only_if_shared: false,
    };
    let w = fs
        .open(id, libc::O_WRONLY, Caller::ROOT, Some(join))
        .unwrap();
    assert!(w.backing.is_none(), "a lone writer is served by drainfs");
    fs.release(id, w.fh).unwrap();
    let r = fs
        .open(id, libc::O_RDONLY, Caller::ROOT, Some(plain))
        .unwrap();
    assert!(r.backing.is_some());
    let w = fs
        .open(id, libc::O_WRONLY, Caller::ROOT, Some(join))
        .unwrap();
    assert!(
        w.backing.is_some(),
        "a writer next to passthrough readers joins them"
    );
    fs.release(id, w.fh).unwrap();
    fs.release(id, r.fh).unwrap();
}

/// READDIR's `d_ino` for an entry nobody looked up yet is the nodeid a later LOOKUP returns.
#[test]
fn dirent_nodeids_match_later_lookups() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..10 {
        std::fs::write(dir.path().join(format!("f{i}")), b"").unwrap();
    }
    let fs = fs_on(dir.path(), 64);
    let mut seen = Vec::new();
    for i in 0..10 {
        let st = std::fs::symlink_metadata(dir.path().join(format!("f{i}"))).unwrap();
        use std::os::unix::fs::MetadataExt;
        seen.push((format!("f{i}"), fs.dirent_nodeid(st.dev(), st.ino())));
    }
    for (name, d_ino) in seen {
        assert_eq!(
            fs.lookup(ROOT_ID, OsStr::new(&name)).unwrap().nodeid,
            d_ino,
            "{name}"
        );
    }
}

/// Two LOOKUPs of a new file race: A inserts the inode (count 1) while B waits for the write
/// guard; B then finds it. A FORGET of A's reference that lands right after B releases the
/// guard must leave B's reference counted: the nodeid B returns stays known.
#[test]
fn a_forget_between_lookups_never_drops_a_reference_the_kernel_holds() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    let fs = Arc::new(fs_on(dir.path(), 64));
    let raced: Arc<Mutex<Option<u64>>> = Arc::new(Mutex::new(None));
    {
        let (fs, raced) = (Arc::clone(&fs), Arc::clone(&raced));
        set_hook(move |point| match point {
            // Lookup A, from "another thread", completes first.
            Point::BeforeWriteGuard if raced.lock().is_none() => {
                let a = fs.lookup(ROOT_ID, OsStr::new("f")).unwrap();
                *raced.lock() = Some(a.nodeid);
            }
            // The kernel forgets A's reference while B is between the guard and its reply.
            Point::AfterCountedUnderWriteGuard => {
                let id = raced.lock().expect("lookup A ran");
                fs.forget(id, 1);
            }
            _ => {}
        });
    }
    let b = fs.lookup(ROOT_ID, OsStr::new("f"));
    clear_hook();
    let b = b.unwrap();
    assert_eq!(
        Some(b.nodeid),
        *raced.lock(),
        "both lookups found one inode"
    );
    // The kernel holds B's reference: the nodeid must still be served.
    assert_eq!(fs.getattr(b.nodeid, None).unwrap().st_size, 1);
    assert_eq!(fs.inode(b.nodeid).unwrap().lookups.load(SeqCst), 1);
    fs.forget(b.nodeid, 1);
    assert_eq!(
        fs.getattr(b.nodeid, None).unwrap_err().raw_errno(),
        libc::ESTALE
    );
}

/// Lower fds of the process that point into `dir`.
fn fds_into(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(dir)))
        .count()
}

#[test]
fn close_lower_fds_closes_everything_and_later_calls_fail_with_eio() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::create_dir(root.join("d")).unwrap();
    let fs = fs_on(&root, 64);
    let (e, fh) = create(&fs, ROOT_ID, "f");
    fs.write(e.nodeid, fh, 0, b"data", None).unwrap();
    let d = fs.lookup(ROOT_ID, OsStr::new("d")).unwrap();
    fs.getattr(d.nodeid, None).unwrap();
    fs.readlink(d.nodeid).unwrap_err(); // caches an O_PATH fd for d
    assert!(fds_into(&root) >= 2, "root fd, handle fd, O_PATH fd");
    assert!(fs.close_lower_fds().is_empty());
    assert_eq!(fds_into(&root), 0, "every lower fd is closed");
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"data");
    let eio = |r: Result<()>| assert_eq!(r.unwrap_err().raw_errno(), libc::EIO);
    eio(fs.lookup(ROOT_ID, OsStr::new("f")).map(drop));
    eio(fs.getattr(e.nodeid, None).map(drop));
    eio(fs.getattr(ROOT_ID, None).map(drop));
    eio(fs.read(e.nodeid, fh, 0, &mut [0; 4]).map(drop));
    eio(fs.write(e.nodeid, fh, 0, b"x", None).map(drop));
    eio(fs.flush(e.nodeid, fh));
    eio(fs.release(e.nodeid, fh));
    eio(fs
        .open(e.nodeid, libc::O_RDONLY, Caller::ROOT, None)
        .map(drop));
    eio(fs.opendir(ROOT_ID).map(drop));
    eio(fs.statfs().map(drop));
    eio(fs
        .mkdir(ROOT_ID, OsStr::new("x"), 0o755, Caller::ROOT)
        .map(drop));
    assert!(fs.close_lower_fds().is_empty(), "idempotent");
    assert_eq!(fds_into(&root), 0);
}

/// A released writable passthrough handle's lower fd is kept (the newest per inode, bounded)
/// and closed by the teardown's `close_all`; read-only and drainfs-served handles are closed
/// at RELEASE.
#[test]
fn released_passthrough_writers_linger_until_close_all() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..3 {
        std::fs::write(dir.path().join(format!("f{i}")), b"x").unwrap();
    }
    // A budget of 8 fds: at most 2 lingering.
    let fs = fs_on(dir.path(), 8);
    let register = |_: BorrowedFd<'_>| -> std::io::Result<Backing> { Ok(Arc::new(())) };
    let pt = Passthrough {
        register: &register,
        only_if_shared: false,
    };
    let ids: Vec<u64> = (0..3)
        .map(|i| {
            fs.lookup(ROOT_ID, OsStr::new(&format!("f{i}")))
                .unwrap()
                .nodeid
        })
        .collect();
    let open_fds = || fds_into(dir.path());
    let before = open_fds();
    // Served by drainfs, or read-only: closed at RELEASE.
    let w = fs.open(ids[0], libc::O_WRONLY, Caller::ROOT, None).unwrap();
    fs.release(ids[0], w.fh).unwrap();
    let r = fs
        .open(ids[0], libc::O_RDONLY, Caller::ROOT, Some(pt))
        .unwrap();
    fs.release(ids[0], r.fh).unwrap();
    assert_eq!((fs.lingering(), open_fds()), (0, before));
    // Passthrough writers: kept, the newest per inode.
    for _ in 0..2 {
        let w = fs
            .open(ids[0], libc::O_RDWR, Caller::ROOT, Some(pt))
            .unwrap();
        assert!(w.backing.is_some());
        fs.release(ids[0], w.fh).unwrap();
    }
    assert_eq!((fs.lingering(), open_fds()), (1, before + 1));
    for id in &ids[1..] {
        let w = fs
            .open(*id, libc::O_WRONLY, Caller::ROOT, Some(pt))
            .unwrap();
        fs.release(*id, w.fh).unwrap();
    }
    assert_eq!(fs.lingering(), 2, "bounded: the oldest was closed");
    assert_eq!(open_fds(), before + 2);
    assert!(fs.close_all().is_empty());
    assert_eq!((fs.lingering(), open_fds()), (0, before));
    assert!(fs.failed_flushes().is_empty());
}

/// Makes `rel` under `root` what gcsfuse makes of a renamed name: the same content under new
/// lower inodes (a copy of the tree, then the old one deleted), as after a copy and a delete
/// of objects.
fn recreate_as_copies(root: &Path, rel: &str) {
    fn copy_tree(from: &Path, to: &Path) {
        if from.is_dir() {
            std::fs::create_dir(to).unwrap();
            for e in std::fs::read_dir(from).unwrap() {
                let e = e.unwrap();
                copy_tree(&e.path(), &to.join(e.file_name()));
            }
        } else {
            std::fs::copy(from, to).unwrap();
        }
    }
    let (path, tmp) = (root.join(rel), root.join(format!("{rel}.copy")));
    copy_tree(&path, &tmp);
    if path.is_dir() {
        std::fs::remove_dir_all(&path).unwrap();
    } else {
        std::fs::remove_file(&path).unwrap();
    }
    std::fs::rename(&tmp, &path).unwrap();
}

/// Renames `parent/name` to `newparent/newname` with `flags` while the lower behaves as
/// gcsfuse: right after the lower's rename, each name in `copied` becomes a new lower inode.
fn rename_on_copying_lower(
    fs: &Fs,
    lower: &Path,
    copied: &[&str],
    (parent, name): (u64, &str),
    (newparent, newname): (u64, &str),
    flags: u32,
) -> Renamed {
    let (lower, copied): (PathBuf, Vec<String>) = (
        lower.to_path_buf(),
        copied.iter().map(|c| c.to_string()).collect(),
    );
    set_hook(move |point| {
        if point == Point::AfterLowerRename {
            for c in &copied {
                recreate_as_copies(&lower, c);
            }
        }
    });
    let r = fs.rename(
        parent,
        OsStr::new(name),
        newparent,
        OsStr::new(newname),
        flags,
    );
    clear_hook();
    r.unwrap()
}

fn read_all(fs: &Fs, nodeid: u64) -> Vec<u8> {
    let o = fs.open(nodeid, libc::O_RDONLY, Caller::ROOT, None).unwrap();
    let mut buf = vec![0u8; 64];
    let n = fs.read(nodeid, o.fh, 0, &mut buf).unwrap();
    fs.release(nodeid, o.fh).unwrap();
    buf.truncate(n);
    buf
}

/// Caches the O_PATH fd of `nodeid` (a chmod without a handle goes through it).
fn cache_fd(fs: &Fs, nodeid: u64) {
    let mode = fs.getattr(nodeid, None).unwrap().st_mode & 0o7777;
    fs.setattr(nodeid, None, Some(mode), None, None, None, None, None)
        .unwrap();
}

#[test]
fn a_rename_that_makes_a_new_lower_inode_detaches_the_moved_one() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_on(dir.path(), 64);
    let (e, fh) = create(&fs, ROOT_ID, "f");
    fs.write(e.nodeid, fh, 0, b"one", None).unwrap();
    fs.release(e.nodeid, fh).unwrap();
    cache_fd(&fs, e.nodeid);
    assert_eq!(fs.cached_fds(), 1);
    let old_key = fs.inodes.get(e.nodeid).unwrap().key;

    let renamed =
        rename_on_copying_lower(&fs, dir.path(), &["g"], (ROOT_ID, "f"), (ROOT_ID, "g"), 0);
    assert_eq!(renamed.stale, vec![(ROOT_ID, OsString::from("g"))]);
    assert_eq!(fs.cached_fds(), 0, "the old lower inode's fd is dropped");
    // The deleted original's inode number is free for the lower to reuse (ext4 does at once):
    // it must not lead back to the detached nodeid.
    assert!(fs.inodes.by_key(old_key).is_none());
    // The kernel's old nodeid no longer reaches anything (it would be the deleted original).
    assert_eq!(
        fs.getattr(e.nodeid, None).unwrap_err().raw_errno(),
        libc::ESTALE
    );
    assert_eq!(
        fs.open(e.nodeid, libc::O_RDONLY, Caller::ROOT, None)
            .err()
            .unwrap()
            .raw_errno(),
        libc::ESTALE
    );
    // The next LOOKUP gets the lower's inode, with the content.
    let g = fs.lookup(ROOT_ID, OsStr::new("g")).unwrap();
    assert_ne!(g.nodeid, e.nodeid);
    assert_eq!(read_all(&fs, g.nodeid), b"one");

    // The same name made again and renamed again (issue 24's first sequence).
    let (e2, fh) = create(&fs, ROOT_ID, "f");
    fs.write(e2.nodeid, fh, 0, b"two", None).unwrap();
    fs.release(e2.nodeid, fh).unwrap();
    cache_fd(&fs, e2.nodeid);
    let renamed =
        rename_on_copying_lower(&fs, dir.path(), &["h"], (ROOT_ID, "f"), (ROOT_ID, "h"), 0);
    assert_eq!(renamed.stale, vec![(ROOT_ID, OsString::from("h"))]);
    let h = fs.lookup(ROOT_ID, OsStr::new("h")).unwrap();
    assert!(![e.nodeid, e2.nodeid, g.nodeid].contains(&h.nodeid));
    assert_eq!(read_all(&fs, h.nodeid), b"two");
}

/// Issue 24's first sequence under load: the RELEASE of the file's last handle (the kernel
/// sends it in the background after close) reaches drainfs only after the rename, and the
/// application's next open reaches the moved nodeid through the kernel's entry before the
/// invalidation does. That open must not reopen the still-open handle's fd, which reaches the
/// old lower inode (gcsfuse answers ENOENT for its deleted object; a local lower serves the old
/// file): it fails with ESTALE, on which the VFS looks the name up again (`LOOKUP_REVAL`).
/// The open handle itself keeps reaching what it opened.
#[test]
fn an_open_of_a_nodeid_detached_by_a_rename_does_not_reach_its_open_handles_lower_inode() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_on(dir.path(), 64);
    let d = fs
        .mkdir(ROOT_ID, OsStr::new("d"), 0o755, Caller::ROOT)
        .unwrap();
    let (e, fh) = create(&fs, ROOT_ID, "f");
    fs.write(e.nodeid, fh, 0, b"one", None).unwrap();
    let (inner, inner_fh) = create(&fs, d.nodeid, "inner");
    fs.write(inner.nodeid, inner_fh, 0, b"in", None).unwrap();

    // The file, then its directory, renamed while their handles are still open.
    rename_on_copying_lower(&fs, dir.path(), &["g"], (ROOT_ID, "f"), (ROOT_ID, "g"), 0);
    rename_on_copying_lower(&fs, dir.path(), &["d2"], (ROOT_ID, "d"), (ROOT_ID, "d2"), 0);
    for (nodeid, what) in [
        (e.nodeid, "the moved file"),
        (inner.nodeid, "a file under the moved directory"),
    ] {
        assert_eq!(
            fs.open(nodeid, libc::O_RDONLY, Caller::ROOT, None)
                .err()
                .map(|e| e.raw_errno()),
            Some(libc::ESTALE),
            "{what}: an open by the detached nodeid"
        );
        assert_eq!(
            fs.getattr(nodeid, None).err().map(|e| e.raw_errno()),
            Some(libc::ESTALE),
            "{what}: a GETATTR without a handle"
        );
    }
    // The open handles still reach the inodes they opened.
    assert_eq!(fs.getattr(e.nodeid, Some(fh)).unwrap().st_size, 3);
    let mut buf = [0u8; 8];
    assert_eq!(fs.read(inner.nodeid, inner_fh, 0, &mut buf).unwrap(), 2);
    fs.release(e.nodeid, fh).unwrap();
    fs.release(inner.nodeid, inner_fh).unwrap();
    // The names now lead to the lower's new inodes.
    let g = fs.lookup(ROOT_ID, OsStr::new("g")).unwrap();
    assert_ne!(g.nodeid, e.nodeid);
    assert_eq!(read_all(&fs, g.nodeid), b"one");
    let d2 = fs.lookup(ROOT_ID, OsStr::new("d2")).unwrap();
    let inner2 = fs.lookup(d2.nodeid, OsStr::new("inner")).unwrap();
    assert_ne!(inner2.nodeid, inner.nodeid);
    assert_eq!(read_all(&fs, inner2.nodeid), b"in");
}

#[test]
fn a_directory_renamed_into_new_lower_inodes_drops_every_descendants_fd() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_on(dir.path(), 64);
    let src = fs
        .mkdir(ROOT_ID, OsStr::new("src"), 0o755, Caller::ROOT)
        .unwrap();
    let sub = fs
        .mkdir(src.nodeid, OsStr::new("sub"), 0o755, Caller::ROOT)
        .unwrap();
    let (file, fh) = create(&fs, sub.nodeid, "file");
    fs.write(file.nodeid, fh, 0, b"x", None).unwrap();
    fs.release(file.nodeid, fh).unwrap();
    for id in [src.nodeid, sub.nodeid, file.nodeid] {
        cache_fd(&fs, id);
    }
    let other = fs
        .mkdir(ROOT_ID, OsStr::new("other"), 0o755, Caller::ROOT)
        .unwrap();
    cache_fd(&fs, other.nodeid);
    assert_eq!(fs.cached_fds(), 4);

    let renamed = rename_on_copying_lower(
        &fs,
        dir.path(),
        &["dst"],
        (ROOT_ID, "src"),
        (ROOT_ID, "dst"),
        0,
    );
    assert_eq!(renamed.stale, vec![(ROOT_ID, OsString::from("dst"))]);
    assert_eq!(
        fs.cached_fds(),
        1,
        "only the unrelated directory keeps its fd"
    );
    for id in [src.nodeid, sub.nodeid, file.nodeid] {
        assert_eq!(
            fs.getattr(id, None).unwrap_err().raw_errno(),
            libc::ESTALE,
            "{id}"
        );
    }
    assert_eq!(
        fs.getattr(other.nodeid, None).unwrap().st_mode & libc::S_IFMT,
        libc::S_IFDIR
    );
    let dst = fs.lookup(ROOT_ID, OsStr::new("dst")).unwrap();
    let sub2 = fs.lookup(dst.nodeid, OsStr::new("sub")).unwrap();
    let file2 = fs.lookup(sub2.nodeid, OsStr::new("file")).unwrap();
    assert!(![src.nodeid, sub.nodeid, file.nodeid].contains(&dst.nodeid));
    assert_ne!(file2.nodeid, file.nodeid);
    assert_eq!(read_all(&fs, file2.nodeid), b"x");
}

#[test]
fn exchange_keeps_both_identities_on_posix_and_drops_both_on_a_copying_lower() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), b"A").unwrap();
    std::fs::write(dir.path().join("b"), b"B").unwrap();
    let fs = fs_on(dir.path(), 64);
    let a = fs.lookup(ROOT_ID, OsStr::new("a")).unwrap();
    let b = fs.lookup(ROOT_ID, OsStr::new("b")).unwrap();
    let x = libc::RENAME_EXCHANGE;
    let r = fs
        .rename(ROOT_ID, OsStr::new("a"), ROOT_ID, OsStr::new("b"), x)
        .unwrap();
    assert!(r.stale.is_empty());
    assert_eq!(
        fs.lookup(ROOT_ID, OsStr::new("b")).unwrap().nodeid,
        a.nodeid
    );
    assert_eq!(
        fs.lookup(ROOT_ID, OsStr::new("a")).unwrap().nodeid,
        b.nodeid
    );
    assert_eq!(read_all(&fs, a.nodeid), b"A");

    let r = rename_on_copying_lower(
        &fs,
        dir.path(),
        &["a", "b"],
        (ROOT_ID, "a"),
        (ROOT_ID, "b"),
        x,
    );
    assert_eq!(
        r.stale,
        vec![
            (ROOT_ID, OsString::from("b")),
            (ROOT_ID, OsString::from("a"))
        ]
    );
    for old in [a.nodeid, b.nodeid] {
        assert_eq!(fs.getattr(old, None).unwrap_err().raw_errno(), libc::ESTALE);
    }
    let a2 = fs.lookup(ROOT_ID, OsStr::new("a")).unwrap();
    assert_eq!(read_all(&fs, a2.nodeid), b"A");
}

/// A rename onto an existing name drops drainfs's fds of what it replaces before the lower's
/// rename (gcsfuse keeps a replaced directory that is still referenced and then lists the new
/// one as empty), and the replaced inode loses the name.
#[test]
fn a_rename_holds_no_fd_of_what_it_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(fs_on(dir.path(), 64));
    let e = fs
        .mkdir(ROOT_ID, OsStr::new("e"), 0o755, Caller::ROOT)
        .unwrap();
    let s = fs
        .mkdir(ROOT_ID, OsStr::new("s"), 0o755, Caller::ROOT)
        .unwrap();
    let (file, fh) = create(&fs, s.nodeid, "file");
    fs.release(file.nodeid, fh).unwrap();
    let (keep, fh) = create(&fs, ROOT_ID, "keep");
    fs.release(keep.nodeid, fh).unwrap();
    for id in [e.nodeid, keep.nodeid] {
        cache_fd(&fs, id);
    }
    assert_eq!(fs.cached_fds(), 3, "e, keep and s (the parent of a create)");
    let during: Arc<Mutex<Option<usize>>> = Arc::default();
    {
        let (fs, during) = (Arc::clone(&fs), Arc::clone(&during));
        set_hook(move |point| {
            if point == Point::AfterLowerRename {
                *during.lock() = Some(fs.cached_fds());
            }
        });
    }
    let r = fs.rename(ROOT_ID, OsStr::new("s"), ROOT_ID, OsStr::new("e"), 0);
    clear_hook();
    assert!(
        r.unwrap().stale.is_empty(),
        "a POSIX lower keeps the moved identity"
    );
    assert_eq!(
        *during.lock(),
        Some(2),
        "e's fd was closed before the lower's rename"
    );
    assert_eq!(
        fs.getattr(e.nodeid, None).unwrap_err().raw_errno(),
        libc::ESTALE
    );
    assert_eq!(
        fs.lookup(ROOT_ID, OsStr::new("e")).unwrap().nodeid,
        s.nodeid
    );
    assert!(fs.lookup(s.nodeid, OsStr::new("file")).is_ok());
}

/// gcsfuse can give a name a new inode without drainfs: after a CREATE, its writes and its
/// FLUSHes, a LOOKUP of the object's newer generation mints a new gcsfuse inode. The kernel's
/// entry keeps the nodeid drainfs answered at CREATE (drainfs's `--ttl`), and a RENAME moves
/// that entry to the new name, although the lower's inode under the old name (what the rename
/// moves) was never known to drainfs. That nodeid must not keep its old name (gone after the
/// rename: the application's next open through the moved entry, which can come before the
/// kernel drops it, got `ENOENT` from the reopen by name) nor its cached fd (the old lower
/// inode): it is detached, so the open fails with ESTALE and the VFS looks the name up again.
#[test]
fn a_rename_detaches_the_nodeid_the_kernel_moves_when_the_lower_changed_it_before() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_on(dir.path(), 64);
    let (e, fh) = create(&fs, ROOT_ID, "f");
    fs.write(e.nodeid, fh, 0, b"one", None).unwrap();
    fs.release(e.nodeid, fh).unwrap();
    let (cached, fh) = create(&fs, ROOT_ID, "c");
    fs.write(cached.nodeid, fh, 0, b"cc", None).unwrap();
    fs.release(cached.nodeid, fh).unwrap();
    cache_fd(&fs, cached.nodeid);
    // The lower gives both names new inodes, the content unchanged (a POSIX lower then keeps
    // them through the rename: the moved identities are simply unknown to drainfs). `c` first:
    // its old inode stays referenced by the cached fd, and `f`'s is freed last, so neither new
    // inode can take an old one's number (which would name the old nodeid again).
    recreate_as_copies(dir.path(), "c");
    recreate_as_copies(dir.path(), "f");

    for (old, from, to, want) in [
        (e.nodeid, "f", "g", &b"one"[..]),
        (cached.nodeid, "c", "d", &b"cc"[..]),
    ] {
        let renamed = fs
            .rename(ROOT_ID, OsStr::new(from), ROOT_ID, OsStr::new(to), 0)
            .unwrap();
        assert_eq!(renamed.stale, vec![(ROOT_ID, OsString::from(to))]);
        assert_eq!(
            fs.open(old, libc::O_RDONLY, Caller::ROOT, None)
                .err()
                .map(|e| e.raw_errno()),
            Some(libc::ESTALE),
            "{from}: an open through the moved entry"
        );
        assert_eq!(
            fs.getattr(old, None).err().map(|e| e.raw_errno()),
            Some(libc::ESTALE),
            "{from}: a GETATTR through the moved entry"
        );
        let now = fs.lookup(ROOT_ID, OsStr::new(to)).unwrap();
        assert_ne!(now.nodeid, old);
        assert_eq!(read_all(&fs, now.nodeid), want);
    }
}

//! Core tests on a temp dir, without mounting.

use super::*;

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
    fs.rename(ROOT_ID, OsStr::new("a"), d.nodeid, OsStr::new("c"), 0)
        .unwrap();
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
/// call. Without them the lower refuses. Needs root to switch credentials (skipped otherwise).
#[test]
fn creates_use_the_callers_supplementary_groups() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return;
    }
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

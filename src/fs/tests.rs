//! Core tests on a temp dir, without mounting.

use super::*;

fn fs_on(dir: &Path, max_fds: usize) -> Fs {
    Fs::new(
        dir,
        CoreConfig {
            max_lower_fds: max_fds,
        },
        Accounting::new(),
        Admission::new(),
    )
    .unwrap()
}

fn create(fs: &Fs, parent: u64, name: &str) -> (Entry, u64) {
    let (e, o) = fs
        .create(parent, OsStr::new(name), 0o644, libc::O_RDWR, 0, 0, None)
        .unwrap();
    (e, o.fh)
}

#[test]
fn hard_links_share_a_nodeid_and_rename_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_on(dir.path(), 64);
    let (e, fh) = create(&fs, ROOT_ID, "a");
    assert_eq!(fs.write(e.nodeid, fh, 0, b"hello", false).unwrap(), 5);
    fs.release(e.nodeid, fh).unwrap();
    let l = fs.link(e.nodeid, ROOT_ID, OsStr::new("b")).unwrap();
    assert_eq!(l.nodeid, e.nodeid);
    assert_eq!(l.st.st_nlink, 2);
    let d = fs.mkdir(ROOT_ID, OsStr::new("d"), 0o755, 0, 0).unwrap();
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
    let d = fs.mkdir(ROOT_ID, OsStr::new("d"), 0o755, 0, 0).unwrap();
    create(&fs, d.nodeid, "f");
    assert_eq!(
        fs.unlink(ROOT_ID, OsStr::new("d"), true)
            .unwrap_err()
            .kind
            .errno(),
        Errno::ENOTEMPTY
    );
    assert_eq!(
        fs.mkdir(ROOT_ID, OsStr::new("d"), 0o755, 0, 0)
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
    assert_eq!(fs.write(e.nodeid, fh, 0, b"abc", false).unwrap(), 3);
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
            fs.mkdir(dirs[i / 4], OsStr::new(&format!("d{i}")), 0o755, 0, 0)
                .unwrap()
                .nodeid,
        );
    }
    for (i, d) in dirs.iter().enumerate() {
        let (e, fh) = create(&fs, *d, &format!("f{i}"));
        fs.release(e.nodeid, fh).unwrap();
        fs.setattr(e.nodeid, None, Some(0o600), None, None, None, None, false)
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
        fs.open(e.nodeid, libc::O_RDONLY, None)
            .err()
            .unwrap()
            .kind
            .errno(),
        Errno::ESHUTDOWN
    );
    assert_eq!(
        fs.mkdir(ROOT_ID, OsStr::new("x"), 0o755, 0, 0)
            .unwrap_err()
            .kind
            .errno(),
        Errno::ESHUTDOWN
    );
    assert_eq!(fs.write(e.nodeid, fh, 0, b"late", false).unwrap(), 4);
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

//! Every operation of the passthrough answered from the lower (lookup, attributes, names,
//! links, xattrs, directories, special files), on a real mount, in both `--passthrough always` and `--passthrough never`. Each test checks the
//! lower's contents and metadata after the operation and the exact errno of each failure.

#[macro_use]
mod common;

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use common::*;

both_modes!(
    lookup_and_getattr_report_the_lower,
    setattr_mode_owner_size_reach_the_lower,
    setattr_times_with_utime_now_and_omit,
    symlink_and_readlink,
    mknod_fifo_and_socket,
    mkdir_rmdir_unlink,
    rename_plain_noreplace_and_exchange,
    hard_link_shares_the_inode,
    open_and_create_flags,
    read_and_write_at_offsets,
    fsync_and_close_put_data_in_the_lower,
    readdir_lists_every_entry_with_its_type,
    statfs_is_the_lowers,
    xattrs_set_get_list_remove,
    fallocate_and_punch_hole,
    seek_data_and_seek_hole_on_a_sparse_file,
    copy_file_range_between_files_in_the_mount,
    lower_errnos_pass_through_unchanged,
    close_returns_the_lowers_flush_error,
);

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn lookup_and_getattr_report_the_lower(mode: &str) {
    let m = mount(mode, &[]);
    let lf = m.lower_path("f");
    fs::write(&lf, b"hello").unwrap();
    fs::set_permissions(&lf, Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(&lf, Some(1234), Some(5678)).unwrap();
    utimens(
        &lf,
        ts(1_000_000_000, 111),
        ts(1_200_000_000, 222_333_444),
        false,
    )
    .unwrap();
    fs::create_dir_all(m.lower_path("d/sub")).unwrap();

    let lower = fs::symlink_metadata(&lf).unwrap();
    let st = fs::symlink_metadata(m.path("f")).unwrap();
    assert!(st.file_type().is_file());
    assert_eq!(st.len(), 5);
    assert_eq!(st.mode(), libc::S_IFREG | 0o640);
    assert_eq!((st.uid(), st.gid()), (1234, 5678));
    assert_eq!(st.nlink(), 1);
    assert_eq!((st.mtime(), st.mtime_nsec()), (1_200_000_000, 222_333_444));
    assert_eq!((st.atime(), st.atime_nsec()), (1_000_000_000, 111));
    assert_eq!(
        (st.ctime(), st.ctime_nsec()),
        (lower.ctime(), lower.ctime_nsec())
    );
    assert_eq!(st.blocks(), lower.blocks());

    let d = fs::symlink_metadata(m.path("d")).unwrap();
    assert!(d.is_dir());
    assert_eq!(d.nlink(), 3, "a directory with one subdirectory");
    let root = fs::metadata(m.path("")).unwrap();
    assert_eq!(root.mode(), fs::metadata(&m.lower).unwrap().mode());

    assert_errno(
        fs::metadata(m.path("missing")),
        libc::ENOENT,
        "stat missing",
    );
    assert_errno(
        fs::metadata(m.path("d/missing/x")),
        libc::ENOENT,
        "stat in missing",
    );
    assert_errno(
        fs::metadata(m.path("f/x")),
        libc::ENOTDIR,
        "stat under a file",
    );
}

fn setattr_mode_owner_size_reach_the_lower(mode: &str) {
    let m = mount(mode, &[]);
    let (f, lf) = (m.path("f"), m.lower_path("f"));
    fs::write(&f, b"hello world").unwrap();

    fs::set_permissions(&f, Permissions::from_mode(0o604)).unwrap();
    assert_eq!(fs::metadata(&lf).unwrap().mode() & 0o7777, 0o604);
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o604);
    // chmod through a directory too.
    fs::create_dir(m.path("d")).unwrap();
    fs::set_permissions(m.path("d"), Permissions::from_mode(0o710)).unwrap();
    assert_eq!(
        fs::metadata(m.lower_path("d")).unwrap().mode() & 0o7777,
        0o710
    );

    std::os::unix::fs::chown(&f, Some(1234), Some(5678)).unwrap();
    let l = fs::metadata(&lf).unwrap();
    assert_eq!((l.uid(), l.gid()), (1234, 5678));
    std::os::unix::fs::chown(&f, None, Some(42)).unwrap();
    let l = fs::metadata(&lf).unwrap();
    assert_eq!((l.uid(), l.gid()), (1234, 42), "uid -1 leaves the owner");
    let st = fs::metadata(&f).unwrap();
    assert_eq!((st.uid(), st.gid()), (1234, 42));
    // chown of a symlink itself (lchown) leaves its target alone.
    std::os::unix::fs::symlink("f", m.path("l")).unwrap();
    std::os::unix::fs::lchown(m.path("l"), Some(7), Some(8)).unwrap();
    let ll = fs::symlink_metadata(m.lower_path("l")).unwrap();
    assert_eq!((ll.uid(), ll.gid()), (7, 8));
    assert_eq!(fs::metadata(&lf).unwrap().uid(), 1234);

    // truncate(2) by path: SETATTR without a file handle.
    truncate(&f, 5).unwrap();
    assert_eq!(fs::read(&lf).unwrap(), b"hello");
    truncate(&f, 8).unwrap();
    assert_eq!(fs::read(&lf).unwrap(), b"hello\0\0\0");
    assert_eq!(fs::metadata(&f).unwrap().len(), 8);
    // ftruncate(2): SETATTR with the writer's handle.
    let w = OpenOptions::new().write(true).open(&f).unwrap();
    w.set_len(2).unwrap();
    assert_eq!(fs::read(&lf).unwrap(), b"he");
    assert_eq!(w.metadata().unwrap().len(), 2);
    drop(w);
    assert_eq!(fs::read(&f).unwrap(), b"he");
    assert_errno(
        truncate(m.path("d").as_path(), 0),
        libc::EISDIR,
        "truncate a dir",
    );
}

fn setattr_times_with_utime_now_and_omit(mode: &str) {
    let m = mount(mode, &[]);
    let (f, lf) = (m.path("f"), m.lower_path("f"));
    fs::write(&f, b"x").unwrap();
    let times = |p: &Path| {
        let s = fs::symlink_metadata(p).unwrap();
        ((s.atime(), s.atime_nsec()), (s.mtime(), s.mtime_nsec()))
    };

    utimens(
        &f,
        ts(1_000_000_000, 123_456_789),
        ts(1_500_000_000, 987_654_321),
        false,
    )
    .unwrap();
    let want = ((1_000_000_000, 123_456_789), (1_500_000_000, 987_654_321));
    assert_eq!(times(&lf), want);
    assert_eq!(times(&f), want);

    // UTIME_OMIT keeps atime, UTIME_NOW sets mtime to the lower's now.
    let before = now_secs();
    utimens(&f, omit_ts(), now_ts(), false).unwrap();
    let after = now_secs();
    let ((a, an), (mt, _)) = times(&lf);
    assert_eq!((a, an), (1_000_000_000, 123_456_789), "atime omitted");
    assert!(
        (before - 1..=after + 1).contains(&mt),
        "mtime {mt} not now ({before}..{after})"
    );
    let mtime_now = times(&lf).1;

    // And the other way round.
    utimens(&f, now_ts(), omit_ts(), false).unwrap();
    let ((a, _), m2) = times(&lf);
    assert!(
        (before - 1..=now_secs() + 1).contains(&a),
        "atime {a} not now"
    );
    assert_eq!(m2, mtime_now, "mtime omitted");
    assert_eq!(times(&f), times(&lf));

    // futimens through an open fd.
    let file = File::open(&f).unwrap();
    let ft = [ts(1_100_000_000, 5), ts(1_100_000_000, 6)];
    // SAFETY: `file` is open for this call and `ft` points at two timespecs.
    let r = unsafe { libc::futimens(std::os::fd::AsRawFd::as_raw_fd(&file), ft.as_ptr()) };
    assert_eq!(r, 0);
    assert_eq!(times(&lf), ((1_100_000_000, 5), (1_100_000_000, 6)));

    // AT_SYMLINK_NOFOLLOW sets the link's own times, not its target's.
    std::os::unix::fs::symlink("f", m.path("l")).unwrap();
    utimens(&m.path("l"), ts(900_000_000, 1), ts(900_000_000, 2), true).unwrap();
    assert_eq!(
        times(&m.lower_path("l")),
        ((900_000_000, 1), (900_000_000, 2))
    );
    assert_eq!(times(&lf), ((1_100_000_000, 5), (1_100_000_000, 6)));
    assert_errno(
        utimens(&m.path("missing"), now_ts(), now_ts(), false),
        libc::ENOENT,
        "utimens missing",
    );
}

fn symlink_and_readlink(mode: &str) {
    let m = mount(mode, &[]);
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/inner"), b"inner").unwrap();

    std::os::unix::fs::symlink("target/of/link", m.path("l")).unwrap();
    assert_eq!(
        fs::read_link(m.lower_path("l")).unwrap().as_os_str(),
        "target/of/link"
    );
    assert_eq!(
        fs::read_link(m.path("l")).unwrap().as_os_str(),
        "target/of/link"
    );
    assert!(
        fs::symlink_metadata(m.lower_path("l"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(
        fs::symlink_metadata(m.path("l"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_errno(
        fs::metadata(m.path("l")),
        libc::ENOENT,
        "stat a dangling link",
    );

    // A long target survives the round trip both ways.
    let long = "x/".repeat(1500) + "end";
    std::os::unix::fs::symlink(&long, m.path("long")).unwrap();
    assert_eq!(
        fs::read_link(m.lower_path("long")).unwrap().as_os_str(),
        long.as_str()
    );
    assert_eq!(
        fs::read_link(m.path("long")).unwrap().as_os_str(),
        long.as_str()
    );

    // A link made on the lower is followed through the mount, to a file and to a directory.
    std::os::unix::fs::symlink("d/inner", m.lower_path("to_file")).unwrap();
    std::os::unix::fs::symlink("d", m.lower_path("to_dir")).unwrap();
    assert_eq!(fs::read(m.path("to_file")).unwrap(), b"inner");
    assert_eq!(fs::read(m.path("to_dir/inner")).unwrap(), b"inner");
    assert_eq!(fs::read_link(m.path("to_dir")).unwrap().as_os_str(), "d");

    assert_errno(
        fs::read_link(m.path("d/inner")),
        libc::EINVAL,
        "readlink a file",
    );
    assert_errno(
        std::os::unix::fs::symlink("x", m.path("d/inner")),
        libc::EEXIST,
        "symlink onto a file",
    );
}

fn mknod_fifo_and_socket(mode: &str) {
    let m = mount(mode, &[]);

    mknod(&m.path("p"), libc::S_IFIFO | 0o640, 0).unwrap();
    let l = fs::symlink_metadata(m.lower_path("p")).unwrap();
    assert!(l.file_type().is_fifo());
    assert_eq!(l.mode() & 0o777, 0o640);
    assert!(
        fs::symlink_metadata(m.path("p"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    // The fifo works through the mount.
    let p = m.path("p");
    let writer = std::thread::spawn(move || fs::write(p, b"through the fifo").unwrap());
    assert_eq!(fs::read(m.path("p")).unwrap(), b"through the fifo");
    writer.join().unwrap();

    mknod(&m.path("s"), libc::S_IFSOCK | 0o600, 0).unwrap();
    assert!(
        fs::symlink_metadata(m.lower_path("s"))
            .unwrap()
            .file_type()
            .is_socket()
    );
    assert!(
        fs::symlink_metadata(m.path("s"))
            .unwrap()
            .file_type()
            .is_socket()
    );

    // bind(2) creates the socket inode through MKNOD; connecting through the mount works.
    let listener = UnixListener::bind(m.path("sock")).unwrap();
    assert!(
        fs::symlink_metadata(m.lower_path("sock"))
            .unwrap()
            .file_type()
            .is_socket()
    );
    let mut c = UnixStream::connect(m.path("sock")).unwrap();
    let (mut s, _) = listener.accept().unwrap();
    c.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");

    // mknod of a regular file.
    mknod(&m.path("r"), libc::S_IFREG | 0o600, 0).unwrap();
    let r = fs::symlink_metadata(m.lower_path("r")).unwrap();
    assert!(r.is_file());
    assert_eq!(r.len(), 0);

    assert_errno(
        mknod(&m.path("p"), libc::S_IFIFO | 0o600, 0),
        libc::EEXIST,
        "mknod onto a fifo",
    );
    assert_errno(
        mknod(&m.path("missing/p"), libc::S_IFIFO | 0o600, 0),
        libc::ENOENT,
        "mknod in a missing dir",
    );
}

fn mkdir_rmdir_unlink(mode: &str) {
    let m = mount(mode, &[]);
    fs::DirBuilder::new()
        .mode(0o750)
        .create(m.path("d"))
        .unwrap();
    let l = fs::metadata(m.lower_path("d")).unwrap();
    assert!(l.is_dir());
    assert_eq!(l.mode() & 0o777, 0o750);
    assert_errno(fs::create_dir(m.path("d")), libc::EEXIST, "mkdir twice");
    assert_errno(
        fs::create_dir(m.path("missing/x")),
        libc::ENOENT,
        "mkdir in missing",
    );
    fs::write(m.path("f"), b"f").unwrap();
    assert_errno(
        fs::create_dir(m.path("f/x")),
        libc::ENOTDIR,
        "mkdir under a file",
    );

    fs::write(m.path("d/child"), b"c").unwrap();
    assert_errno(
        fs::remove_dir(m.path("d")),
        libc::ENOTEMPTY,
        "rmdir non-empty",
    );
    assert!(
        m.lower_path("d/child").exists(),
        "failed rmdir removed nothing"
    );
    assert_errno(fs::remove_file(m.path("d")), libc::EISDIR, "unlink a dir");
    assert_errno(fs::remove_dir(m.path("f")), libc::ENOTDIR, "rmdir a file");
    assert_errno(
        fs::remove_file(m.path("nope")),
        libc::ENOENT,
        "unlink missing",
    );
    assert_errno(
        fs::remove_dir(m.path("nope")),
        libc::ENOENT,
        "rmdir missing",
    );

    fs::remove_file(m.path("d/child")).unwrap();
    assert!(!m.lower_path("d/child").exists());
    assert_errno(fs::metadata(m.path("d/child")), libc::ENOENT, "unlinked");
    fs::remove_dir(m.path("d")).unwrap();
    assert!(!m.lower_path("d").exists());
    assert_errno(fs::metadata(m.path("d")), libc::ENOENT, "removed dir");
    // Removing something made on the lower behind drainfs's back.
    fs::create_dir(m.lower_path("e")).unwrap();
    fs::write(m.lower_path("e/g"), b"g").unwrap();
    fs::remove_file(m.path("e/g")).unwrap();
    fs::remove_dir(m.path("e")).unwrap();
    assert!(!m.lower_path("e").exists());
}

fn rename_plain_noreplace_and_exchange(mode: &str) {
    let m = mount(mode, &[]);
    let p = |s: &str| m.path(s);
    let l = |s: &str| m.lower_path(s);
    fs::write(p("a"), b"A").unwrap();
    let ino_a = fs::metadata(p("a")).unwrap().ino();

    fs::rename(p("a"), p("b")).unwrap();
    assert!(!l("a").exists());
    assert_eq!(fs::read(l("b")).unwrap(), b"A");
    assert_eq!(fs::metadata(p("b")).unwrap().ino(), ino_a);
    assert_errno(fs::metadata(p("a")), libc::ENOENT, "old name");

    // Across directories, replacing an existing file.
    fs::create_dir(p("d")).unwrap();
    fs::write(p("d/c"), b"old C").unwrap();
    fs::rename(p("b"), p("d/c")).unwrap();
    assert_eq!(fs::read(l("d/c")).unwrap(), b"A");
    assert_eq!(fs::metadata(p("d/c")).unwrap().ino(), ino_a);

    // RENAME_NOREPLACE.
    fs::write(p("x"), b"X").unwrap();
    assert_errno(
        renameat2(&p("x"), &p("d/c"), libc::RENAME_NOREPLACE),
        libc::EEXIST,
        "NOREPLACE onto a file",
    );
    assert_eq!(fs::read(l("x")).unwrap(), b"X");
    assert_eq!(fs::read(l("d/c")).unwrap(), b"A");
    renameat2(&p("x"), &p("y"), libc::RENAME_NOREPLACE).unwrap();
    assert_eq!(fs::read(l("y")).unwrap(), b"X");
    assert!(!l("x").exists());

    // RENAME_EXCHANGE swaps the two names; each inode keeps its st_ino.
    let ino_y = fs::metadata(p("y")).unwrap().ino();
    renameat2(&p("y"), &p("d/c"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(l("y")).unwrap(), b"A");
    assert_eq!(fs::read(l("d/c")).unwrap(), b"X");
    assert_eq!(fs::read(p("y")).unwrap(), b"A");
    assert_eq!(fs::read(p("d/c")).unwrap(), b"X");
    assert_eq!(fs::metadata(p("y")).unwrap().ino(), ino_a);
    assert_eq!(fs::metadata(p("d/c")).unwrap().ino(), ino_y);
    // A file and a directory can be exchanged.
    fs::create_dir(p("e")).unwrap();
    fs::write(p("e/inside"), b"i").unwrap();
    renameat2(&p("e"), &p("y"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(l("y/inside")).unwrap(), b"i");
    assert_eq!(fs::read(l("e")).unwrap(), b"A");
    assert_eq!(fs::read(p("y/inside")).unwrap(), b"i");
    assert_errno(
        renameat2(&p("e"), &p("missing"), libc::RENAME_EXCHANGE),
        libc::ENOENT,
        "EXCHANGE with a missing name",
    );

    // The lower's refusals.
    fs::create_dir(p("full")).unwrap();
    fs::write(p("full/f"), b"").unwrap();
    fs::create_dir(p("empty")).unwrap();
    assert_errno(
        fs::rename(p("empty"), p("full")),
        libc::ENOTEMPTY,
        "onto non-empty dir",
    );
    assert_errno(fs::rename(p("e"), p("full")), libc::EISDIR, "file onto dir");
    assert_errno(
        fs::rename(p("empty"), p("e")),
        libc::ENOTDIR,
        "dir onto file",
    );
    assert_errno(
        fs::rename(p("nope"), p("z")),
        libc::ENOENT,
        "missing source",
    );
    // A directory onto an empty directory replaces it.
    fs::rename(p("full"), p("empty")).unwrap();
    assert!(l("empty/f").exists());
    assert!(!l("full").exists());
    assert!(p("empty/f").exists());
}

fn hard_link_shares_the_inode(mode: &str) {
    let m = mount(mode, &[]);
    fs::write(m.path("f"), b"one").unwrap();
    fs::create_dir(m.path("d")).unwrap();
    fs::hard_link(m.path("f"), m.path("d/g")).unwrap();

    let (f, g) = (
        fs::metadata(m.path("f")).unwrap(),
        fs::metadata(m.path("d/g")).unwrap(),
    );
    assert_eq!(f.ino(), g.ino(), "one nodeid for both names");
    assert_eq!((f.nlink(), g.nlink()), (2, 2));
    let (lf, lg) = (
        fs::metadata(m.lower_path("f")).unwrap(),
        fs::metadata(m.lower_path("d/g")).unwrap(),
    );
    assert_eq!(lf.ino(), lg.ino(), "a real hard link on the lower");
    assert_eq!(lf.nlink(), 2);

    // Data written through one name is read through the other.
    OpenOptions::new()
        .append(true)
        .open(m.path("d/g"))
        .unwrap()
        .write_all(b" two")
        .unwrap();
    assert_eq!(fs::read(m.path("f")).unwrap(), b"one two");
    assert_eq!(fs::read(m.lower_path("f")).unwrap(), b"one two");

    fs::remove_file(m.path("f")).unwrap();
    assert_eq!(fs::metadata(m.path("d/g")).unwrap().nlink(), 1);
    assert_eq!(fs::read(m.path("d/g")).unwrap(), b"one two");

    assert_errno(
        fs::hard_link(m.path("d/g"), m.path("d/g")),
        libc::EEXIST,
        "link onto an existing name",
    );
    assert_errno(
        fs::hard_link(m.path("d"), m.path("d2")),
        libc::EPERM,
        "link a directory",
    );
    assert_errno(
        fs::hard_link(m.path("missing"), m.path("x")),
        libc::ENOENT,
        "link a missing file",
    );
}

fn open_and_create_flags(mode: &str) {
    let m = mount(mode, &[]);
    let f = m.path("f");
    let file = open(&f, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o640).unwrap();
    let l = fs::metadata(m.lower_path("f")).unwrap();
    assert!(l.is_file());
    assert_eq!(l.mode() & 0o777, 0o640);
    assert_eq!(l.len(), 0);
    file.write_all_at(b"content", 0).unwrap();
    close(file).unwrap();
    assert_errno(
        open(&f, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o600),
        libc::EEXIST,
        "O_EXCL on an existing file",
    );
    assert_eq!(fs::read(m.lower_path("f")).unwrap(), b"content");

    // O_CREAT without O_EXCL opens the existing file; O_TRUNC empties it on the lower.
    let same = open(&f, libc::O_CREAT | libc::O_RDWR, 0o600).unwrap();
    assert_eq!(pread(&same, 0, 100), b"content");
    drop(same);
    close(open(&f, libc::O_WRONLY | libc::O_TRUNC, 0).unwrap()).unwrap();
    assert_eq!(fs::metadata(m.lower_path("f")).unwrap().len(), 0);
    assert_eq!(fs::metadata(&f).unwrap().len(), 0);

    fs::create_dir(m.path("d")).unwrap();
    std::os::unix::fs::symlink("f", m.path("l")).unwrap();
    assert_errno(
        open(&m.path("nope"), libc::O_RDONLY, 0),
        libc::ENOENT,
        "open missing",
    );
    assert_errno(
        open(&m.path("d"), libc::O_WRONLY, 0),
        libc::EISDIR,
        "write-open a dir",
    );
    assert_errno(
        open(&m.path("f/x"), libc::O_RDONLY, 0),
        libc::ENOTDIR,
        "open under a file",
    );
    assert_errno(
        open(&f, libc::O_RDONLY | libc::O_DIRECTORY, 0),
        libc::ENOTDIR,
        "O_DIRECTORY on a file",
    );
    assert_errno(
        open(&m.path("l"), libc::O_RDONLY | libc::O_NOFOLLOW, 0),
        libc::ELOOP,
        "O_NOFOLLOW on a link",
    );
    assert_errno(
        open(
            &m.path(&"n".repeat(256)),
            libc::O_CREAT | libc::O_WRONLY,
            0o600,
        ),
        libc::ENAMETOOLONG,
        "256-byte name",
    );
    // 255 bytes is fine.
    let longest = "n".repeat(255);
    fs::write(m.path(&longest), b"ok").unwrap();
    assert_eq!(fs::read(m.lower_path(&longest)).unwrap(), b"ok");

    // A directory opened read-only works (OPENDIR), and reading it is EISDIR.
    let mut dir = File::open(m.path("d")).unwrap();
    let mut buf = [0u8; 8];
    assert_errno(dir.read(&mut buf), libc::EISDIR, "read(2) a directory");
}

fn read_and_write_at_offsets(mode: &str) {
    let m = mount(mode, &[]);
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.path("f"))
        .unwrap();
    f.write_all_at(b"0123456789", 0).unwrap();
    f.write_all_at(b"abc", 3).unwrap();
    f.write_all_at(b"XY", 20).unwrap();
    let want = b"012abc6789\0\0\0\0\0\0\0\0\0\0XY";
    assert_eq!(pread(&f, 0, 100), want);
    assert_eq!(pread(&f, 5, 3), b"c67");
    assert_eq!(pread(&f, 22, 10), b"", "read at EOF returns 0");
    assert_eq!(fs::read(m.lower_path("f")).unwrap(), want);
    assert_eq!(f.metadata().unwrap().len(), 22);

    // A big write and read, crossing MAX_IO (1 MiB) boundaries at odd offsets.
    let data = pattern(7, 5 * (1 << 20) + 123);
    f.write_all_at(&data, 4097).unwrap();
    assert_eq!(pread(&f, 4097, data.len()), data);
    let lower = fs::read(m.lower_path("f")).unwrap();
    assert_eq!(lower.len(), 4097 + data.len());
    assert_eq!(&lower[4097..], &data[..]);
    assert_eq!(&lower[..22], want);

    // Data written on the lower is read through the mount by a new open.
    fs::write(m.lower_path("g"), b"from the lower").unwrap();
    assert_eq!(fs::read(m.path("g")).unwrap(), b"from the lower");
    // A read-only fd refuses writes (EBADF from the kernel).
    let r = File::open(m.path("g")).unwrap();
    assert_errno(r.write_at(b"x", 0), libc::EBADF, "write on O_RDONLY");
}

fn fsync_and_close_put_data_in_the_lower(mode: &str) {
    let m = mount(mode, &[]);
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(m.path("f"))
        .unwrap();
    f.write_all_at(b"synced", 0).unwrap();
    f.sync_all().unwrap();
    assert_eq!(fs::read(m.lower_path("f")).unwrap(), b"synced");
    f.write_all_at(b" data", 6).unwrap();
    f.sync_data().unwrap();
    assert_eq!(fs::read(m.lower_path("f")).unwrap(), b"synced data");
    f.write_all_at(b"!", 11).unwrap();
    // close(2) returns 0 and the data is in the lower the moment it returns.
    close(f).unwrap();
    assert_eq!(fs::read(m.lower_path("f")).unwrap(), b"synced data!");

    // fsync on a directory (FSYNCDIR).
    fs::create_dir(m.path("d")).unwrap();
    File::open(m.path("d")).unwrap().sync_all().unwrap();
    // fsync of a read-only fd is allowed too.
    File::open(m.path("f")).unwrap().sync_all().unwrap();

    // Many small files, each closed and checked right away.
    for i in 0..50 {
        let p = m.path(&format!("small-{i}"));
        let f = File::create(&p).unwrap();
        f.write_all_at(format!("payload {i}").as_bytes(), 0)
            .unwrap();
        close(f).unwrap();
        assert_eq!(
            fs::read(m.lower_path(&format!("small-{i}"))).unwrap(),
            format!("payload {i}").as_bytes()
        );
    }
}

fn readdir_lists_every_entry_with_its_type(mode: &str) {
    let m = mount(mode, &[]);
    fs::create_dir(m.path("d")).unwrap();
    let mut want = std::collections::BTreeMap::new();
    for i in 0..300 {
        let name = format!("file-{i:03}");
        fs::write(m.path(&format!("d/{name}")), b"").unwrap();
        want.insert(name, "file");
    }
    fs::create_dir(m.path("d/sub")).unwrap();
    want.insert("sub".into(), "dir");
    std::os::unix::fs::symlink("file-000", m.path("d/link")).unwrap();
    want.insert("link".into(), "symlink");
    mknod(&m.path("d/fifo"), libc::S_IFIFO | 0o600, 0).unwrap();
    want.insert("fifo".into(), "fifo");
    // Entries made on the lower directly, unknown to drainfs until listed.
    for i in 0..300 {
        let name = format!("lower-{i:03}");
        fs::write(m.lower_path(&format!("d/{name}")), b"").unwrap();
        want.insert(name, "file");
    }

    // Listed twice: a second opendir must see the same.
    for round in 0..2 {
        let mut got = std::collections::BTreeMap::new();
        for e in fs::read_dir(m.path("d")).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            let kind = if t.is_dir() {
                "dir"
            } else if t.is_symlink() {
                "symlink"
            } else if t.is_fifo() {
                "fifo"
            } else {
                "file"
            };
            let name = e.file_name().into_string().unwrap();
            assert!(
                got.insert(name.clone(), kind).is_none(),
                "round {round}: {name} listed twice"
            );
        }
        assert_eq!(got, want, "round {round}");
    }

    // Every name listed can be stat'ed, with the type readdir gave.
    for (name, kind) in &want {
        let st = fs::symlink_metadata(m.path(&format!("d/{name}"))).unwrap();
        let t = st.file_type();
        let k = if t.is_dir() {
            "dir"
        } else if t.is_symlink() {
            "symlink"
        } else if t.is_fifo() {
            "fifo"
        } else {
            "file"
        };
        assert_eq!(k, *kind, "{name}");
    }

    // "." and ".." through the raw interface, and ENOTDIR for a file.
    let d = nix::dir::Dir::open(
        &m.path("d"),
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    let names: Vec<String> = d
        .into_iter()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n == "."));
    assert!(names.iter().any(|n| n == ".."));
    assert_eq!(names.len(), want.len() + 2);
    assert_errno(
        fs::read_dir(m.path("d/file-000")),
        libc::ENOTDIR,
        "opendir a file",
    );
    // An empty directory lists nothing.
    assert_eq!(fs::read_dir(m.path("d/sub")).unwrap().count(), 0);
}

fn statfs_is_the_lowers(mode: &str) {
    let m = mount(mode, &[]);
    let (s, l) = (statvfs(&m.path("")).unwrap(), statvfs(&m.lower).unwrap());
    assert_eq!(s.f_bsize, l.f_bsize);
    assert_eq!(s.f_frsize, l.f_frsize);
    assert_eq!(s.f_blocks, l.f_blocks);
    assert_eq!(s.f_files, l.f_files);
    assert_eq!(s.f_namemax, l.f_namemax);
    // Free counts move with other tests writing to the same disk: close, not equal.
    let near = |a: u64, b: u64| a.abs_diff(b) <= b / 100 + 1024;
    assert!(near(s.f_bfree, l.f_bfree), "{} vs {}", s.f_bfree, l.f_bfree);
    assert!(
        near(s.f_bavail, l.f_bavail),
        "{} vs {}",
        s.f_bavail,
        l.f_bavail
    );
    assert!(near(s.f_ffree, l.f_ffree), "{} vs {}", s.f_ffree, l.f_ffree);
    // Through a subdirectory and a file, the same filesystem.
    fs::create_dir(m.path("d")).unwrap();
    assert_eq!(statvfs(&m.path("d")).unwrap().f_blocks, l.f_blocks);
}

fn xattrs_set_get_list_remove(mode: &str) {
    let m = mount(mode, &[]);
    let (f, lf) = (m.path("f"), m.lower_path("f"));
    fs::write(&f, b"x").unwrap();
    let value: Vec<u8> = (0..=255u8).cycle().take(1000).collect();

    setxattr(&f, "user.a", &value, 0).unwrap();
    setxattr(&f, "user.b", b"", 0).unwrap();
    assert_eq!(getxattr(&lf, "user.a").unwrap(), value, "on the lower");
    assert_eq!(getxattr(&f, "user.a").unwrap(), value);
    assert_eq!(getxattr(&f, "user.b").unwrap(), b"");
    assert_eq!(
        getxattr_sized(&f, "user.a", 0).unwrap().0,
        1000,
        "size query"
    );
    assert_errno(
        getxattr_sized(&f, "user.a", 10),
        libc::ERANGE,
        "buffer too small",
    );
    let mut names = listxattr(&f).unwrap();
    names.retain(|n| n.starts_with("user."));
    names.sort();
    assert_eq!(names, ["user.a", "user.b"]);

    assert_errno(
        setxattr(&f, "user.a", b"v", libc::XATTR_CREATE),
        libc::EEXIST,
        "XATTR_CREATE on an existing name",
    );
    assert_errno(
        setxattr(&f, "user.c", b"v", libc::XATTR_REPLACE),
        libc::ENODATA,
        "XATTR_REPLACE on a missing name",
    );
    setxattr(&f, "user.a", b"replaced", libc::XATTR_REPLACE).unwrap();
    assert_eq!(getxattr(&lf, "user.a").unwrap(), b"replaced");

    removexattr(&f, "user.a").unwrap();
    assert_errno(getxattr(&f, "user.a"), libc::ENODATA, "get after remove");
    assert_errno(getxattr(&lf, "user.a"), libc::ENODATA, "gone on the lower");
    assert_errno(removexattr(&f, "user.a"), libc::ENODATA, "remove twice");
    let names = listxattr(&f).unwrap();
    assert!(names.iter().any(|n| n == "user.b"));
    assert!(!names.iter().any(|n| n == "user.a"));

    // On a directory too, and an xattr set on the lower is read through the mount.
    fs::create_dir(m.path("d")).unwrap();
    setxattr(&m.path("d"), "user.dir", b"yes", 0).unwrap();
    assert_eq!(getxattr(&m.lower_path("d"), "user.dir").unwrap(), b"yes");
    setxattr(&m.lower_path("d"), "user.below", b"set below", 0).unwrap();
    assert_eq!(getxattr(&m.path("d"), "user.below").unwrap(), b"set below");
    assert_errno(
        getxattr(&m.path("missing"), "user.a"),
        libc::ENOENT,
        "xattr of a missing file",
    );
}

fn fallocate_and_punch_hole(mode: &str) {
    let m = mount(mode, &[]);
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.path("f"))
        .unwrap();
    let lower = |m: &Mounted| fs::metadata(m.lower_path("f")).unwrap();

    fallocate(&f, 0, 0, 1 << 20).unwrap();
    assert_eq!(lower(&m).len(), 1 << 20);
    assert!(
        lower(&m).blocks() >= 2048,
        "allocated: {}",
        lower(&m).blocks()
    );
    assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    assert_eq!(pread(&f, 0, 4096), vec![0u8; 4096]);

    // KEEP_SIZE allocates past EOF without changing the size.
    let before = lower(&m).blocks();
    fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 1 << 20, 1 << 20).unwrap();
    assert_eq!(lower(&m).len(), 1 << 20);
    assert!(lower(&m).blocks() >= before + 2048);

    // PUNCH_HOLE frees the range; it reads as zeros, the size is kept.
    f.write_all_at(&vec![0xab; 1 << 20], 0).unwrap();
    let before = lower(&m).blocks();
    fallocate(
        &f,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        64 << 10,
        64 << 10,
    )
    .unwrap();
    assert_eq!(lower(&m).len(), 1 << 20);
    assert_eq!(
        lower(&m).blocks(),
        before - 128,
        "64 KiB freed on the lower"
    );
    let through = pread(&f, 0, 1 << 20);
    let on_lower = fs::read(m.lower_path("f")).unwrap();
    for (what, data) in [("mount", &through), ("lower", &on_lower)] {
        assert!(data[..64 << 10].iter().all(|b| *b == 0xab), "{what}");
        assert!(data[64 << 10..128 << 10].iter().all(|b| *b == 0), "{what}");
        assert!(data[128 << 10..].iter().all(|b| *b == 0xab), "{what}");
    }
    assert_errno(
        fallocate(&f, libc::FALLOC_FL_PUNCH_HOLE, 0, 4096),
        libc::EOPNOTSUPP,
        "PUNCH_HOLE without KEEP_SIZE",
    );
    let r = File::open(m.path("f")).unwrap();
    assert_errno(
        fallocate(&r, 0, 0, 4096),
        libc::EBADF,
        "fallocate read-only",
    );
}

fn seek_data_and_seek_hole_on_a_sparse_file(mode: &str) {
    let m = mount(mode, &[]);
    const MIB: i64 = 1 << 20;
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.path("sparse"))
        .unwrap();
    f.write_all_at(&[b'a'; 4096], 0).unwrap();
    f.write_all_at(&[b'b'; 4096], MIB as u64).unwrap();
    f.set_len(3 * MIB as u64).unwrap();
    f.sync_all().unwrap();

    let lf = File::open(m.lower_path("sparse")).unwrap();
    let cases = [
        (0, libc::SEEK_DATA, Ok(0)),
        (0, libc::SEEK_HOLE, Ok(4096)),
        (4096, libc::SEEK_DATA, Ok(MIB)),
        (MIB + 10, libc::SEEK_DATA, Ok(MIB + 10)),
        (MIB, libc::SEEK_HOLE, Ok(MIB + 4096)),
        (MIB + 4096, libc::SEEK_DATA, Err(libc::ENXIO)),
        (2 * MIB, libc::SEEK_HOLE, Ok(2 * MIB)),
        (3 * MIB, libc::SEEK_HOLE, Err(libc::ENXIO)),
        (5 * MIB, libc::SEEK_DATA, Err(libc::ENXIO)),
    ];
    for (off, whence, want) in cases {
        let what = format!(
            "lseek({off}, {})",
            if whence == libc::SEEK_DATA {
                "SEEK_DATA"
            } else {
                "SEEK_HOLE"
            }
        );
        let on_lower = lseek(&lf, off, whence).map_err(|e| e.raw_os_error().unwrap());
        assert_eq!(on_lower, want, "{what} on the lower (test assumption)");
        let through = lseek(&f, off, whence).map_err(|e| e.raw_os_error().unwrap());
        assert_eq!(through, want, "{what} through the mount");
    }
    assert_eq!(lseek(&f, 0, libc::SEEK_END).unwrap(), 3 * MIB);
    assert_eq!(pread(&f, MIB as u64 - 2, 4), b"\0\0bb");
    assert_eq!(fs::metadata(m.path("sparse")).unwrap().blocks(), 16);
}

fn copy_file_range_between_files_in_the_mount(mode: &str) {
    let m = mount(mode, &[]);
    let data = pattern(11, 1 << 20);
    fs::write(m.path("src"), &data).unwrap();
    let src = File::open(m.path("src")).unwrap();
    let dst = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.path("dst"))
        .unwrap();
    let mut done = 0;
    while done < 65536 {
        let n = copy_file_range(&src, 4096 + done as i64, &dst, done as i64, 65536 - done).unwrap();
        assert!(n > 0, "short copy");
        done += n;
    }
    assert_eq!(
        fs::read(m.lower_path("dst")).unwrap(),
        &data[4096..4096 + 65536]
    );
    assert_eq!(pread(&dst, 0, 1 << 20), &data[4096..4096 + 65536]);
    // Into the middle of the destination, from a source offset at EOF (copies nothing).
    let n = copy_file_range(&src, 1 << 20, &dst, 10, 100).unwrap();
    assert_eq!(n, 0, "copy from EOF");
    let n = copy_file_range(&src, 0, &dst, 100, 10).unwrap();
    assert_eq!(n, 10);
    let lower = fs::read(m.lower_path("dst")).unwrap();
    assert_eq!(&lower[100..110], &data[..10]);
    assert_eq!(lower.len(), 65536);
    // The destination must be writable.
    let ro = File::open(m.path("dst")).unwrap();
    assert_errno(
        copy_file_range(&src, 0, &ro, 0, 10),
        libc::EBADF,
        "copy into a read-only fd",
    );
}

/// Each failing operation is run on the lower directly and through the mount: both give the
/// same errno, and it is the expected one (an errno the lower does not give never appears).
fn lower_errnos_pass_through_unchanged(mode: &str) {
    let m = mount(mode, &[]);
    let lower = m.lower.clone();
    fs::write(lower.join("file"), b"content").unwrap();
    fs::create_dir(lower.join("dir")).unwrap();
    fs::write(lower.join("dir/child"), b"c").unwrap();
    fs::create_dir(lower.join("emptydir")).unwrap();
    std::os::unix::fs::symlink("file", lower.join("link")).unwrap();
    std::os::unix::fs::symlink("nowhere", lower.join("dangling")).unwrap();
    let long = "n".repeat(256);

    type Op<'a> = Box<dyn Fn(&Path) -> std::io::Result<()> + 'a>;
    let cases: Vec<(&str, i32, Op)> = vec![
        (
            "stat missing",
            libc::ENOENT,
            Box::new(|r| fs::metadata(r.join("missing")).map(drop)),
        ),
        (
            "stat under a file",
            libc::ENOTDIR,
            Box::new(|r| fs::metadata(r.join("file/x")).map(drop)),
        ),
        (
            "stat a dangling link",
            libc::ENOENT,
            Box::new(|r| fs::metadata(r.join("dangling")).map(drop)),
        ),
        (
            "mkdir existing",
            libc::EEXIST,
            Box::new(|r| fs::create_dir(r.join("dir"))),
        ),
        (
            "mkdir in missing",
            libc::ENOENT,
            Box::new(|r| fs::create_dir(r.join("missing/x"))),
        ),
        (
            "rmdir non-empty",
            libc::ENOTEMPTY,
            Box::new(|r| fs::remove_dir(r.join("dir"))),
        ),
        (
            "rmdir a file",
            libc::ENOTDIR,
            Box::new(|r| fs::remove_dir(r.join("file"))),
        ),
        (
            "unlink a dir",
            libc::EISDIR,
            Box::new(|r| fs::remove_file(r.join("dir"))),
        ),
        (
            "unlink missing",
            libc::ENOENT,
            Box::new(|r| fs::remove_file(r.join("missing"))),
        ),
        (
            "open a dir for writing",
            libc::EISDIR,
            Box::new(|r| open(&r.join("dir"), libc::O_WRONLY, 0).map(drop)),
        ),
        (
            "O_EXCL on existing",
            libc::EEXIST,
            Box::new(|r| {
                open(
                    &r.join("file"),
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                    0o600,
                )
                .map(drop)
            }),
        ),
        (
            "O_DIRECTORY on a file",
            libc::ENOTDIR,
            Box::new(|r| open(&r.join("file"), libc::O_DIRECTORY, 0).map(drop)),
        ),
        (
            "O_NOFOLLOW on a link",
            libc::ELOOP,
            Box::new(|r| open(&r.join("link"), libc::O_RDONLY | libc::O_NOFOLLOW, 0).map(drop)),
        ),
        (
            "name too long",
            libc::ENAMETOOLONG,
            Box::new(|r| open(&r.join(&long), libc::O_CREAT | libc::O_WRONLY, 0o600).map(drop)),
        ),
        (
            "lookup too long",
            libc::ENAMETOOLONG,
            Box::new(|r| fs::metadata(r.join(&long)).map(drop)),
        ),
        (
            "readlink a file",
            libc::EINVAL,
            Box::new(|r| fs::read_link(r.join("file")).map(drop)),
        ),
        (
            "symlink onto existing",
            libc::EEXIST,
            Box::new(|r| std::os::unix::fs::symlink("x", r.join("file"))),
        ),
        (
            "mknod onto existing",
            libc::EEXIST,
            Box::new(|r| mknod(&r.join("file"), libc::S_IFIFO | 0o600, 0)),
        ),
        (
            "link onto existing",
            libc::EEXIST,
            Box::new(|r| fs::hard_link(r.join("file"), r.join("dir/child"))),
        ),
        (
            "link a directory",
            libc::EPERM,
            Box::new(|r| fs::hard_link(r.join("dir"), r.join("dir2"))),
        ),
        (
            "rename dir onto non-empty dir",
            libc::ENOTEMPTY,
            Box::new(|r| fs::rename(r.join("emptydir"), r.join("dir"))),
        ),
        (
            "rename file onto dir",
            libc::EISDIR,
            Box::new(|r| fs::rename(r.join("file"), r.join("dir"))),
        ),
        (
            "rename dir onto file",
            libc::ENOTDIR,
            Box::new(|r| fs::rename(r.join("emptydir"), r.join("file"))),
        ),
        (
            "rename dir into itself",
            libc::EINVAL,
            Box::new(|r| fs::rename(r.join("dir"), r.join("dir/child2"))),
        ),
        (
            "RENAME_NOREPLACE onto existing",
            libc::EEXIST,
            Box::new(|r| {
                renameat2(
                    &r.join("file"),
                    &r.join("dir/child"),
                    libc::RENAME_NOREPLACE,
                )
            }),
        ),
        (
            "RENAME_EXCHANGE with missing",
            libc::ENOENT,
            Box::new(|r| renameat2(&r.join("file"), &r.join("missing"), libc::RENAME_EXCHANGE)),
        ),
        (
            "truncate a dir",
            libc::EISDIR,
            Box::new(|r| truncate(&r.join("dir"), 0)),
        ),
        (
            "truncate negative",
            libc::EINVAL,
            Box::new(|r| truncate(&r.join("file"), -1)),
        ),
        (
            "getxattr missing name",
            libc::ENODATA,
            Box::new(|r| getxattr(&r.join("file"), "user.none").map(drop)),
        ),
        (
            "XATTR_REPLACE missing name",
            libc::ENODATA,
            Box::new(|r| setxattr(&r.join("file"), "user.none", b"v", libc::XATTR_REPLACE)),
        ),
        (
            "removexattr missing name",
            libc::ENODATA,
            Box::new(|r| removexattr(&r.join("file"), "user.none")),
        ),
        (
            "SEEK_DATA past EOF",
            libc::ENXIO,
            Box::new(|r| lseek(&File::open(r.join("file"))?, 100, libc::SEEK_DATA).map(drop)),
        ),
        (
            "opendir a file",
            libc::ENOTDIR,
            Box::new(|r| fs::read_dir(r.join("file")).map(drop)),
        ),
    ];
    for (what, want, op) in &cases {
        let on_lower = errno_of(op(&lower));
        assert_eq!(
            on_lower,
            *want,
            "{what} on the lower gives {} (test assumption)",
            errno_name(on_lower)
        );
        let through = op(&m.mnt);
        assert_errno(through, *want, what);
    }
    // The fixtures are unchanged by all those failures.
    assert_eq!(fs::read(lower.join("file")).unwrap(), b"content");
    assert_eq!(fs::read(lower.join("dir/child")).unwrap(), b"c");
    assert_eq!(fs::read_dir(&lower).unwrap().count(), 5);
}

/// A lower whose upload fails answers FLUSH with EIO: the application's close(2) returns it.
fn close_returns_the_lowers_flush_error(mode: &str) {
    let s = over_bucketfs(mode, &["--fail-upload", "doomed"]);
    let f = File::create(s.m.path("doomed.bin")).unwrap();
    f.write_all_at(b"never uploaded", 0).unwrap();
    assert_errno(close(f), libc::EIO, "close of a file whose upload fails");
    assert!(!s.bucket.join("doomed.bin").exists());
    let f = File::create(s.m.path("doomed2.bin")).unwrap();
    f.write_all_at(b"never uploaded", 0).unwrap();
    assert_errno(
        f.sync_all(),
        libc::EIO,
        "fsync of a file whose upload fails",
    );
    drop(f);
    // Other files are unaffected.
    let f = File::create(s.m.path("fine.bin")).unwrap();
    f.write_all_at(b"ok", 0).unwrap();
    close(f).unwrap();
    assert_eq!(fs::read(s.bucket.join("fine.bin")).unwrap(), b"ok");
}

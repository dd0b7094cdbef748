//! Issue 24: after every namespace change, drainfs shows what its lower shows. On gcsfuse a
//! rename is a copy and a delete of objects, so the new name (and every name under a renamed
//! directory) is a new gcsfuse inode; drainfs must not keep serving the new name from the old
//! inode (its O_PATH fd reaches the deleted original: `ENOENT`, or an empty directory).
//!
//! Every sequence runs on three lowers, each time first on the lower itself (under `raw/`, the
//! reference: what an application sees without drainfs) and then through drainfs (under
//! `via/`), with the same assertions:
//! - `gcsfuse`: the real gcsfuse v3.11.2 over fake-gcs-server (`--rename-dir-limit=3`, as
//!   gcsfuse's own rename_dir_limit tests use), drainfs with default flags;
//! - `bucketfs`: the gcsfuse-like test lower with `--rename-new-inode` (renames make new
//!   inodes, entries with TTL 0, as gcsfuse);
//! - `plain_dir`: a local directory, where renames keep the inode (and drainfs keeps the
//!   nodeid: checked too).
//!
//! The sequences are the issue's, gcsfuse's own integration tests that failed behind drainfs
//! (operations/TestMoveFileWithinDifferentDirectory, rename_dir_limit/
//! TestMoveDirectoryInNonExistingDirectory and TestRenameDirectoryWithExistingEmptyDestDirectory),
//! a rename onto an existing file, RENAME_NOREPLACE and RENAME_EXCHANGE (gcsfuse answers both
//! with `EINVAL`, bucketfs supports RENAME_NOREPLACE), an unlink and a re-create under the same
//! name, an object overwritten from outside (through fake-gcs-server's HTTP API, in the
//! bucket directory, on the lower directory) read after drainfs's `--ttl`, and a directory
//! that appeared from outside (gcsfuse: an implicit directory), emptied and made again.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{assert_errno, over_bucketfs, renameat2};
use fuse_tests::lowers::Kind;
use fuse_tests::stack::{Stack, StackOpts, serial};

/// drainfs's `--ttl` in these tests (its default, given explicitly).
const TTL: Duration = Duration::from_secs(1);

/// Which lower a sequence runs on (what it supports differs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lower {
    Gcsfuse,
    Bucketfs,
    PlainDir,
}

/// Where a sequence runs: a fresh directory, the lower it is on, and how to replace an object
/// of it from outside any mount (`rel` is relative to `dir`).
struct Place<'a> {
    dir: PathBuf,
    lower: Lower,
    overwrite: &'a dyn Fn(&str, &[u8]),
}

fn p(place: &Place<'_>, rel: &str) -> PathBuf {
    place.dir.join(rel)
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn write(path: &Path, data: &[u8]) {
    std::fs::write(path, data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn mkdir(path: &Path) {
    std::fs::create_dir(path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
}

fn rename(from: &Path, to: &Path) {
    std::fs::rename(from, to)
        .unwrap_or_else(|e| panic!("rename {} {}: {e}", from.display(), to.display()));
}

/// On a lower that keeps identities, a rename keeps `st_ino` (drainfs's nodeid); on one that
/// renames by copying, the new name is a new inode there and through drainfs alike.
fn check_ino_after_rename(place: &Place<'_>, before: u64, now: &Path) {
    let after = std::fs::metadata(now).unwrap().ino();
    if place.lower == Lower::PlainDir {
        assert_eq!(
            after,
            before,
            "{}: a local rename keeps the inode",
            now.display()
        );
    } else {
        assert_ne!(
            after,
            before,
            "{}: the lower made a new inode",
            now.display()
        );
    }
}

/// `echo one > f; mv f g; echo two > f; mv f h; cat h`.
fn same_name_renamed_twice(place: &Place<'_>) {
    write(&p(place, "f"), b"one");
    let ino = std::fs::metadata(p(place, "f")).unwrap().ino();
    rename(&p(place, "f"), &p(place, "g"));
    check_ino_after_rename(place, ino, &p(place, "g"));
    write(&p(place, "f"), b"two");
    rename(&p(place, "f"), &p(place, "h"));
    assert_eq!(read(&p(place, "h")), b"two");
    assert_eq!(read(&p(place, "g")), b"one");
    assert_errno(
        std::fs::metadata(p(place, "f")),
        libc::ENOENT,
        "f after both renames",
    );
    assert_eq!(names(&place.dir), ["g", "h"]);
}

/// `mkdir src src/sub; echo x > src/file; mv src dst; ls dst` (and gcsfuse's
/// TestMoveDirectoryInNonExistingDirectory): the moved tree is listed, read and written.
fn directory_renamed_to_a_new_name(place: &Place<'_>) {
    mkdir(&p(place, "src"));
    mkdir(&p(place, "src/sub"));
    write(&p(place, "src/file"), b"x");
    assert_eq!(names(&p(place, "src")), ["file", "sub"]);
    let ino = std::fs::metadata(p(place, "src")).unwrap().ino();
    rename(&p(place, "src"), &p(place, "dst"));
    assert_eq!(names(&p(place, "dst")), ["file", "sub"]);
    assert!(std::fs::metadata(p(place, "dst/sub")).unwrap().is_dir());
    assert_eq!(read(&p(place, "dst/file")), b"x");
    assert_errno(
        std::fs::metadata(p(place, "src")),
        libc::ENOENT,
        "src after mv",
    );
    check_ino_after_rename(place, ino, &p(place, "dst"));
    write(&p(place, "dst/sub/new"), b"y");
    assert_eq!(names(&p(place, "dst/sub")), ["new"]);
    assert_eq!(read(&p(place, "dst/sub/new")), b"y");
}

/// `mkdir s2 s2/sub; echo x > s2/file; mkdir e; os.rename('s2', 'e'); ls e` (gcsfuse's
/// TestRenameDirectoryWithExistingEmptyDestDirectory).
fn directory_renamed_onto_an_empty_directory(place: &Place<'_>) {
    mkdir(&p(place, "s2"));
    mkdir(&p(place, "s2/sub"));
    write(&p(place, "s2/file"), b"x");
    write(&p(place, "s2/sub/temp3"), b"z");
    mkdir(&p(place, "e"));
    assert_eq!(names(&p(place, "e")), Vec::<String>::new());
    rename(&p(place, "s2"), &p(place, "e"));
    assert_errno(
        std::fs::metadata(p(place, "s2")),
        libc::ENOENT,
        "s2 after rename",
    );
    assert_eq!(names(&p(place, "e")), ["file", "sub"]);
    assert_eq!(names(&p(place, "e/sub")), ["temp3"]);
    assert_eq!(read(&p(place, "e/file")), b"x");
    assert_eq!(read(&p(place, "e/sub/temp3")), b"z");
}

/// gcsfuse's TestMoveFileWithinSameDirectory, then the shared test directory cleaned as its
/// suite does (each entry removed), then TestMoveFileWithinDifferentDirectory under the same
/// names, step by step: `Test` made with mode 0600, `Test/move.txt` created (os.Create) and,
/// while that handle is open, written through a second open (os.WriteFile); the first handle
/// closed; the destination made with mode 0600; `mv Test/move.txt DEST` (coreutils, as its
/// own process: it tries RENAME_NOREPLACE first); `DEST/move.txt` read.
fn file_moved_to_another_directory(place: &Place<'_>) {
    use std::os::unix::fs::DirBuilderExt;
    const CONTENT: &[u8] = b"This is from move file in Test directory.\n";
    let mkdir600 = |rel: &str| {
        std::fs::DirBuilder::new()
            .mode(0o600)
            .create(p(place, rel))
            .unwrap();
    };
    for dest in ["Test/a", "Test2"] {
        for name in names(&place.dir) {
            std::fs::remove_dir_all(p(place, &name)).unwrap();
        }
        mkdir600("Test");
        let created = std::fs::File::create(p(place, "Test/move.txt")).unwrap();
        write(&p(place, "Test/move.txt"), CONTENT);
        drop(created);
        mkdir600(dest);
        let mv = std::process::Command::new("mv")
            .arg(p(place, "Test/move.txt"))
            .arg(p(place, dest))
            .output()
            .unwrap();
        assert!(
            mv.status.success(),
            "mv: {}",
            String::from_utf8_lossy(&mv.stderr)
        );
        assert_eq!(
            read(&p(place, &format!("{dest}/move.txt"))),
            CONTENT,
            "{dest}"
        );
        assert_eq!(names(&p(place, dest)), ["move.txt"]);
    }
    assert_eq!(names(&p(place, "Test")), Vec::<String>::new());
}

/// A file renamed while another handle of it is still open (as when the kernel's RELEASE of
/// the last close reaches drainfs after the rename, which a busy machine does), then read by
/// its new name at once, several times over: the read must reach the lower's file under the
/// new name, not the inode the open handle holds (on gcsfuse the deleted original: `ENOENT`).
fn file_renamed_while_open_is_read_by_its_new_name(place: &Place<'_>) {
    for i in 0..10 {
        let (from, to) = (format!("open-{i}"), format!("moved-{i}"));
        let content = format!("content {i}\n");
        write(&p(place, &from), content.as_bytes());
        let held = std::fs::File::open(p(place, &from)).unwrap();
        rename(&p(place, &from), &p(place, &to));
        assert_eq!(read(&p(place, &to)), content.as_bytes(), "{to}");
        assert!(std::fs::metadata(p(place, &to)).unwrap().is_file());
        drop(held);
    }
    let mut want: Vec<String> = (0..10).map(|i| format!("moved-{i}")).collect();
    want.sort();
    assert_eq!(names(&place.dir), want);
}

/// A rename onto an existing file (gcsfuse's TestMoveFileWithDestFileExist), then the replaced
/// name written again.
fn file_renamed_onto_an_existing_file(place: &Place<'_>) {
    write(&p(place, "move1.txt"), b"source content");
    write(&p(place, "move2.txt"), b"Hello from dest file");
    assert_eq!(read(&p(place, "move2.txt")), b"Hello from dest file");
    rename(&p(place, "move1.txt"), &p(place, "move2.txt"));
    assert_eq!(read(&p(place, "move2.txt")), b"source content");
    assert_errno(
        std::fs::metadata(p(place, "move1.txt")),
        libc::ENOENT,
        "source",
    );
    write(&p(place, "move2.txt"), b"rewritten");
    assert_eq!(read(&p(place, "move2.txt")), b"rewritten");
    assert_eq!(names(&place.dir), ["move2.txt"]);
}

/// RENAME_NOREPLACE and RENAME_EXCHANGE: where the lower refuses them (gcsfuse: `EINVAL`,
/// jacobsa/fuse has no RENAME2; bucketfs: RENAME_EXCHANGE) nothing changes; where it supports
/// them the names end up as on the lower.
fn rename_with_flags(place: &Place<'_>) {
    let (noreplace, exchange) = match place.lower {
        Lower::Gcsfuse => (false, false),
        Lower::Bucketfs => (true, false),
        Lower::PlainDir => (true, true),
    };
    write(&p(place, "a"), b"A");
    write(&p(place, "b"), b"B");
    // Onto an existing name the VFS answers EEXIST itself, before asking the filesystem.
    let r = renameat2(&p(place, "a"), &p(place, "b"), libc::RENAME_NOREPLACE);
    assert_errno(r, libc::EEXIST, "NOREPLACE onto b");
    assert_eq!(
        (read(&p(place, "a")), read(&p(place, "b"))),
        (b"A".to_vec(), b"B".to_vec())
    );

    let r = renameat2(&p(place, "a"), &p(place, "c"), libc::RENAME_NOREPLACE);
    if noreplace {
        r.unwrap();
    } else {
        assert_errno(r, libc::EINVAL, "NOREPLACE to a new name");
        assert_eq!(read(&p(place, "a")), b"A");
        rename(&p(place, "a"), &p(place, "c"));
    }
    assert_eq!(read(&p(place, "c")), b"A");
    assert_errno(
        std::fs::metadata(p(place, "a")),
        libc::ENOENT,
        "a after its rename",
    );

    let r = renameat2(&p(place, "c"), &p(place, "b"), libc::RENAME_EXCHANGE);
    if exchange {
        r.unwrap();
        assert_eq!(
            (read(&p(place, "c")), read(&p(place, "b"))),
            (b"B".to_vec(), b"A".to_vec())
        );
    } else {
        assert_errno(r, libc::EINVAL, "EXCHANGE");
        assert_eq!(
            (read(&p(place, "c")), read(&p(place, "b"))),
            (b"A".to_vec(), b"B".to_vec())
        );
    }
    assert_eq!(names(&place.dir), ["b", "c"]);
}

/// `echo one > f; cat f; rm f; echo two > f; cat f`, and the same for a directory.
fn unlinked_then_made_again(place: &Place<'_>) {
    write(&p(place, "f"), b"one");
    assert_eq!(read(&p(place, "f")), b"one");
    std::fs::remove_file(p(place, "f")).unwrap();
    assert_errno(std::fs::metadata(p(place, "f")), libc::ENOENT, "f after rm");
    write(&p(place, "f"), b"second");
    assert_eq!(read(&p(place, "f")), b"second");
    assert_eq!(std::fs::metadata(p(place, "f")).unwrap().len(), 6);

    mkdir(&p(place, "d"));
    write(&p(place, "d/x"), b"1");
    std::fs::remove_file(p(place, "d/x")).unwrap();
    std::fs::remove_dir(p(place, "d")).unwrap();
    mkdir(&p(place, "d"));
    assert_eq!(names(&p(place, "d")), Vec::<String>::new());
    write(&p(place, "d/y"), b"2");
    assert_eq!(names(&p(place, "d")), ["y"]);
    assert_eq!(names(&place.dir), ["d", "f"]);
}

/// An object replaced from outside any mount, read through the mount after drainfs's `--ttl`.
/// (The object is made from outside too: a file written through drainfs keeps a lower fd
/// open after its close on a passthrough lower (`Fs::release`), and bucketfs serves an open
/// file from its staged copy.)
fn overwritten_from_outside(place: &Place<'_>) {
    (place.overwrite)("o", b"old content");
    assert_eq!(read(&p(place, "o")), b"old content");
    (place.overwrite)("o", b"new, longer content");
    std::thread::sleep(TTL + Duration::from_millis(500));
    assert_eq!(read(&p(place, "o")), b"new, longer content");
    assert_eq!(std::fs::metadata(p(place, "o")).unwrap().len(), 19);
}

/// A tree that appears from outside (on gcsfuse: objects without directory markers, so an
/// implicit directory), listed and read through the mount; its files removed through the
/// mount (on gcsfuse the directory goes with its last object); then the name appearing again
/// from outside, read after drainfs's `--ttl` (drainfs cannot see a directory vanish as a
/// consequence of a removal, nor an upload). gcsfuse v3.11.2 refuses to rename an implicit
/// directory (`ENOENT`, with or without drainfs), so there is no rename here.
fn implicit_directory_made_again(place: &Place<'_>) {
    let gcsfuse = place.lower == Lower::Gcsfuse;
    (place.overwrite)("imp/a", b"a");
    (place.overwrite)("imp/sub/b", b"b");
    assert_eq!(names(&p(place, "imp")), ["a", "sub"]);
    assert_eq!(read(&p(place, "imp/sub/b")), b"b");
    std::fs::remove_file(p(place, "imp/a")).unwrap();
    std::fs::remove_file(p(place, "imp/sub/b")).unwrap();
    std::thread::sleep(TTL + Duration::from_millis(500));
    if gcsfuse {
        assert_errno(std::fs::metadata(p(place, "imp")), libc::ENOENT, "emptied");
    } else {
        assert_eq!(names(&p(place, "imp")), ["sub"]);
    }
    (place.overwrite)("imp/c", b"c");
    std::thread::sleep(TTL + Duration::from_millis(500));
    let want: &[&str] = if gcsfuse { &["c"] } else { &["c", "sub"] };
    assert_eq!(names(&p(place, "imp")), want);
    assert_eq!(read(&p(place, "imp/c")), b"c");
}

/// Runs `seq` under `raw/` on the lower's own mount, then under `via/` through drainfs.
fn on_both(
    lower: Lower,
    (lower_root, mnt): (&Path, &Path),
    overwrite: &dyn Fn(&str, &str, &[u8]),
    seq: fn(&Place<'_>),
) {
    for (root, prefix, via_drainfs) in [(lower_root, "raw", false), (mnt, "via", true)] {
        let dir = root.join(prefix);
        mkdir(&dir);
        let ow = |rel: &str, data: &[u8]| overwrite(prefix, rel, data);
        let place = Place {
            dir,
            lower,
            overwrite: &ow,
        };
        eprintln!(
            "{lower:?}: {} (through drainfs: {via_drainfs})",
            place.dir.display()
        );
        seq(&place);
    }
}

/// Replaces `root/prefix/rel` with a new file (a temp file renamed onto it, as an upload
/// publishes an object).
fn replace_file(root: &Path, prefix: &str, rel: &str, data: &[u8]) {
    let path = root.join(prefix).join(rel);
    let dir = path.parent().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let tmp = dir.join(".outside.tmp");
    std::fs::write(&tmp, data).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
}

/// Uploads `data` as object `name` of `bucket` on fake-gcs-server at `port` (a simple media
/// upload of the JSON API, HTTP/1.0 from this process: no fork).
fn upload_object(port: u16, bucket: &str, name: &str, data: &[u8]) {
    let addr = format!("127.0.0.1:{port}");
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let path = format!("/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}");
    write!(
        conn,
        "POST {path} HTTP/1.0\r\nHost: localhost:{port}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        data.len()
    )
    .unwrap();
    conn.write_all(data).unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "upload of {name}: {answer:.300}"
    );
}

fn on_gcsfuse(seq: fn(&Place<'_>), client_flags: &[&str]) {
    let _serial = serial();
    let s = Stack::start_with(
        Kind::Gcsfuse,
        StackOpts {
            args: vec!["--ttl".into(), format!("{}s", TTL.as_secs())],
            client_flags: client_flags.iter().map(|f| f.to_string()).collect(),
            ..StackOpts::default()
        },
    );
    let (port, bucket) = (s.server.port, s.server.bucket.clone());
    let overwrite = |prefix: &str, rel: &str, data: &[u8]| {
        upload_object(port, &bucket, &format!("{prefix}/{rel}"), data)
    };
    on_both(Lower::Gcsfuse, (&s.m.lower, &s.m.mnt), &overwrite, seq);
}

fn on_bucketfs(seq: fn(&Place<'_>)) {
    let _serial = serial();
    let b = over_bucketfs("auto", &["--rename-new-inode"]);
    let bucket = b.bucket.clone();
    let overwrite = |prefix: &str, rel: &str, data: &[u8]| replace_file(&bucket, prefix, rel, data);
    on_both(Lower::Bucketfs, (&b.m.lower, &b.m.mnt), &overwrite, seq);
}

fn on_plain_dir(seq: fn(&Place<'_>)) {
    let _serial = serial();
    let m = common::mount("auto", &["--ttl", "1s"]);
    let lower = m.lower.clone();
    let overwrite = |prefix: &str, rel: &str, data: &[u8]| replace_file(&lower, prefix, rel, data);
    on_both(Lower::PlainDir, (&m.lower, &m.mnt), &overwrite, seq);
}

/// One test per lower for each sequence: `name::gcsfuse`, `name::bucketfs`, `name::plain_dir`;
/// the gcsfuse client gets `--rename-dir-limit=3` and the flags given.
macro_rules! on_every_lower {
    ($($name:ident $(: $($flag:literal),+)?;)+) => {
        $(
            mod $name {
                #[test]
                fn gcsfuse() {
                    super::on_gcsfuse(super::$name, &["--rename-dir-limit=3" $($(, $flag)+)?]);
                }

                #[test]
                fn bucketfs() {
                    super::on_bucketfs(super::$name);
                }

                #[test]
                fn plain_dir() {
                    super::on_plain_dir(super::$name);
                }
            }
        )+
    };
}

on_every_lower! {
    same_name_renamed_twice;
    directory_renamed_to_a_new_name;
    directory_renamed_onto_an_empty_directory;
    file_moved_to_another_directory;
    file_renamed_while_open_is_read_by_its_new_name;
    file_renamed_onto_an_existing_file;
    rename_with_flags;
    unlinked_then_made_again;
    // gcsfuse's own caches would hide the new object for 60 s, with or without drainfs.
    overwritten_from_outside: "--metadata-cache-ttl-secs=0";
    implicit_directory_made_again: "--metadata-cache-ttl-secs=0", "--metadata-cache-negative-ttl-secs=0";
}

/// Many applications renaming files into one directory at once (write a temp file, rename it
/// into place) on a lower whose renames make new inodes: every rename leaves the kernel an
/// entry to invalidate, and an invalidation waits for the directory's lock, which the other
/// renames hold while they wait for a FUSE worker. All of them finish, with every file in
/// place.
#[test]
fn concurrent_renames_into_one_directory_all_finish() {
    const THREADS: usize = 32;
    const EACH: usize = 20;
    let _serial = serial();
    let b = over_bucketfs("auto", &["--rename-new-inode"]);
    let dir = b.m.mnt.join("d");
    mkdir(&dir);
    let (tx, rx) = std::sync::mpsc::channel();
    for t in 0..THREADS {
        let (dir, tx) = (dir.clone(), tx.clone());
        std::thread::spawn(move || {
            for i in 0..EACH {
                let tmp = dir.join(format!(".tmp-{t}-{i}"));
                std::fs::write(&tmp, format!("{t}-{i}")).unwrap();
                std::fs::rename(&tmp, dir.join(format!("f-{t}-{i}"))).unwrap();
            }
            tx.send(t).unwrap();
        });
    }
    drop(tx);
    for _ in 0..THREADS {
        rx.recv_timeout(Duration::from_secs(120))
            .expect("renames stuck (or a thread panicked)");
    }
    let got = names(&dir);
    assert_eq!(got.len(), THREADS * EACH, "{got:?}");
    for t in 0..THREADS {
        for i in 0..EACH {
            assert_eq!(
                read(&dir.join(format!("f-{t}-{i}"))),
                format!("{t}-{i}").as_bytes()
            );
        }
    }
}

/// The objects under `prefix` of `bucket` on fake-gcs-server at `port`, with their content,
/// read in this process: a child process would close (FLUSH) the test's open files at its
/// `exec`, and gcsfuse uploads a local file at its FLUSH.
fn objects_in_process(port: u16, bucket: &str, prefix: &str) -> Vec<(String, Vec<u8>)> {
    let timeout = Duration::from_secs(10);
    let (code, body) = fuse_tests::lowers::http_get(
        port,
        &format!("/storage/v1/b/{bucket}/o?prefix={prefix}"),
        timeout,
    )
    .unwrap();
    assert_eq!(code, 200, "listing: {body:.300}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut out = Vec::new();
    for item in doc["items"].as_array().into_iter().flatten() {
        let name = item["name"].as_str().expect("name").to_string();
        if name.ends_with('/') {
            continue;
        }
        let (code, data) = fuse_tests::lowers::http_get(
            port,
            &format!(
                "/download/storage/v1/b/{bucket}/o/{}?alt=media",
                name.replace('/', "%2F")
            ),
            timeout,
        )
        .unwrap();
        assert_eq!(code, 200, "{name}: {data:.300}");
        out.push((name, data.into_bytes()));
    }
    out.sort();
    out
}

/// gcsfuse's local_file/TestRenameOfLocalFile (gcsfuse flags `--implicit-dirs=true
/// --rename-dir-limit=3 --enable-streaming-writes=false`, with which gcsfuse's mount has the
/// kernel's writeback cache), through drainfs with `--passthrough auto` and `never`: a file
/// created with O_DIRECT and kept open, 10 bytes written to it (nothing in the bucket yet: a
/// local file), renamed while open; the new object has the 10 bytes, the old name none, and
/// the close succeeds. Without passthrough, drainfs's own write must reach gcsfuse as the
/// application's did (O_DIRECT), not wait in the lower's page cache until after the rename.
#[test]
fn gcsfuse_open_local_file_written_with_o_direct_then_renamed() {
    use std::os::unix::fs::OpenOptionsExt;
    for mode in ["auto", "never"] {
        let _serial = serial();
        let s = Stack::start_with(
            Kind::Gcsfuse,
            StackOpts {
                passthrough: Some(mode.into()),
                client_flags: [
                    "--implicit-dirs=true",
                    "--rename-dir-limit=3",
                    "--enable-streaming-writes=false",
                ]
                .map(String::from)
                .to_vec(),
                ..StackOpts::default()
            },
        );
        let objects = || objects_in_process(s.server.port, &s.server.bucket, "d/");
        let dir = s.m.mnt.join("d");
        mkdir(&dir);
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(dir.join("f"))
            .unwrap();
        f.write_all(b"0123456789").unwrap();
        assert_eq!(
            objects(),
            [],
            "{mode}: a local file is not in the bucket before its close"
        );
        rename(&dir.join("f"), &dir.join("g"));
        assert_eq!(
            objects(),
            [("d/g".to_string(), b"0123456789".to_vec())],
            "{mode}: the renamed object has the bytes written before the rename, the old name is gone"
        );
        // The close (FLUSH) of the renamed file succeeds, as on gcsfuse alone.
        let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
        // SAFETY: `fd` is the file's own descriptor, given up by `into_raw_fd`.
        let closed = unsafe { libc::close(fd) };
        assert_eq!(
            closed,
            0,
            "{mode}: close: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(read(&dir.join("g")), b"0123456789", "{mode}");
        assert_eq!(
            objects(),
            [("d/g".to_string(), b"0123456789".to_vec())],
            "{mode}: after the close"
        );
    }
}

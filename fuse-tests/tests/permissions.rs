//! Users and permissions on a real mount, in both passthrough modes. The
//! workloads run as non-root users: through `run_user` (shell commands) for ownership, and in a
//! forked child switched to the user for exact errnos.

#[macro_use]
mod common;

use std::fs::{self, Permissions};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;

/// A fresh uid/gid pair with no passwd entry, and `nobody`.
const U: u32 = 4242;
const G: u32 = 4343;
const NOBODY: u32 = 65534;

both_modes!(
    mount_is_allow_other_and_default_permissions,
    files_created_by_a_user_are_owned_by_that_user,
    a_user_cannot_read_a_root_only_file,
    the_kernel_checks_permissions_for_every_operation,
    supplementary_groups_count_on_the_lower,
);

fn mount_is_allow_other_and_default_permissions(mode: &str) {
    let m = mount(mode, &[]);
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(m.mnt.to_str().unwrap()))
        .expect("the mount is listed");
    let super_opts = line.rsplit(' ').next().unwrap();
    assert!(super_opts.contains("allow_other"), "{line}");
    assert!(super_opts.contains("default_permissions"), "{line}");

    // Another user lists, stats and reads through the mount.
    fs::write(m.path("readable"), b"for everyone\n").unwrap();
    fs::create_dir(m.path("d")).unwrap();
    for uid in [U, NOBODY] {
        let out = run_user(uid, uid, "cat", &[m.path("readable").to_str().unwrap()]);
        assert!(out.status.success(), "uid {uid}: {out:?}");
        assert_eq!(out.stdout, b"for everyone\n");
        let out = run_user(uid, uid, "ls", &["-a", m.path("").to_str().unwrap()]);
        assert!(out.status.success(), "uid {uid}: {out:?}");
        let listed = String::from_utf8(out.stdout).unwrap();
        let mut names: Vec<&str> = listed.lines().collect();
        names.sort();
        assert_eq!(names, [".", "..", "d", "readable"]);
    }
    // And gets an answer from the mount, not EACCES from the FUSE connection itself.
    let p = cpath(&m.path("readable"));
    assert_eq!(as_user(U, G, || try_open(&p, libc::O_RDONLY, 0)), 0);
}

fn files_created_by_a_user_are_owned_by_that_user(mode: &str) {
    let m = mount(mode, &[]);
    fs::set_permissions(m.path(""), Permissions::from_mode(0o1777)).unwrap();
    let root = m.path("");
    let script = format!(
        "set -e; umask 022; cd '{}'; echo hi > f; mkdir d; echo sub > d/g; ln -s f l; \
         mkfifo p; ln f hard; mv d/g d/h; touch -d @1000000000 f",
        root.display()
    );
    let out = run_user(U, G, "sh", &["-c", &script]);
    assert!(out.status.success(), "{out:?}");

    for (name, want_mode) in [
        ("f", libc::S_IFREG | 0o644),
        ("d", libc::S_IFDIR | 0o755),
        ("d/h", libc::S_IFREG | 0o644),
        ("l", libc::S_IFLNK | 0o777),
        ("p", libc::S_IFIFO | 0o644),
    ] {
        let l = fs::symlink_metadata(m.lower_path(name)).unwrap();
        assert_eq!((l.uid(), l.gid()), (U, G), "{name} on the lower");
        assert_eq!(l.mode(), want_mode, "{name} on the lower");
        let s = fs::symlink_metadata(m.path(name)).unwrap();
        assert_eq!((s.uid(), s.gid()), (U, G), "{name} through the mount");
    }
    assert_eq!(fs::read(m.lower_path("f")).unwrap(), b"hi\n");
    assert_eq!(fs::read(m.lower_path("d/h")).unwrap(), b"sub\n");
    assert_eq!(fs::metadata(m.lower_path("hard")).unwrap().nlink(), 2);
    assert_eq!(
        fs::metadata(m.lower_path("f")).unwrap().mtime(),
        1_000_000_000
    );

    // A set-group-ID directory on the lower gives new entries its group, as a local caller
    // would see.
    fs::create_dir(m.path("shared")).unwrap();
    std::os::unix::fs::chown(m.path("shared"), Some(0), Some(777)).unwrap();
    fs::set_permissions(m.path("shared"), Permissions::from_mode(0o2777)).unwrap();
    let script = format!(
        "set -e; cd '{}'; echo x > file; mkdir sub",
        m.path("shared").display()
    );
    let out = run_user(U, G, "sh", &["-c", &script]);
    assert!(out.status.success(), "{out:?}");
    let f = fs::metadata(m.lower_path("shared/file")).unwrap();
    assert_eq!((f.uid(), f.gid()), (U, 777));
    let d = fs::metadata(m.lower_path("shared/sub")).unwrap();
    assert_eq!((d.uid(), d.gid()), (U, 777));
    assert!(
        d.mode() & libc::S_ISGID != 0,
        "sgid inherited by the subdirectory"
    );

    // Root's creations stay root's.
    fs::write(m.path("rootfile"), b"").unwrap();
    let r = fs::metadata(m.lower_path("rootfile")).unwrap();
    assert_eq!((r.uid(), r.gid()), (0, 0));
}

fn a_user_cannot_read_a_root_only_file(mode: &str) {
    let m = mount(mode, &[]);
    fs::write(m.path("secret"), b"root only\n").unwrap();
    fs::set_permissions(m.path("secret"), Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(m.lower_path("secret")).unwrap().uid(), 0);

    let p = cpath(&m.path("secret"));
    assert_eq!(
        as_user(U, G, || try_open(&p, libc::O_RDONLY, 0)),
        libc::EACCES
    );
    assert_eq!(
        as_user(NOBODY, NOBODY, || try_open(&p, libc::O_RDONLY, 0)),
        libc::EACCES
    );
    let out = run_user(U, G, "cat", &[m.path("secret").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "leaked: {:?}", out.stdout);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{out:?}"
    );
    // Root still reads it, and a group-readable file is readable by the group only.
    assert_eq!(fs::read(m.path("secret")).unwrap(), b"root only\n");
    fs::write(m.path("group"), b"group\n").unwrap();
    std::os::unix::fs::chown(m.path("group"), Some(0), Some(G)).unwrap();
    fs::set_permissions(m.path("group"), Permissions::from_mode(0o640)).unwrap();
    let g = cpath(&m.path("group"));
    assert_eq!(as_user(U, G, || try_open(&g, libc::O_RDONLY, 0)), 0);
    assert_eq!(
        as_user(U, G, || try_open(&g, libc::O_WRONLY, 0)),
        libc::EACCES
    );
    assert_eq!(
        as_user(NOBODY, NOBODY, || try_open(&g, libc::O_RDONLY, 0)),
        libc::EACCES
    );
}

fn the_kernel_checks_permissions_for_every_operation(mode: &str) {
    let m = mount(mode, &[]);
    fs::write(m.path("rootfile"), b"data").unwrap(); // 0644, root's
    fs::create_dir(m.path("rootdir")).unwrap(); // 0755, root's
    fs::create_dir(m.path("sticky")).unwrap();
    fs::set_permissions(m.path("sticky"), Permissions::from_mode(0o1777)).unwrap();
    fs::write(m.path("sticky/roots"), b"").unwrap();
    fs::create_dir(m.path("private")).unwrap();
    fs::set_permissions(m.path("private"), Permissions::from_mode(0o700)).unwrap();
    fs::write(m.path("private/inner"), b"").unwrap();
    fs::set_permissions(m.path("private/inner"), Permissions::from_mode(0o666)).unwrap();

    let c = |s: &str| cpath(&m.path(s));
    let (rootfile, newfile, sticky_roots, mine, inner) = (
        c("rootfile"),
        c("rootdir/new"),
        c("sticky/roots"),
        c("sticky/mine"),
        c("private/inner"),
    );
    // Each body returns 0 or the errno of the one call that should fail.
    type Body<'a> = Box<dyn Fn() -> i32 + 'a>;
    let cases: Vec<(&str, i32, Body)> = vec![
        (
            "write root's 0644 file",
            libc::EACCES,
            Box::new(|| try_open(&rootfile, libc::O_WRONLY, 0)),
        ),
        (
            "create in root's 0755 dir",
            libc::EACCES,
            Box::new(|| try_open(&newfile, libc::O_CREAT | libc::O_WRONLY, 0o644)),
        ),
        (
            "traverse a 0700 dir",
            libc::EACCES,
            Box::new(|| try_open(&inner, libc::O_RDONLY, 0)),
        ),
        (
            "chmod root's file",
            libc::EPERM,
            // SAFETY: raw syscall on a prepared path.
            Box::new(|| unsafe {
                if libc::chmod(rootfile.as_ptr(), 0o777) < 0 {
                    last_errno()
                } else {
                    0
                }
            }),
        ),
        (
            "unlink root's file in a sticky dir",
            libc::EPERM,
            // SAFETY: raw syscall on a prepared path.
            Box::new(|| unsafe {
                if libc::unlink(sticky_roots.as_ptr()) < 0 {
                    last_errno()
                } else {
                    0
                }
            }),
        ),
        (
            "give away one's own file",
            libc::EPERM,
            // SAFETY: raw syscalls on a prepared path.
            Box::new(|| unsafe {
                let fd = libc::open(mine.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
                if fd < 0 {
                    return 100;
                }
                libc::close(fd);
                if libc::chown(mine.as_ptr(), 0, 0) < 0 {
                    last_errno()
                } else {
                    0
                }
            }),
        ),
        (
            "set times of root's file",
            libc::EPERM,
            // SAFETY: raw syscall on a prepared path and two timespecs.
            Box::new(|| unsafe {
                let t = [
                    libc::timespec {
                        tv_sec: 1,
                        tv_nsec: 0,
                    },
                    libc::timespec {
                        tv_sec: 1,
                        tv_nsec: 0,
                    },
                ];
                if libc::utimensat(libc::AT_FDCWD, rootfile.as_ptr(), t.as_ptr(), 0) < 0 {
                    last_errno()
                } else {
                    0
                }
            }),
        ),
    ];
    for (what, want, body) in &cases {
        let got = as_user(U, G, body);
        assert_eq!(
            got,
            *want,
            "{what}: expected {}, got {}",
            errno_name(*want),
            errno_name(got)
        );
    }
    // Nothing changed on the lower.
    let l = fs::metadata(m.lower_path("rootfile")).unwrap();
    assert_eq!((l.mode() & 0o7777, l.uid()), (0o644, 0));
    assert_eq!(fs::read(m.lower_path("rootfile")).unwrap(), b"data");
    assert!(!m.lower_path("rootdir/new").exists());
    assert!(m.lower_path("sticky/roots").exists());
    let mine = fs::metadata(m.lower_path("sticky/mine")).unwrap();
    assert_eq!((mine.uid(), mine.gid()), (U, G), "created, not given away");
    // What the user may do, it can: write its own file, remove it from the sticky dir.
    let mine_c = c("sticky/mine");
    assert_eq!(
        as_user(U, G, || try_open(
            &mine_c,
            libc::O_WRONLY | libc::O_TRUNC,
            0
        )),
        0
    );
    // SAFETY: raw syscall on a prepared path.
    let unlink_mine = || unsafe {
        if libc::unlink(mine_c.as_ptr()) < 0 {
            last_errno()
        } else {
            0
        }
    };
    assert_eq!(as_user(U, G, unlink_mine), 0);
    assert!(!m.lower_path("sticky/mine").exists());
}

/// A user whose access to a directory comes from a supplementary group (as a pod's fsGroup
/// gives) creates entries there: the kernel allowed it, so the lower must too.
fn supplementary_groups_count_on_the_lower(mode: &str) {
    const TEAM: u32 = 5151;
    let m = mount(mode, &[]);
    fs::create_dir(m.path("team")).unwrap();
    std::os::unix::fs::chown(m.path("team"), Some(0), Some(TEAM)).unwrap();
    fs::set_permissions(m.path("team"), Permissions::from_mode(0o770)).unwrap();
    let member = Creds {
        uid: U,
        gid: G,
        groups: &[TEAM],
    };
    let stranger = Creds {
        uid: U,
        gid: G,
        groups: &[],
    };
    let c = |s: &str| cpath(&m.path(s));
    let (file, file2, dir, fifo, link) = (
        c("team/file"),
        c("team/file2"),
        c("team/dir"),
        c("team/fifo"),
        c("team/link"),
    );
    let target = std::ffi::CString::new("file").unwrap();
    // SAFETY: raw syscalls on NUL-terminated paths prepared before the fork; each fd is
    // closed once.
    let body = || unsafe {
        let fd = libc::open(file.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o640);
        if fd < 0 {
            return last_errno();
        }
        libc::close(fd);
        if libc::mkdir(dir.as_ptr(), 0o750) < 0 {
            return 100 + last_errno();
        }
        if libc::mknod(fifo.as_ptr(), libc::S_IFIFO | 0o640, 0) < 0 {
            return 150 + last_errno();
        }
        if libc::symlink(target.as_ptr(), link.as_ptr()) < 0 {
            return 200 + last_errno();
        }
        0
    };
    assert_eq!(
        in_child(Some(member), body),
        0,
        "member of the directory's group"
    );
    for name in ["team/file", "team/dir", "team/fifo", "team/link"] {
        let l = fs::symlink_metadata(m.lower_path(name)).unwrap();
        assert_eq!((l.uid(), l.gid()), (U, G), "{name}");
    }
    // Without the group, the kernel refuses before drainfs is asked.
    assert_eq!(
        in_child(Some(stranger), || try_open(
            &file2,
            libc::O_CREAT | libc::O_WRONLY,
            0o640
        )),
        libc::EACCES
    );
    assert!(!m.lower_path("team/file2").exists());
}

//! The data path of regular files, in `--passthrough always` (kernel
//! passthrough with one backing id per inode), `--passthrough never` (served by drainfs) and
//! `--passthrough reads` (passthrough for read-only opens, writes served by drainfs).
//! Checks that the data path really is what the mode says (drainfs's own I/O counters), and
//! that shared opens, O_DIRECT, mmap, O_APPEND, concurrent writers and sparse files behave as
//! on the lower.

#[macro_use]
mod common;

use std::fs::{self, File, OpenOptions, Permissions};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};

use common::*;
use fuse_tests::fileops::SharedMap;

both_modes!(
    data_path_matches_the_mode,
    concurrent_opens_share_one_backing_file,
    o_direct_reads_and_writes,
    mmap_write_then_read_is_coherent,
    o_append_from_two_processes,
    concurrent_writers_with_checksums,
    sparse_files_stay_sparse,
    write_or_truncate_by_another_user_clears_suid_sgid,
);

const MIB: usize = 1 << 20;

/// drainfs's own reads and writes (`/proc/<pid>/io`) show whether file data goes through it:
/// with kernel passthrough, reading or writing 32 MiB costs drainfs only request headers;
/// served by drainfs, every byte is read and written by it twice (lower and /dev/fuse).
fn data_path_matches_the_mode(mode: &str) {
    let ctl = tempfile::tempdir_in("/tmp").unwrap();
    let sock = ctl.path().join("ctl.sock");
    let m = mount(mode, &["--control-socket", &sock.display().to_string()]);
    // `reads`: passthrough for read-only opens, writes served by drainfs.
    let read_passthrough = mode != "never";
    let write_passthrough = mode == "always";
    let st = status(&sock).expect("drainfs answers on its control socket");
    assert_eq!(st["init"]["passthrough"], read_passthrough, "{st}");
    let pid = m.proc.pid();
    const LEN: usize = 32 * MIB;

    // Read: the file is written on the lower, so the mount has nothing of it cached.
    let data = pattern(1, LEN);
    fs::write(m.lower_path("big"), &data).unwrap();
    let (r0, w0) = proc_io(pid);
    assert_eq!(file_checksum(&m.path("big")), checksum(&data));
    let (r1, w1) = proc_io(pid);
    let (dr, dw) = (r1 - r0, w1 - w0);
    if read_passthrough {
        assert!(
            dr < 4 * MIB as u64 && dw < 4 * MIB as u64,
            "passthrough read went through drainfs: read {dr}, wrote {dw}"
        );
    } else {
        assert!(
            dr >= LEN as u64 && dw >= LEN as u64,
            "drainfs served the read: read {dr}, wrote {dw}"
        );
    }

    // Write.
    let (r0, w0) = proc_io(pid);
    let f = File::create(m.path("out")).unwrap();
    for (i, chunk) in data.chunks(MIB).enumerate() {
        f.write_all_at(chunk, (i * MIB) as u64).unwrap();
    }
    close(f).unwrap();
    let (r1, w1) = proc_io(pid);
    let (dr, dw) = (r1 - r0, w1 - w0);
    if write_passthrough {
        assert!(
            dr < 4 * MIB as u64 && dw < 4 * MIB as u64,
            "passthrough write went through drainfs: read {dr}, wrote {dw}"
        );
    } else {
        assert!(
            dr >= LEN as u64 && dw >= LEN as u64,
            "drainfs served the write: read {dr}, wrote {dw}"
        );
    }
    assert_eq!(file_checksum(&m.lower_path("out")), checksum(&data));
}

/// Several opens of one inode at once (read, read, write; the kernel allows one backing id per
/// inode, so they must share it) see each other's data, and opens and closes racing on one
/// inode never fail.
fn concurrent_opens_share_one_backing_file(mode: &str) {
    let m = mount(mode, &[]);
    let p = m.path("f");
    fs::write(&p, b"version 1").unwrap();
    let r1 = File::open(&p).unwrap();
    let r2 = File::open(&p).unwrap();
    let w = OpenOptions::new().write(true).open(&p).unwrap();
    assert_eq!(pread(&r1, 0, 100), b"version 1");
    w.write_all_at(b"VERSION 2", 0).unwrap();
    assert_eq!(pread(&r1, 0, 100), b"VERSION 2");
    assert_eq!(pread(&r2, 0, 100), b"VERSION 2");
    drop(r1);
    w.write_all_at(b"3", 8).unwrap();
    assert_eq!(pread(&r2, 0, 100), b"VERSION 3");
    let rw = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    assert_eq!(pread(&rw, 0, 100), b"VERSION 3");
    rw.write_all_at(b"v", 0).unwrap();
    assert_eq!(pread(&r2, 0, 1), b"v");
    drop((r2, w, rw));
    assert_eq!(fs::read(m.lower_path("f")).unwrap(), b"vERSION 3");

    // Race: readers and a writer open and close the same inode over and over.
    let data = pattern(5, 256 << 10);
    fs::write(&p, &data).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (p, data) = (&p, &data);
            s.spawn(move || {
                for i in 0..150 {
                    if t == 0 && i % 3 == 0 {
                        let f = OpenOptions::new()
                            .write(true)
                            .open(p)
                            .unwrap_or_else(|e| panic!("writer open {i}: {e}"));
                        f.write_all_at(&data[..4096], 0).unwrap();
                        close(f).unwrap();
                    } else {
                        let f =
                            File::open(p).unwrap_or_else(|e| panic!("reader {t} open {i}: {e}"));
                        assert_eq!(pread(&f, 0, data.len()), *data, "reader {t} round {i}");
                    }
                }
            });
        }
    });
    assert_eq!(fs::read(m.lower_path("f")).unwrap(), data);
}

fn o_direct_reads_and_writes(mode: &str) {
    let m = mount(mode, &[]);
    let f = open(
        &m.path("direct"),
        libc::O_CREAT | libc::O_RDWR | libc::O_DIRECT,
        0o644,
    )
    .unwrap();
    let mut wbuf = AlignedBuf::new(MIB);
    wbuf.as_mut_slice().copy_from_slice(&pattern(9, MIB));
    assert_eq!(f.write_at(wbuf.as_slice(), 0).unwrap(), MIB);
    assert_eq!(f.write_at(wbuf.as_slice(), 4 * MIB as u64).unwrap(), MIB);
    let lower = fs::read(m.lower_path("direct")).unwrap();
    assert_eq!(lower.len(), 5 * MIB);
    assert_eq!(&lower[..MIB], wbuf.as_slice());
    assert!(lower[MIB..4 * MIB].iter().all(|b| *b == 0));
    assert_eq!(&lower[4 * MIB..], wbuf.as_slice());

    let mut rbuf = AlignedBuf::new(MIB);
    assert_eq!(f.read_at(rbuf.as_mut_slice(), 4 * MIB as u64).unwrap(), MIB);
    assert_eq!(rbuf.as_slice(), wbuf.as_slice());
    // O_DIRECT reads see what changed on the lower since (no page cache in the way).
    let fresh = pattern(10, 4096);
    File::options()
        .write(true)
        .open(m.lower_path("direct"))
        .unwrap()
        .write_all_at(&fresh, 0)
        .unwrap();
    let mut small = AlignedBuf::new(4096);
    assert_eq!(f.read_at(small.as_mut_slice(), 0).unwrap(), 4096);
    assert_eq!(small.as_slice(), &fresh[..]);
    // A short read at EOF.
    assert_eq!(f.read_at(rbuf.as_mut_slice(), 5 * MIB as u64).unwrap(), 0);
    close(f).unwrap();
}

fn mmap_write_then_read_is_coherent(mode: &str) {
    let m = mount(mode, &[]);
    const LEN: usize = MIB + 4096 * 3;
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.path("mapped"))
        .unwrap();
    f.set_len(LEN as u64).unwrap();
    let data = pattern(21, LEN);
    // Unmapped below before the fd is closed.
    let mut map = SharedMap::new(&f, LEN, true);
    map.write_at(0, &data);
    map.msync();
    // After msync the lower has it.
    assert_eq!(
        checksum(&fs::read(m.lower_path("mapped")).unwrap()),
        checksum(&data),
        "lower after msync"
    );
    // A write(2) is seen by the live mapping.
    f.write_all_at(b"written by write(2)", 8192).unwrap();
    assert_eq!(&map.bytes()[8192..8192 + 19], b"written by write(2)");
    map.unmap();
    let mut want = data.clone();
    want[8192..8192 + 19].copy_from_slice(b"written by write(2)");
    // read(2) through a new fd sees the mapping's writes.
    assert_eq!(
        checksum(&fs::read(m.path("mapped")).unwrap()),
        checksum(&want)
    );
    assert_eq!(
        checksum(&fs::read(m.lower_path("mapped")).unwrap()),
        checksum(&want)
    );
    // A read-only mapping of another open sees the same bytes.
    let r = File::open(m.path("mapped")).unwrap();
    let map = SharedMap::new(&r, LEN, false);
    assert_eq!(checksum(map.bytes()), checksum(&want));
    map.unmap();
    close(f).unwrap();
}

/// Two processes append 1,000 lines each through their own O_APPEND fds at the same time:
/// 2,000 whole lines, none torn or lost, each process's in order. The writers must really
/// interleave for this to mean anything; a run where one finished before the other started
/// (scheduling on a loaded VM) is repeated on a fresh file.
fn o_append_from_two_processes(mode: &str) {
    let m = mount(mode, &[]);
    for attempt in 0..5 {
        let name = format!("log{attempt}");
        let switches = append_from_two_processes(&m, &name);
        eprintln!("{mode}: attempt {attempt}: the two writers alternated {switches} times");
        if switches >= 10 {
            return;
        }
    }
    panic!("the two appending processes never interleaved");
}

/// One run of [`o_append_from_two_processes`] on file `name`; returns how many times the
/// lines in the file switch from one process to the other.
fn append_from_two_processes(m: &Mounted, name: &str) -> usize {
    const LINES: usize = 1000;
    let path = cpath(&m.path(name));
    fs::write(m.path(name), b"").unwrap();
    let lines: Vec<Vec<Vec<u8>>> = (0..2)
        .map(|p| {
            (0..LINES)
                .map(|i| format!("process {p} line {i:04} {}\n", "x".repeat(40)).into_bytes())
                .collect()
        })
        .collect();
    // Each child opens the file, says so on `ready`, and waits for its byte on `go`; the
    // parent sends both bytes once both children are ready. (A fixed 100 ms for the children
    // to reach the barrier is outrun by a loaded machine, and a start signal by EOF waited for
    // every copy of the write end, which a process forked meanwhile by another test thread
    // also held: the pipes are close-on-exec.)
    let mut fds = [0; 4];
    // SAFETY: valid out-arrays for two fds each.
    unsafe {
        assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
        assert_eq!(libc::pipe2(fds.as_mut_ptr().add(2), libc::O_CLOEXEC), 0);
    }
    let (go_r, go_w, ready_r, ready_w) = (fds[0], fds[1], fds[2], fds[3]);
    std::thread::scope(|s| {
        let children: Vec<_> = (0..2)
            .map(|p| {
                let (path, lines) = (&path, &lines[p]);
                s.spawn(move || {
                    // SAFETY: raw syscalls on fds and NUL-terminated paths prepared before the fork;
                    // the buffers are locals valid for their lengths.
                    in_child(None, || unsafe {
                        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_APPEND);
                        let open_errno = last_errno();
                        let b = 1u8;
                        libc::write(ready_w, (&b as *const u8).cast(), 1);
                        if fd < 0 {
                            return open_errno;
                        }
                        let mut b = 0u8;
                        if libc::read(go_r, (&mut b as *mut u8).cast(), 1) != 1 {
                            return 202;
                        }
                        for l in lines {
                            if libc::write(fd, l.as_ptr().cast(), l.len()) != l.len() as isize {
                                return 200;
                            }
                            libc::sched_yield();
                        }
                        if libc::close(fd) != 0 {
                            return 201;
                        }
                        0
                    })
                })
            })
            .collect();
        // Both ready (each writes its byte, opened or not), then both go.
        let mut ready = 0;
        while ready < 2 {
            let mut pfd = libc::pollfd {
                fd: ready_r,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, 30_000) };
            assert!(
                n > 0 || last_errno() == libc::EINTR,
                "the children never got ready"
            );
            if n > 0 {
                let mut buf = [0u8; 2];
                // SAFETY: our own pipe, into a local buffer of its length.
                let r = unsafe { libc::read(ready_r, buf.as_mut_ptr().cast(), 2 - ready) };
                assert!(r > 0, "ready pipe: {}", std::io::Error::last_os_error());
                ready += r as usize;
            }
        }
        let go = [1u8; 2];
        // SAFETY: our own pipe, from a local buffer of its length.
        assert_eq!(unsafe { libc::write(go_w, go.as_ptr().cast(), 2) }, 2);
        let codes: Vec<i32> = children.into_iter().map(|c| c.join().unwrap()).collect();
        // SAFETY: our own pipe fds, closed once, after both children have exited.
        unsafe {
            for fd in fds {
                libc::close(fd);
            }
        }
        for (p, c) in codes.into_iter().enumerate() {
            assert_eq!(c, 0, "process {p}");
        }
    });

    let mut switches_seen = Vec::new();
    for (what, path) in [("mount", m.path(name)), ("lower", m.lower_path(name))] {
        let text = fs::read_to_string(&path).unwrap();
        let got: Vec<&str> = text.lines().collect();
        assert_eq!(got.len(), 2 * LINES, "{what}");
        let mut next = [0usize; 2];
        let mut switches = 0;
        let mut last = None;
        for l in &got {
            let p = usize::from(l.as_bytes()[8].wrapping_sub(b'0'));
            assert!(p < 2, "{what}: torn line {l:?}");
            assert_eq!(
                format!("{l}\n").as_bytes(),
                lines[p][next[p]].as_slice(),
                "{what}: process {p} out of order or torn"
            );
            next[p] += 1;
            if last.is_some_and(|q| q != p) {
                switches += 1;
            }
            last = Some(p);
        }
        assert_eq!(next, [LINES, LINES], "{what}");
        switches_seen.push(switches);
    }
    assert_eq!(switches_seen[0], switches_seen[1], "mount and lower agree");
    switches_seen[0]
}

/// Four threads write 32 MiB each to their own files at the same time; every byte arrives, as
/// checksums through the mount and on the lower show.
fn concurrent_writers_with_checksums(mode: &str) {
    let m = mount(mode, &[]);
    const THREADS: u64 = 4;
    const CHUNKS: usize = 32;
    let sums: Vec<(u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let p = m.path(&format!("w{t}"));
                s.spawn(move || {
                    let f = File::create(&p).unwrap();
                    let mut sum = Checksum::default();
                    for c in 0..CHUNKS {
                        let chunk = pattern(t * 1000 + c as u64, MIB);
                        sum.update(&chunk);
                        f.write_all_at(&chunk, (c * MIB) as u64).unwrap();
                    }
                    close(f).unwrap();
                    sum.finish()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (t, want) in sums.iter().enumerate() {
        assert_eq!(want.1, (CHUNKS * MIB) as u64);
        assert_eq!(
            file_checksum(&m.path(&format!("w{t}"))),
            *want,
            "w{t} through the mount"
        );
        assert_eq!(
            file_checksum(&m.lower_path(&format!("w{t}"))),
            *want,
            "w{t} on the lower"
        );
    }
}

fn sparse_files_stay_sparse(mode: &str) {
    let m = mount(mode, &[]);
    const GIB: u64 = 1 << 30;
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.path("sparse"))
        .unwrap();
    f.write_all_at(b"head", 0).unwrap();
    f.write_all_at(b"tail", GIB).unwrap();
    f.sync_all().unwrap();
    let l = fs::metadata(m.lower_path("sparse")).unwrap();
    assert_eq!(l.len(), GIB + 4);
    assert!(
        l.blocks() <= 64,
        "{} blocks allocated on the lower",
        l.blocks()
    );
    let s = fs::metadata(m.path("sparse")).unwrap();
    assert_eq!((s.len(), s.blocks()), (l.len(), l.blocks()));
    assert_eq!(
        pread(&f, GIB / 2, 65536),
        vec![0u8; 65536],
        "a hole reads as zeros"
    );
    assert_eq!(pread(&f, GIB - 2, 10), b"\0\0tail");
    assert_eq!(pread(&f, 0, 4), b"head");
    // Growing with truncate keeps it sparse.
    f.set_len(4 * GIB).unwrap();
    let l = fs::metadata(m.lower_path("sparse")).unwrap();
    assert_eq!(l.len(), 4 * GIB);
    assert!(l.blocks() <= 64);
    assert_eq!(pread(&f, 4 * GIB - 4, 100), vec![0u8; 4]);
    // cp --sparse style copy through the mount: SEEK_DATA finds the two extents only.
    assert_eq!(lseek(&f, 4096, libc::SEEK_DATA).unwrap(), GIB as i64);
}

/// A write, truncate, fallocate or copy_file_range by a user without CAP_FSETID clears
/// set-user-ID and set-group-ID (the latter when group-executable or the user is not in the
/// file's group) exactly as the lower itself does
/// (FUSE_HANDLE_KILLPRIV_V2 leaves that to drainfs, and passthrough writes never reach it).
fn write_or_truncate_by_another_user_clears_suid_sgid(mode: &str) {
    let m = mount(mode, &[]);
    const U: u32 = 4242;
    type Body = fn(&std::ffi::CString, &std::ffi::CString) -> i32;
    // SAFETY: raw syscalls on a NUL-terminated path prepared before the fork; the fd is
    // closed once.
    let write: Body = |p, _| unsafe {
        let fd = libc::open(p.as_ptr(), libc::O_WRONLY);
        if fd < 0 {
            return last_errno();
        }
        let r = libc::pwrite(fd, b"X".as_ptr().cast(), 1, 0);
        libc::close(fd);
        if r == 1 { 0 } else { 100 }
    };
    // SAFETY: truncate(2) on a NUL-terminated path.
    let trunc: Body = |p, _| unsafe {
        if libc::truncate(p.as_ptr(), 1) < 0 {
            last_errno()
        } else {
            0
        }
    };
    // SAFETY: raw syscalls on a NUL-terminated path; the fd is closed once.
    let falloc: Body = |p, _| unsafe {
        let fd = libc::open(p.as_ptr(), libc::O_WRONLY);
        if fd < 0 {
            return last_errno();
        }
        let r = libc::fallocate(fd, 0, 0, 8192);
        libc::close(fd);
        if r == 0 { 0 } else { last_errno() }
    };
    // SAFETY: raw syscalls on NUL-terminated paths; the offsets are locals valid for the
    // call, and each fd is closed once.
    let cfr: Body = |p, src| unsafe {
        let (fi, fo) = (
            libc::open(src.as_ptr(), libc::O_RDONLY),
            libc::open(p.as_ptr(), libc::O_WRONLY),
        );
        if fi < 0 || fo < 0 {
            return 101;
        }
        let (mut oi, mut oo) = (0i64, 0i64);
        let r = libc::copy_file_range(fi, &mut oi, fo, &mut oo, 2, 0);
        libc::close(fi);
        libc::close(fo);
        if r == 2 { 0 } else { 102 }
    };
    // (file, mode, group of the file, what the user does)
    let cases: [(&str, u32, u32, Body); 6] = [
        ("write", 0o6777, 0, write),
        ("write-sgid-no-gx", 0o2666, 0, write),
        ("write-sgid-no-gx-own-group", 0o2666, U, write),
        ("truncate", 0o6777, 0, trunc),
        ("fallocate", 0o6777, 0, falloc),
        ("copy_file_range", 0o6777, 0, cfr),
    ];
    // The same scenario on the lower directly gives the expected modes and contents.
    let scenario = |dir: &std::path::Path| -> Vec<(u32, Vec<u8>)> {
        let src = dir.join("src");
        fs::write(&src, b"SRC").unwrap();
        let srcc = cpath(&src);
        cases
            .iter()
            .map(|(name, mode, gid, body)| {
                let p = dir.join(name);
                fs::write(&p, b"data").unwrap();
                std::os::unix::fs::chown(&p, None, Some(*gid)).unwrap();
                fs::set_permissions(&p, Permissions::from_mode(*mode)).unwrap();
                let pc = cpath(&p);
                assert_eq!(as_user(U, U, || body(&pc, &srcc)), 0, "{name} as {U}");
                (
                    fs::metadata(&p).unwrap().mode() & 0o7777,
                    fs::read(&p).unwrap(),
                )
            })
            .collect()
    };
    let local = tempfile::tempdir_in(&m.lower).unwrap();
    fs::set_permissions(local.path(), Permissions::from_mode(0o755)).unwrap();
    let want = scenario(local.path());
    assert_eq!(
        want.iter().map(|w| w.0).collect::<Vec<_>>(),
        [0o777, 0o666, 0o2666, 0o777, 0o777, 0o777],
        "test assumption: what the lower does"
    );
    let got = scenario(&m.path(""));
    for (i, (name, _, _, _)) in cases.iter().enumerate() {
        assert_eq!(got[i], want[i], "{name} through the mount");
        let l = fs::metadata(m.lower_path(name)).unwrap().mode() & 0o7777;
        assert_eq!(l, want[i].0, "{name} on the lower");
    }

    // Opens of a set-user-ID file by an unprivileged writer next to root's opens: neither
    // order fails, and the bit is gone after the write.
    let f = m.path("shared-suid");
    fs::write(&f, b"data").unwrap();
    fs::set_permissions(&f, Permissions::from_mode(0o4777)).unwrap();
    let fc = cpath(&f);
    // Root holds a reader (a passthrough open in `always`) while the user writes.
    let reader = File::open(&f).unwrap();
    assert_eq!(as_user(U, U, || write(&fc, &fc)), 0);
    assert_eq!(pread(&reader, 0, 10), b"Xata");
    drop(reader);
    assert_eq!(
        fs::metadata(m.lower_path("shared-suid")).unwrap().mode() & 0o7777,
        0o777
    );
    // The user's writer is open first; root opens and reads while it is held.
    fs::set_permissions(&f, Permissions::from_mode(0o4777)).unwrap();
    let mut fds = [0; 4];
    // SAFETY: valid out-arrays for two pipes.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        assert_eq!(libc::pipe(fds.as_mut_ptr().add(2)), 0);
    }
    let (opened_r, opened_w, go_r, go_w) = (fds[0], fds[1], fds[2], fds[3]);
    std::thread::scope(|s| {
        let child = s.spawn(|| {
            // SAFETY: raw syscalls on a NUL-terminated path and pipe fds prepared before the
            // fork; the buffers are locals valid for their lengths.
            as_user(U, U, || unsafe {
                let fd = libc::open(fc.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return last_errno();
                }
                if libc::pwrite(fd, b"Y".as_ptr().cast(), 1, 1) != 1 {
                    return 100;
                }
                libc::write(opened_w, b"o".as_ptr().cast(), 1);
                let mut b = 0u8;
                libc::read(go_r, (&mut b as *mut u8).cast(), 1);
                if libc::pwrite(fd, b"Z".as_ptr().cast(), 1, 2) != 1 {
                    return 101;
                }
                libc::close(fd);
                0
            })
        });
        let mut b = 0u8;
        // SAFETY: our pipe, a one-byte buffer.
        let n = unsafe { libc::read(opened_r, (&mut b as *mut u8).cast(), 1) };
        assert_eq!(n, 1);
        let r = File::open(&f).expect("root's open next to the user's writer");
        assert_eq!(pread(&r, 0, 10), b"XYta");
        // SAFETY: our pipe.
        unsafe { libc::write(go_w, b"g".as_ptr().cast(), 1) };
        assert_eq!(child.join().unwrap(), 0);
        assert_eq!(pread(&r, 0, 10), b"XYZa");
    });
    // SAFETY: our own pipe fds, closed once.
    unsafe {
        for fd in fds {
            libc::close(fd);
        }
    }
    assert_eq!(
        fs::metadata(m.lower_path("shared-suid")).unwrap().mode() & 0o7777,
        0o777
    );
    assert_eq!(fs::read(m.lower_path("shared-suid")).unwrap(), b"XYZa");
}

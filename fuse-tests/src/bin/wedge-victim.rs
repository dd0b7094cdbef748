//! A process that gets stuck on a file whose FUSE daemon never answers (see
//! `fuse_tests::wedge`), in one of three ways, and stays stuck until its connection is
//! aborted or it is killed:
//!
//! - `read PATH`: an `O_DIRECT` read(2) of it (a READ in the daemon's hands: `D`).
//! - `fault PATH`: a page fault on a shared read-only mapping of it (`D`).
//! - `mem PATH [WRITABLE]`: maps it (shared and writable when `WRITABLE` is a path to open
//!   for writing instead, so the process is also a writer on that file's file system), then
//!   one thread reads the mapped page through `/proc/self/mem` (a remote access: the fault is
//!   taken with the process's own `mmap_lock` held for reading, and never retried without
//!   it), and another thread then asks for the `mmap_lock` for writing (`mmap` of an
//!   anonymous page) and waits behind it. From then on every reader of the process's memory
//!   map queues behind that writer: `/proc/PID/cmdline`, `environ`, and on some kernels
//!   `maps`.
//! - `mmaplock PATH [WRITABLE]`: opens it with `O_DSYNC` (the wedged mount answers with
//!   direct I/O) and maps it privately: the kernel drops the file's cached pages first,
//!   with the process's `mmap_lock` held for writing, and waits for a page whose READ is
//!   never answered (another process must be faulting on the same file: `fault PATH`). From
//!   then on every reader of the process's memory map waits, `/proc/PID/maps` too. With
//!   `WRITABLE`, that file is mapped shared and writable first (and its fd closed): the
//!   process writes on that file's file system, which only its `maps` shows.
//!
//! Prints `stuck` on stdout before the call that sticks (the last one is made after it).

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

fn map(f: &std::fs::File, writable: bool) -> *mut libc::c_void {
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: a fresh shared mapping of a whole page of an open file.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            prot,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert!(
        p != libc::MAP_FAILED,
        "mmap: {}",
        std::io::Error::last_os_error()
    );
    p
}

fn stuck() {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "stuck");
    let _ = out.flush();
}

fn main() {
    // Dies with the test that started it, even if that test is killed before its cleanup
    // (the wedge's connection ends with the test's /dev/fuse fd, which wakes it up to die).
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let args: Vec<String> = std::env::args().collect();
    let (mode, path) = (args[1].as_str(), &args[2]);
    match mode {
        "read" => {
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .expect("open");
            stuck();
            let mut buf = vec![0u8; 1 << 16];
            let r = std::io::Read::read(&mut f, &mut buf);
            eprintln!("read returned {r:?}");
        }
        "fault" => {
            let f = std::fs::File::open(path).expect("open");
            let p = map(&f, false);
            stuck();
            // SAFETY: reads the first byte of the page mapped above.
            let b = unsafe { std::ptr::read_volatile(p as *const u8) };
            eprintln!("fault returned {b}");
        }
        "mem" => {
            let f = std::fs::File::open(path).expect("open");
            let p = map(&f, false) as usize;
            // A writer too, when asked: a shared writable mapping of another file.
            let _w = args.get(3).map(|w| {
                let wf = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(w)
                    .expect("open the writable file");
                map(&wf, true)
            });
            let mem = std::fs::File::open("/proc/self/mem").expect("/proc/self/mem");
            std::thread::spawn(move || {
                let mut b = [0u8; 1];
                let r = std::os::unix::fs::FileExt::read_at(&mem, &mut b, p as u64);
                eprintln!("/proc/self/mem read returned {r:?}");
            });
            std::thread::sleep(std::time::Duration::from_millis(300));
            stuck();
            // SAFETY: a fresh anonymous mapping; it waits for the mmap_lock.
            let q = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            eprintln!("anonymous mmap returned {q:?}");
        }
        "mmaplock" => {
            let _w = args.get(3).map(|w| {
                let wf = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(w)
                    .expect("open the writable file");
                map(&wf, true)
            });
            let f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DSYNC)
                .open(path)
                .expect("open");
            // Over an existing mapping (MAP_FIXED): the kernel write-locks that mapping first,
            // so a reader of the map cannot step over it while the call waits.
            // SAFETY: a fresh anonymous mapping of two pages.
            let anon = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    8192,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert!(anon != libc::MAP_FAILED);
            stuck();
            // SAFETY: replaces the first page of the anonymous mapping made above, which
            // nothing uses, with a private read-only mapping of an open file.
            let p = unsafe {
                libc::mmap(
                    anon,
                    4096,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_FIXED,
                    f.as_raw_fd(),
                    0,
                )
            };
            eprintln!("private mmap returned {p:?}");
        }
        other => panic!("unknown mode {other}"),
    }
    // Stay until killed.
    loop {
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

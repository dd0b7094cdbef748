use super::*;
use crate::accounting::Outstanding;
use crate::relay::proto::tests::request;

fn hdr(m: &[u8]) -> InHeader {
    InHeader::parse(m).unwrap()
}

struct T {
    acct: Arc<Accounting>,
    s: Inflight,
}

impl T {
    fn new() -> T {
        let acct = Accounting::new();
        T {
            s: Inflight::new(Arc::clone(&acct)),
            acct,
        }
    }

    /// Counts, reads the door, admits: in the engine's order.
    fn admit(&mut self, opcode: u32, unique: u64, body: &[u8]) -> Admit {
        let m = request(opcode, unique, 1, body);
        let h = hdr(&m);
        let g = self.acct.op_owned(accounting_op(h.opcode));
        let door = self.acct.door_open();
        self.s.admit(&h, InHeader::body(&m), g, door)
    }

    fn out(&self) -> Outstanding {
        self.acct.outstanding()
    }
}

fn open_in(flags: i32) -> Vec<u8> {
    let mut b = (flags as u32).to_le_bytes().to_vec();
    b.extend_from_slice(&[0; 4]);
    b
}

fn release_in(fh: u64, flags: i32) -> Vec<u8> {
    let mut b = fh.to_le_bytes().to_vec();
    b.extend_from_slice(&(flags as u32).to_le_bytes());
    b.extend_from_slice(&[0; 12]);
    b
}

fn open_out(fh: u64) -> Vec<u8> {
    let mut b = fh.to_le_bytes().to_vec();
    b.extend_from_slice(&[0; 8]);
    b
}

fn in_flight(t: &T, op: Op) -> i64 {
    t.acct
        .op_stats(op)
        .in_flight
        .load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn no_reply_opcodes_are_never_in_flight() {
    let mut t = T::new();
    for (op, u) in [(2, 2), (42, 4), (36, 7), (41, 8)] {
        assert_eq!(t.admit(op, u, &[0; 16]), Admit::Forward);
    }
    assert_eq!(t.out().in_flight, 0);
    assert_eq!(t.s.counters.forgets, 2);
    let forgets = t
        .acct
        .op_stats(Op::Forget)
        .count
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(forgets, 2);
    // Unknown opcodes expect a reply, counted as `other`.
    assert_eq!(t.admit(9999, 10, &[]), Admit::Forward);
    assert_eq!(in_flight(&t, Op::Other), 1);
    assert_eq!(t.out().in_flight, 1);
}

#[test]
fn handles_follow_open_replies_and_release_requests() {
    let mut t = T::new();
    assert_eq!(t.admit(14, 2, &open_in(libc::O_WRONLY)), Admit::Forward);
    assert_eq!(t.admit(14, 4, &open_in(libc::O_RDONLY)), Admit::Forward);
    assert_eq!(t.admit(27, 6, &open_in(0)), Admit::Forward);
    assert_eq!(t.admit(14, 8, &open_in(libc::O_RDWR)), Admit::Forward);
    let o = t.out();
    assert_eq!((o.in_flight, o.open_write), (4, 0));
    // Successful replies create handles (the same fh 0 twice, as libfuse examples do),
    // counted before the request stops counting.
    assert_eq!(t.s.on_reply(2, 0, &open_out(0)), Some(Opcode::Open));
    assert_eq!((t.out().in_flight, t.out().open_write), (4, 1));
    assert!(t.s.on_reply(4, 0, &open_out(0)).is_some());
    assert!(t.s.on_reply(6, 0, &open_out(0)).is_some());
    // A failed open creates none and counts an error.
    assert!(t.s.on_reply(8, -libc::EACCES, &[]).is_some());
    for u in [2, 4, 6, 8] {
        assert!(t.s.complete(u));
    }
    assert!(!t.s.complete(2));
    let errors = t
        .acct
        .op_stats(Op::Open)
        .errors
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(errors, 1);
    let o = t.out();
    assert_eq!(
        (o.in_flight, o.open_read, o.open_write, o.open_dirs),
        (0, 1, 1, 1)
    );
    assert!(!o.is_idle());
    // RELEASE (a request) removes the write handle at once, before its reply. The handle
    // was opened for writing and never flushed: the relay's own FSYNC goes first, in
    // flight as well.
    let Admit::SyncFirst {
        fsync_unique,
        fh: 0,
        local_release: false,
    } = t.admit(18, 10, &release_in(0, libc::O_WRONLY))
    else {
        panic!("an unflushed write handle's RELEASE syncs first");
    };
    assert!(is_own_unique(fsync_unique) && fsync_unique & 1 == 0);
    let o = t.out();
    assert_eq!((o.in_flight, o.open_write, o.open_read), (2, 0, 1));
    assert_eq!(t.s.on_reply(fsync_unique, 0, &[]), Some(Opcode::Fsync));
    t.s.complete(fsync_unique);
    t.s.complete(10);
    t.admit(29, 12, &release_in(0, 0));
    t.s.complete(12);
    t.admit(18, 14, &release_in(0, 0));
    t.s.complete(14);
    assert!(t.out().is_idle());
}

#[test]
fn door_refuses_namespace_changes_only_after_closing() {
    let mut t = T::new();
    assert_eq!(t.admit(35, 2, &open_in(libc::O_WRONLY)), Admit::Forward);
    t.acct.close_door();
    for op in [14, 35, 9, 8, 6, 13, 12, 45, 51] {
        assert_eq!(
            t.admit(op, 100 + u64::from(op) * 2, &open_in(0)),
            Admit::Reply(libc::ESHUTDOWN),
            "opcode {op}"
        );
    }
    // Work on existing handles still flows: WRITE, FLUSH, FSYNC, RELEASE, GETATTR.
    for (op, u) in [(16, 4), (25, 6), (20, 8), (18, 10), (3, 12)] {
        assert_eq!(t.admit(op, u, &[0; 24]), Admit::Forward);
    }
    let (closed, o) = t.acct.observe();
    assert!(closed);
    assert_eq!(o.in_flight, 6);
    assert_eq!(in_flight(&t, Op::Flush) + in_flight(&t, Op::Fsync), 2);
    assert_eq!(t.s.counters.door_refused, 9);
}

#[test]
fn daemon_gone_returns_everything_in_flight_and_fails_later_requests() {
    let mut t = T::new();
    t.admit(15, 2, &[]);
    t.admit(25, 4, &[]);
    t.admit(2, 6, &[0; 8]);
    let gone = t.s.daemon_gone();
    assert_eq!(gone.iter().map(|(u, _)| *u).collect::<Vec<_>>(), vec![2, 4]);
    assert_eq!(t.out().in_flight, 2, "counted until answered");
    drop(gone);
    assert_eq!(t.out().in_flight, 0);
    assert_eq!(t.admit(3, 8, &[]), Admit::Reply(libc::EIO));
    assert_eq!(t.admit(2, 10, &[0; 8]), Admit::Drop);
    assert_eq!(t.out().in_flight, 0);
}

#[test]
fn stopping_answers_eio_and_kernel_gone_releases_handles() {
    let mut t = T::new();
    t.admit(14, 2, &open_in(libc::O_WRONLY));
    t.s.on_reply(2, 0, &open_out(5));
    t.s.complete(2);
    assert_eq!(t.out().open_write, 1);
    t.s.begin_stop();
    assert_eq!(t.admit(1, 4, &[]), Admit::Reply(libc::EIO));
    assert_eq!(t.admit(36, 5, &[0; 8]), Admit::Drop);
    assert_eq!(t.s.counters.answered_daemon_gone, 1);
    assert_eq!(t.s.release_all_handles(), 1);
    assert!(t.out().is_idle());
}

#[test]
fn failed_flushes_of_write_handles_are_recorded() {
    let mut t = T::new();
    let flush_in = |fh: u64| {
        let mut b = fh.to_le_bytes().to_vec();
        b.extend_from_slice(&[0; 16]);
        b
    };
    // fh 7 open for writing, fh 8 read-only.
    assert_eq!(t.admit(14, 2, &open_in(libc::O_WRONLY)), Admit::Forward);
    t.s.on_reply(2, 0, &open_out(7));
    t.s.complete(2);
    assert_eq!(t.admit(14, 4, &open_in(libc::O_RDONLY)), Admit::Forward);
    t.s.on_reply(4, 0, &open_out(8));
    t.s.complete(4);
    // A WRITE of 4096 bytes is counted.
    let mut write_in = 7u64.to_le_bytes().to_vec();
    write_in.extend_from_slice(&0u64.to_le_bytes());
    write_in.extend_from_slice(&4096u32.to_le_bytes());
    write_in.extend_from_slice(&[0; 20]);
    assert_eq!(t.admit(16, 6, &write_in), Admit::Forward);
    assert_eq!(t.acct.bytes_written.load(Relaxed), 4096);
    // FLUSH of the read-only handle failing, and FLUSH answered ENOSYS: not uploads.
    t.admit(25, 8, &flush_in(8));
    t.s.on_reply(8, -libc::EIO, &[]);
    t.admit(25, 10, &flush_in(7));
    t.s.on_reply(10, -libc::ENOSYS, &[]);
    assert!(t.s.failed_flushes().is_empty());
    // FLUSH and FSYNC of the write handle failing: failed flushes.
    t.admit(25, 12, &flush_in(7));
    t.s.on_reply(12, -libc::EIO, &[]);
    t.admit(20, 14, &flush_in(7));
    t.s.on_reply(14, -libc::ENOSPC, &[]);
    assert_eq!(t.s.failed_flushes().len(), 2);
    // While stopping, a FLUSH of the write handle is answered EIO here: failed too; a
    // RELEASE of the read-only file is not.
    t.s.begin_stop();
    assert_eq!(t.admit(25, 16, &flush_in(7)), Admit::Reply(libc::EIO));
    assert_eq!(
        t.admit(18, 18, &release_in(8, libc::O_RDONLY)),
        Admit::Reply(libc::EIO)
    );
    assert_eq!(t.s.failed_flushes().len(), 3);
    assert_eq!(t.acct.lower_flush_errors.load(Relaxed), 3);
}

#[test]
fn unsynced_files_are_those_changed_since_their_last_flush() {
    let mut t = T::new();
    let fh_in = |fh: u64, len: usize| {
        let mut b = fh.to_le_bytes().to_vec();
        b.resize(len, 0);
        b
    };
    let names = |t: &T| t.s.unsynced_paths().len();
    // Opened for writing: unsynced until a FLUSH succeeds, even with no WRITE seen
    // (a MAP_SHARED page or the writeback cache changes the file without one).
    assert_eq!(t.admit(14, 2, &open_in(libc::O_WRONLY)), Admit::Forward);
    t.s.on_reply(2, 0, &open_out(7));
    t.s.complete(2);
    assert_eq!(names(&t), 1);
    t.admit(25, 3, &fh_in(7, 24));
    t.s.on_reply(3, 0, &[]);
    t.s.complete(3);
    assert_eq!(names(&t), 0);
    // A WRITE: unsynced until a FLUSH admitted after it succeeds.
    t.admit(16, 4, &fh_in(7, 40));
    t.s.complete(4);
    assert_eq!(names(&t), 1);
    t.admit(25, 6, &fh_in(7, 24));
    // A WRITE admitted while the FLUSH is in flight is not covered by it.
    t.admit(16, 8, &fh_in(7, 40));
    t.s.on_reply(6, 0, &[]);
    t.s.complete(6);
    assert_eq!(names(&t), 1);
    // A failed FSYNC covers nothing, and neither does a successful one (gcsfuse's
    // streaming writes publish only at a FLUSH); a successful FLUSH covers everything.
    t.admit(20, 10, &fh_in(7, 16));
    t.s.on_reply(10, -libc::EIO, &[]);
    assert_eq!(names(&t), 1);
    t.admit(20, 12, &fh_in(7, 16));
    t.s.on_reply(12, 0, &[]);
    assert_eq!(names(&t), 1);
    t.admit(25, 13, &fh_in(7, 24));
    t.s.on_reply(13, 0, &[]);
    assert_eq!(names(&t), 0);
    // CREATE starts unsynced.
    let mut create_in = vec![0u8; 16];
    create_in[..4].copy_from_slice(&(libc::O_WRONLY as u32).to_le_bytes());
    create_in.extend_from_slice(b"n\0");
    t.admit(35, 14, &create_in);
    let mut create_out = vec![0u8; proto::ENTRY_OUT_LEN];
    create_out[..8].copy_from_slice(&9u64.to_le_bytes());
    create_out.extend_from_slice(&open_out(8));
    t.s.on_reply(14, 0, &create_out);
    assert_eq!(t.s.unsynced_paths(), vec!["n".to_string()]);
}

#[test]
fn release_syncs_first_only_changes_no_flush_attempt_covered() {
    let mut t = T::new();
    let fh_in = |fh: u64, len: usize| {
        let mut b = fh.to_le_bytes().to_vec();
        b.resize(len, 0);
        b
    };
    // A failed FLUSH (the caller got its error, a failed flush is recorded): RELEASE is
    // forwarded as it is, and the file still counts as unsynced.
    t.admit(14, 2, &open_in(libc::O_WRONLY));
    t.s.on_reply(2, 0, &open_out(7));
    t.s.complete(2);
    t.admit(25, 4, &fh_in(7, 24));
    t.s.on_reply(4, -libc::EIO, &[]);
    t.s.complete(4);
    assert_eq!(t.s.unsynced_paths().len(), 1);
    assert_eq!(
        t.admit(18, 6, &release_in(7, libc::O_WRONLY)),
        Admit::Forward
    );
    t.s.complete(6);
    // A FLUSH answered ENOSYS attempted nothing: RELEASE syncs first, and an FSYNC answered
    // ENOSYS stops the relay's own FSYNCs.
    t.admit(14, 8, &open_in(libc::O_WRONLY));
    t.s.on_reply(8, 0, &open_out(9));
    t.s.complete(8);
    t.admit(25, 10, &fh_in(9, 24));
    t.s.on_reply(10, -libc::ENOSYS, &[]);
    t.s.complete(10);
    let Admit::SyncFirst { fsync_unique, .. } = t.admit(18, 12, &release_in(9, libc::O_WRONLY))
    else {
        panic!("no FSYNC before the RELEASE");
    };
    t.s.on_reply(fsync_unique, -libc::ENOSYS, &[]);
    t.s.complete(fsync_unique);
    t.s.complete(12);
    assert!(
        t.s.failed_flushes().len() == 1,
        "ENOSYS is not a failed flush"
    );
    t.admit(14, 14, &open_in(libc::O_WRONLY));
    t.s.on_reply(14, 0, &open_out(11));
    t.s.complete(14);
    assert_eq!(
        t.admit(18, 16, &release_in(11, libc::O_WRONLY)),
        Admit::Forward
    );
}

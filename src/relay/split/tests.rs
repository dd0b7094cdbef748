use super::*;
use crate::relay::proto::tests::{reply, request};

const READ: u32 = 15;
const WRITE: u32 = 16;

/// `fuse_read_in`/`fuse_write_in` for `fh` at `offset`, `size` bytes.
fn io_in(offset: u64, size: u32) -> Vec<u8> {
    let mut b = vec![0u8; IO_IN_LEN];
    b[0..8].copy_from_slice(&7u64.to_le_bytes());
    b[8..16].copy_from_slice(&offset.to_le_bytes());
    b[16..20].copy_from_slice(&size.to_le_bytes());
    b
}

fn read_req(unique: u64, offset: u64, size: u32) -> (InHeader, Vec<u8>) {
    let m = request(READ, unique, 3, &io_in(offset, size));
    (InHeader::parse(&m).unwrap(), m)
}

fn write_req(unique: u64, offset: u64, data: &[u8]) -> (InHeader, Vec<u8>) {
    let mut body = io_in(offset, data.len() as u32);
    body.extend_from_slice(data);
    let m = request(WRITE, unique, 3, &body);
    (InHeader::parse(&m).unwrap(), m)
}

/// (unique, offset, size) of a part.
fn part_args(m: &[u8]) -> (u64, u64, u32) {
    let h = InHeader::parse(m).unwrap();
    let (o, s) = io_args(m).unwrap();
    (h.unique, o, s)
}

fn answer(s: &mut Splits, unique: u64, error: i32, body: &[u8]) -> Option<(u64, Next)> {
    let m = reply(unique, error, body);
    s.on_reply(&OutHeader::parse(&m).unwrap(), &m)
}

#[test]
fn a_small_read_or_write_is_not_split() {
    let mut s = Splits::default();
    let (h, m) = read_req(2, 0, 4096);
    assert!(s.read(&h, &m, 4096, ReadParts::AtOnce).is_none());
    let (h, m) = write_req(4, 0, &[1; 4096]);
    assert!(s.write(&h, &m, 4096).is_none());
    assert_eq!(s.in_flight(), 0);
}

#[test]
fn a_read_answered_out_of_order_is_assembled_in_order() {
    let mut s = Splits::default();
    let (h, m) = read_req(10, 1 << 20, 10_000);
    let parts = s.read(&h, &m, 4096, ReadParts::AtOnce).unwrap();
    let args: Vec<_> = parts.iter().map(|p| part_args(p)).collect();
    assert_eq!(
        args.iter().map(|a| (a.1, a.2)).collect::<Vec<_>>(),
        vec![
            (1 << 20, 4096),
            ((1 << 20) + 4096, 4096),
            ((1 << 20) + 8192, 1808)
        ]
    );
    assert!(args.iter().all(|a| is_part_unique(a.0) && a.0 & 1 == 0));
    // The kernel's header fields other than len and unique are kept.
    assert_eq!(parts[0][4..8], m[4..8]);
    assert_eq!(parts[0][16..IN_HEADER_LEN], m[16..IN_HEADER_LEN]);
    assert_eq!(
        answer(&mut s, args[2].0, 0, &[3; 1808]),
        Some((10, Next::Wait))
    );
    assert_eq!(
        answer(&mut s, args[0].0, 0, &[1; 4096]),
        Some((10, Next::Wait))
    );
    let Some((10, Next::Reply(r))) = answer(&mut s, args[1].0, 0, &[2; 4096]) else {
        panic!("no reply")
    };
    let h = OutHeader::parse(&r).unwrap();
    assert_eq!((h.unique, h.error, h.len as usize), (10, 0, 16 + 10_000));
    let body = OutHeader::body(&r);
    assert!(body[..4096].iter().all(|b| *b == 1));
    assert!(body[4096..8192].iter().all(|b| *b == 2));
    assert!(body[8192..].iter().all(|b| *b == 3));
    assert_eq!(s.in_flight(), 0);
    assert!(
        answer(&mut s, args[1].0, 0, &[]).is_none(),
        "a part answered twice"
    );
}

#[test]
fn a_short_part_ends_the_read_there() {
    let mut s = Splits::default();
    let (h, m) = read_req(12, 0, 3 * 4096);
    let parts = s.read(&h, &m, 4096, ReadParts::AtOnce).unwrap();
    let u: Vec<_> = parts.iter().map(|p| part_args(p).0).collect();
    answer(&mut s, u[0], 0, &[1; 4096]);
    answer(&mut s, u[1], 0, &[2; 100]);
    let Some((_, Next::Reply(r))) = answer(&mut s, u[2], 0, &[]) else {
        panic!()
    };
    assert_eq!(OutHeader::body(&r).len(), 4196);
}

#[test]
fn any_parts_error_is_the_reads_error() {
    let mut s = Splits::default();
    let (h, m) = read_req(14, 0, 2 * 4096);
    let parts = s.read(&h, &m, 4096, ReadParts::AtOnce).unwrap();
    let u: Vec<_> = parts.iter().map(|p| part_args(p).0).collect();
    answer(&mut s, u[0], 0, &[1; 4096]);
    let Some((14, Next::Reply(r))) = answer(&mut s, u[1], -libc::EIO, &[]) else {
        panic!()
    };
    let h = OutHeader::parse(&r).unwrap();
    assert_eq!((h.error, h.len), (-libc::EIO, 16));
}

#[test]
fn a_write_goes_part_after_part_and_answers_the_total() {
    let mut s = Splits::default();
    let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let (h, m) = write_req(20, 500, &data);
    let mut part = s.write(&h, &m, 4096).unwrap();
    let mut seen = Vec::new();
    loop {
        let (u, off, size) = part_args(&part);
        assert_eq!(off, 500 + seen.len() as u64);
        assert_eq!(part.len(), IN_HEADER_LEN + IO_IN_LEN + size as usize);
        seen.extend_from_slice(&part[IN_HEADER_LEN + IO_IN_LEN..]);
        match answer(&mut s, u, 0, &(size).to_le_bytes().repeat(2)) {
            Some((20, Next::Send(p))) => part = p,
            Some((20, Next::Reply(r))) => {
                assert_eq!(proto::u32_at(OutHeader::body(&r), 0), Some(10_000));
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen, data);
    assert_eq!((s.in_flight(), s.parts_sent), (0, 3));
}

#[test]
fn a_short_or_failed_later_part_ends_the_write_short_and_a_failed_first_part_fails_it() {
    let mut s = Splits::default();
    let (h, m) = write_req(22, 0, &[9; 3 * 4096]);
    let p = s.write(&h, &m, 4096).unwrap();
    let Some((_, Next::Send(p))) = answer(&mut s, part_args(&p).0, 0, &[0, 16, 0, 0, 0, 0, 0, 0])
    else {
        panic!()
    };
    let Some((_, Next::Reply(r))) = answer(&mut s, part_args(&p).0, -libc::ENOSPC, &[]) else {
        panic!()
    };
    assert_eq!(proto::u32_at(OutHeader::body(&r), 0), Some(4096));

    let (h, m) = write_req(24, 0, &[9; 3 * 4096]);
    let p = s.write(&h, &m, 4096).unwrap();
    let Some((_, Next::Reply(r))) = answer(&mut s, part_args(&p).0, 0, &[10, 0, 0, 0, 0, 0, 0, 0])
    else {
        panic!()
    };
    assert_eq!(proto::u32_at(OutHeader::body(&r), 0), Some(10));

    let (h, m) = write_req(26, 0, &[9; 3 * 4096]);
    let p = s.write(&h, &m, 4096).unwrap();
    let Some((26, Next::Reply(r))) = answer(&mut s, part_args(&p).0, -libc::EIO, &[]) else {
        panic!()
    };
    assert_eq!(OutHeader::parse(&r).unwrap().error, -libc::EIO);
    assert_eq!(s.in_flight(), 0);
}

#[test]
fn a_cancelled_request_ignores_its_parts_replies() {
    let mut s = Splits::default();
    let (h, m) = read_req(30, 0, 2 * 4096);
    let parts = s.read(&h, &m, 4096, ReadParts::AtOnce).unwrap();
    s.cancel(30);
    assert!(answer(&mut s, part_args(&parts[0]).0, 0, &[0; 4096]).is_none());
    let (h, m) = read_req(32, 0, 2 * 4096);
    let parts = s.read(&h, &m, 4096, ReadParts::AtOnce).unwrap();
    s.clear();
    assert!(answer(&mut s, part_args(&parts[1]).0, 0, &[0; 4096]).is_none());
    assert_eq!(s.in_flight(), 0);
}

#[test]
fn in_order_a_read_sends_the_next_part_only_after_a_full_one_and_stops_at_a_short_one() {
    let mut s = Splits::default();
    let (h, m) = read_req(40, 8192, 4 * 4096);
    let first = s.read(&h, &m, 4096, ReadParts::InOrder).unwrap();
    assert_eq!(first.len(), 1);
    let (u0, off0, _) = part_args(&first[0]);
    assert_eq!(off0, 8192);
    let Some((40, Next::Send(p1))) = answer(&mut s, u0, 0, &[1; 4096]) else {
        panic!()
    };
    let (u1, off1, size1) = part_args(&p1);
    assert_eq!((off1, size1), (8192 + 4096, 4096));
    // Short: the end of the file; parts 2 and 3 are never sent.
    let Some((40, Next::Reply(r))) = answer(&mut s, u1, 0, &[2; 10]) else {
        panic!()
    };
    let body = OutHeader::body(&r);
    assert_eq!(body.len(), 4106);
    assert_eq!(&body[4096..], &[2; 10]);
    assert_eq!((s.in_flight(), s.parts_sent), (0, 2));

    let (h, m) = read_req(42, 0, 2 * 4096);
    let first = s.read(&h, &m, 4096, ReadParts::InOrder).unwrap();
    let Some((42, Next::Send(p1))) = answer(&mut s, part_args(&first[0]).0, 0, &[1; 4096]) else {
        panic!()
    };
    let Some((42, Next::Reply(r))) = answer(&mut s, part_args(&p1).0, 0, &[2; 4096]) else {
        panic!()
    };
    assert_eq!(OutHeader::body(&r).len(), 8192);

    let (h, m) = read_req(44, 0, 3 * 4096);
    let first = s.read(&h, &m, 4096, ReadParts::InOrder).unwrap();
    let Some((44, Next::Reply(r))) = answer(&mut s, part_args(&first[0]).0, -libc::EIO, &[]) else {
        panic!()
    };
    assert_eq!(OutHeader::parse(&r).unwrap().error, -libc::EIO);
    assert_eq!(s.in_flight(), 0);
}

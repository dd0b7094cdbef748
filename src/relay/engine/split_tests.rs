//! The relay's split of large READs and WRITEs, end to end through the engine, with the
//! socketpair stand-ins of [`super::tests`].

use std::time::Duration;

use super::tests::{Harness, init_in, init_out, recv, recv_within, send, start_with, unique_of};
use super::*;
use crate::relay::proto::tests::{reply, request};
use crate::relay::proto::{OutHeader, u32_at, u64_at};
use crate::relay::split::{ReadParts, is_part_unique};

const READ: u32 = 15;
const WRITE: u32 = 16;

/// A relay with a 16 KiB cap, 32 KiB WRITE parts and READ parts sent as `mode` says, INIT done
/// with a daemon that takes 1 MiB: returns the harness and the `max_write` the kernel was given.
fn split_relay(mode: ReadParts) -> (Harness, u32) {
    let mut limits = Limits::from_sndbufs(425_984, 425_984, 16 << 10).splitting(mode);
    limits.write_part = 32 << 10;
    let h = start_with(limits);
    send(&h.kernel, &request(26, 2, 0, &init_in(0, 0)));
    let _ = recv(h.d());
    send(
        h.d(),
        &reply(2, 0, &init_out(1 << 20, init::FUSE_MAX_PAGES, 256)),
    );
    let r = recv(&h.kernel);
    let _ = h.event();
    (h, u32_at(&r, 16 + 20).unwrap())
}

fn io_in(offset: u64, size: u32) -> Vec<u8> {
    let mut b = vec![0u8; 40];
    b[8..16].copy_from_slice(&offset.to_le_bytes());
    b[16..20].copy_from_slice(&size.to_le_bytes());
    b
}

fn the_kernel_keeps_the_daemons_max_write_and_a_large_read_is_answered_once_from_its_parts() {
    let (h, max_write) = split_relay(ReadParts::AtOnce);
    assert_eq!(max_write, 1 << 20, "the kernel gets the daemon's max_write");
    send(&h.kernel, &request(READ, 10, 5, &io_in(4096, 60 << 10)));
    // Four parts of at most 16 KiB reach the daemon at once.
    let parts: Vec<Vec<u8>> = (0..4).map(|_| recv(h.d())).collect();
    let mut offsets: Vec<(u64, u32)> = parts
        .iter()
        .map(|p| (u64_at(p, 48).unwrap(), u32_at(p, 56).unwrap()))
        .collect();
    offsets.sort();
    assert_eq!(
        offsets,
        vec![
            (4096, 16384),
            (4096 + 16384, 16384),
            (4096 + 32768, 16384),
            (4096 + 49152, 12288)
        ]
    );
    assert!(parts.iter().all(|p| is_part_unique(unique_of(p))));
    assert_eq!(h.relay.outstanding().in_flight, 1, "one kernel request");
    // Answered in reverse order, each with bytes naming its offset.
    for p in parts.iter().rev() {
        let (off, size) = (u64_at(p, 48).unwrap(), u32_at(p, 56).unwrap());
        send(
            h.d(),
            &reply(unique_of(p), 0, &vec![(off / 4096) as u8; size as usize]),
        );
    }
    let r = recv(&h.kernel);
    let oh = OutHeader::parse(&r).unwrap();
    assert_eq!((oh.unique, oh.error, oh.len), (10, 0, 16 + (60 << 10)));
    let body = OutHeader::body(&r);
    for (i, chunk) in body.chunks(4096).enumerate() {
        assert!(
            chunk.iter().all(|b| *b as usize == 1 + (i / 4) * 4),
            "page {i} out of order"
        );
    }
    assert_eq!(h.wait_outstanding(|o| o.in_flight == 0).in_flight, 0);
    assert_eq!(recv_within(&h.kernel, Duration::from_millis(50)), None);
}

fn a_large_write_goes_in_order_part_after_part_and_is_answered_with_its_total() {
    let (h, _) = split_relay(ReadParts::InOrder);
    let data: Vec<u8> = (0..100 * 1024u32).map(|i| (i / 7) as u8).collect();
    let mut body = io_in(0, data.len() as u32);
    body.extend_from_slice(&data);
    send(&h.kernel, &request(WRITE, 12, 5, &body));
    let mut got = Vec::new();
    while got.len() < data.len() {
        let p = recv(h.d());
        assert_eq!(u64_at(&p, 48), Some(got.len() as u64), "in offset order");
        let size = u32_at(&p, 56).unwrap();
        assert!(size <= 32 << 10);
        // The next part comes only after this one is answered.
        assert_eq!(recv_within(h.d(), Duration::from_millis(30)), None);
        got.extend_from_slice(&p[80..]);
        let mut out = size.to_le_bytes().to_vec();
        out.extend_from_slice(&[0; 4]);
        send(h.d(), &reply(unique_of(&p), 0, &out));
    }
    assert_eq!(got, data);
    let r = recv(&h.kernel);
    let oh = OutHeader::parse(&r).unwrap();
    assert_eq!((oh.unique, oh.error), (12, 0));
    assert_eq!(u32_at(OutHeader::body(&r), 0), Some(100 * 1024));
    let s = h.relay.status();
    assert_eq!(s.counts.split_requests, 1);
    assert_eq!(s.counts.split_parts, 4);
    assert_eq!(h.wait_outstanding(|o| o.in_flight == 0).in_flight, 0);
}

fn a_daemon_gone_mid_split_answers_the_kernels_request_once() {
    let (mut h, _) = split_relay(ReadParts::AtOnce);
    send(&h.kernel, &request(READ, 14, 5, &io_in(0, 64 << 10)));
    let first = recv(h.d());
    send(h.d(), &reply(unique_of(&first), 0, &[1; 16384]));
    drop(h.daemon.take());
    let r = recv(&h.kernel);
    let oh = OutHeader::parse(&r).unwrap();
    assert_eq!((oh.unique, oh.error), (14, -libc::EIO));
    assert_eq!(recv_within(&h.kernel, Duration::from_millis(50)), None);
    assert_eq!(h.wait_outstanding(|o| o.in_flight == 0).in_flight, 0);
}

fn a_large_readdir_asks_for_the_cap() {
    let (h, _) = split_relay(ReadParts::InOrder);
    send(&h.kernel, &request(28, 16, 1, &io_in(0, 64 << 10)));
    let got = recv(h.d());
    assert_eq!(unique_of(&got), 16);
    assert_eq!(u32_at(&got, 56), Some(16 << 10));
}

fn in_order_a_large_reads_parts_go_one_after_another() {
    let (h, _) = split_relay(ReadParts::InOrder);
    send(&h.kernel, &request(READ, 18, 5, &io_in(0, 40 << 10)));
    let mut body = Vec::new();
    for i in 0..3u8 {
        let p = recv(h.d());
        assert_eq!(u64_at(&p, 48), Some(u64::from(i) * 16384));
        assert_eq!(
            recv_within(h.d(), Duration::from_millis(30)),
            None,
            "one part at a time"
        );
        let size = u32_at(&p, 56).unwrap() as usize;
        send(h.d(), &reply(unique_of(&p), 0, &vec![i; size]));
        body.extend(std::iter::repeat_n(i, size));
    }
    let r = recv(&h.kernel);
    assert_eq!(OutHeader::parse(&r).unwrap().unique, 18);
    assert_eq!(OutHeader::body(&r), &body[..]);
    assert_eq!(h.wait_outstanding(|o| o.in_flight == 0).in_flight, 0);
}

super::tests::both_pumps!(
    the_kernel_keeps_the_daemons_max_write_and_a_large_read_is_answered_once_from_its_parts,
    a_large_write_goes_in_order_part_after_part_and_is_answered_with_its_total,
    a_daemon_gone_mid_split_answers_the_kernels_request_once,
    a_large_readdir_asks_for_the_cap,
    in_order_a_large_reads_parts_go_one_after_another,
);

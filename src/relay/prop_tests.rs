//! Property tests of the relay's framing and state: arbitrary bytes never panic a parser,
//! a split BATCH_FORGET keeps every entry, and the in-flight map and the accounting it counts
//! into stay balanced over arbitrary interleavings of kernel requests and daemon replies.

use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;

use super::inflight::{Admit, Inflight, accounting_op};
use super::init;
use super::names::Names;
use super::proto::tests::request;
use super::proto::{self, InHeader, Opcode, OutHeader};
use crate::accounting::Accounting;

/// Opcodes the relay treats specially, plus a few it only forwards.
const OPCODES: &[u32] = &[
    1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 20, 22, 23, 24, 25, 26, 27, 28, 29,
    30, 35, 36, 37, 39, 40, 42, 43, 44, 45, 47, 51, 52, 99,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn parsers_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..700), cap in 4096u32..=(1 << 20), nodeid: u64) {
        let _ = InHeader::parse(&bytes);
        let _ = OutHeader::parse(&bytes);
        let _ = proto::salvage_unique(&bytes);
        let _ = proto::direntplus_entries(&bytes);
        let _ = proto::split_batch_forget(&bytes, 4096);
        for &op in OPCODES {
            let op = Opcode::from_u32(op);
            let _ = proto::name_op(op, nodeid, &bytes);
            let _ = proto::reply_fh(op, &bytes);
        }
        let _ = init::rewrite_init_request(&mut bytes.clone());
        let _ = init::rewrite_init_reply(&mut bytes.clone(), cap);
    }

    #[test]
    fn a_split_batch_forget_keeps_every_entry(count in 0usize..3000, limit in 40usize..70_000) {
        let mut body = (count as u32).to_le_bytes().to_vec();
        body.extend_from_slice(&[0; 4]);
        for i in 0..count as u64 {
            body.extend_from_slice(&(i + 2).to_le_bytes());
            body.extend_from_slice(&(i % 7 + 1).to_le_bytes());
        }
        let msg = request(42, 0, 0, &body);
        let Some(parts) = proto::split_batch_forget(&msg, limit) else {
            // Only a limit that cannot hold one entry is refused.
            prop_assert!(limit < 40 + 8 + 16 && msg.len() > limit);
            return Ok(());
        };
        let mut entries = Vec::new();
        for p in &parts {
            prop_assert!(p.len() <= limit || parts.len() == 1);
            let h = InHeader::parse(p).unwrap();
            prop_assert_eq!(h.opcode, Opcode::BatchForget);
            let n = proto::u32_at(p, 40).unwrap() as usize;
            prop_assert_eq!(p.len(), 48 + 16 * n);
            entries.extend_from_slice(&p[48..]);
        }
        prop_assert_eq!(&entries[..], &body[8..]);
    }
}

/// One step of a random conversation.
#[derive(Debug, Clone)]
enum Step {
    /// A kernel request: opcode index, body bytes.
    Request(usize, Vec<u8>),
    /// The drain closes the door.
    CloseDoor,
    /// A daemon reply to the n-th pending request (modulo), with this error and body.
    Reply(usize, i32, Vec<u8>),
    /// The daemon's end closes.
    DaemonGone,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        20 => (0..OPCODES.len(), prop::collection::vec(any::<u8>(), 0..200))
            .prop_map(|(o, b)| Step::Request(o, b)),
        20 => (any::<usize>(), prop_oneof![Just(0), Just(0), Just(-2), Just(-5)],
              prop::collection::vec(any::<u8>(), 0..300))
            .prop_map(|(i, e, b)| Step::Reply(i, e, b)),
        1 => Just(Step::CloseDoor),
        1 => Just(Step::DaemonGone),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn in_flight_and_accounting_stay_balanced(steps in prop::collection::vec(step(), 1..120)) {
        let acct = Accounting::new();
        let mut s = Inflight::new(Arc::clone(&acct));
        let mut pending: BTreeSet<u64> = BTreeSet::new();
        let mut unique = 0u64;
        for st in steps {
            match st {
                Step::CloseDoor => acct.close_door(),
                Step::Request(o, body) => {
                    unique += 2;
                    let m = request(OPCODES[o], unique, 1 + unique % 5, &body);
                    let h = InHeader::parse(&m).unwrap();
                    let g = acct.op_owned(accounting_op(h.opcode));
                    let door_open = acct.door_open();
                    let a = s.admit(&h, InHeader::body(&m), g, door_open);
                    if a == Admit::Forward && h.opcode.expects_reply() {
                        pending.insert(unique);
                    }
                }
                Step::Reply(i, error, body) => {
                    if pending.is_empty() {
                        continue;
                    }
                    let u = *pending.iter().nth(i % pending.len()).unwrap();
                    let m = proto::tests::reply(u, error, &body);
                    let _ = s.on_reply(u, error, OutHeader::body(&m));
                    prop_assert!(s.complete(u));
                    pending.remove(&u);
                }
                Step::DaemonGone => {
                    let gone = s.daemon_gone();
                    prop_assert_eq!(gone.len(), pending.len());
                    pending.clear();
                }
            }
            prop_assert_eq!(s.in_flight(), pending.len());
            prop_assert_eq!(acct.outstanding().in_flight, pending.len() as i64);
            let _ = s.open_paths(10);
            let _ = s.admitted_paths(10);
        }
        // Everything answered and every handle released: nothing is outstanding.
        drop(s.daemon_gone());
        s.release_all_handles();
        let o = acct.outstanding();
        prop_assert_eq!((o.in_flight, o.open_read, o.open_write, o.open_dirs), (0, 0, 0, 0));
    }

    #[test]
    fn names_never_panic_and_stay_bounded(ops in prop::collection::vec(
        (0u8..5, 1u64..12, 1u64..12, prop::sample::select(vec!["a", "b", "c", "."]), 1u64..3),
        0..200,
    )) {
        let mut n = Names::default();
        for (kind, x, y, name, k) in ops {
            match kind {
                0 => n.entry(x, name.as_bytes(), y),
                1 => n.forget(x, k),
                2 => n.unlink(x, name.as_bytes()),
                3 => n.rename(x, name.as_bytes(), y, b"b", k == 2),
                _ => {
                    let _ = n.path(x);
                }
            }
            prop_assert!(n.len() <= 12);
        }
    }
}

use super::*;

/// Builds a kernel request: header (uid/gid/pid zero) + body.
pub fn request(opcode: u32, unique: u64, nodeid: u64, body: &[u8]) -> Vec<u8> {
    let mut m = vec![0u8; IN_HEADER_LEN];
    put_u32(&mut m, 0, (IN_HEADER_LEN + body.len()) as u32);
    put_u32(&mut m, 4, opcode);
    m[8..16].copy_from_slice(&unique.to_le_bytes());
    m[16..24].copy_from_slice(&nodeid.to_le_bytes());
    m.extend_from_slice(body);
    m
}

/// Builds a daemon reply: header + body.
pub fn reply(unique: u64, error: i32, body: &[u8]) -> Vec<u8> {
    let mut m = vec![0u8; OUT_HEADER_LEN];
    put_u32(&mut m, 0, (OUT_HEADER_LEN + body.len()) as u32);
    m[4..8].copy_from_slice(&error.to_le_bytes());
    m[8..16].copy_from_slice(&unique.to_le_bytes());
    m.extend_from_slice(body);
    m
}

#[test]
fn in_header_round_trip() {
    let m = request(14, 42, 7, &[1, 0, 0, 0, 0, 0, 0, 0]);
    let h = InHeader::parse(&m).unwrap();
    assert_eq!(h.opcode, Opcode::Open);
    assert_eq!((h.unique, h.nodeid, h.len), (42, 7, 48));
    assert_eq!(open_flags(InHeader::body(&m)), Some(1));
}

#[test]
fn malformed_lengths_are_errors_not_panics() {
    let cases: Vec<(Vec<u8>, ProtoError)> = vec![
        (vec![], ProtoError::Short { got: 0, need: 40 }),
        (vec![0; 7], ProtoError::Short { got: 7, need: 40 }),
        (vec![0; 39], ProtoError::Short { got: 39, need: 40 }),
        (
            {
                let mut m = request(3, 2, 1, &[]);
                put_u32(&mut m, 0, 41);
                m
            },
            ProtoError::LengthMismatch {
                header: 41,
                got: 40,
            },
        ),
        (
            {
                let mut m = request(3, 2, 1, &[0; 8]);
                put_u32(&mut m, 0, 40);
                m
            },
            ProtoError::LengthMismatch {
                header: 40,
                got: 48,
            },
        ),
    ];
    for (msg, want) in cases {
        assert_eq!(
            InHeader::parse(&msg),
            Err(want),
            "msg of {} bytes",
            msg.len()
        );
    }
    assert_eq!(
        OutHeader::parse(&[0; 15]),
        Err(ProtoError::Short { got: 15, need: 16 })
    );
    let mut r = reply(4, 0, &[0; 8]);
    put_u32(&mut r, 0, 16);
    assert_eq!(
        OutHeader::parse(&r),
        Err(ProtoError::LengthMismatch {
            header: 16,
            got: 24
        })
    );
    // A header claiming u32::MAX bytes.
    let mut r = reply(4, 0, &[]);
    put_u32(&mut r, 0, u32::MAX);
    assert!(OutHeader::parse(&r).is_err());
    assert_eq!(salvage_unique(&r), Some(4));
    assert_eq!(salvage_unique(&[0; 10]), None);
}

#[test]
fn error_reply_is_header_only_negative_errno() {
    let b = error_reply(0x10, libc::ESHUTDOWN);
    let h = OutHeader::parse(&b).unwrap();
    assert_eq!(h.len, 16);
    assert_eq!(h.error, -libc::ESHUTDOWN);
    assert_eq!(h.unique, 0x10);
}

#[test]
fn opcode_table() {
    for (v, op, reply, door) in [
        (2, Opcode::Forget, false, false),
        (42, Opcode::BatchForget, false, false),
        (36, Opcode::Interrupt, false, false),
        (41, Opcode::NotifyReply, false, false),
        (14, Opcode::Open, true, true),
        (35, Opcode::Create, true, true),
        (45, Opcode::Rename2, true, true),
        (25, Opcode::Flush, true, false),
        (18, Opcode::Release, true, false),
        (999, Opcode::Other(999), true, false),
    ] {
        let o = Opcode::from_u32(v);
        assert_eq!(o, op);
        assert_eq!(o.expects_reply(), reply, "{op:?}");
        assert_eq!(o.is_door_guarded(), door, "{op:?}");
    }
    assert!(is_write_intent(libc::O_WRONLY as u32));
    assert!(is_write_intent((libc::O_RDWR | libc::O_CREAT) as u32));
    assert!(!is_write_intent(libc::O_RDONLY as u32));
}

#[test]
fn name_ops_parse_each_layout() {
    let n = |s: &str| -> Box<[u8]> { s.as_bytes().into() };
    assert_eq!(
        name_op(Opcode::Lookup, 1, b"a\0"),
        Some(NameOp::Entry {
            parent: 1,
            name: n("a")
        })
    );
    let mut create = vec![0u8; 16];
    create.extend_from_slice(b"new.txt\0");
    assert_eq!(
        name_op(Opcode::Create, 7, &create),
        Some(NameOp::Entry {
            parent: 7,
            name: n("new.txt")
        })
    );
    assert_eq!(
        name_op(Opcode::Symlink, 7, b"ln\0target\0"),
        Some(NameOp::Entry {
            parent: 7,
            name: n("ln")
        })
    );
    let mut rename2 = 9u64.to_le_bytes().to_vec();
    rename2.extend_from_slice(&RENAME_EXCHANGE.to_le_bytes());
    rename2.extend_from_slice(&[0; 4]);
    rename2.extend_from_slice(b"a\0bb\0");
    assert_eq!(
        name_op(Opcode::Rename2, 3, &rename2),
        Some(NameOp::Rename {
            olddir: 3,
            old: n("a"),
            newdir: 9,
            new: n("bb"),
            exchange: true
        })
    );
    // Truncated bodies and names without their NUL are not names.
    assert_eq!(name_op(Opcode::Lookup, 1, b"a"), None);
    assert_eq!(name_op(Opcode::Create, 1, &[0u8; 10]), None);
    assert_eq!(name_op(Opcode::Rename, 1, &9u64.to_le_bytes()), None);
    assert_eq!(name_op(Opcode::Read, 1, b"a\0"), None);
}

#[test]
fn direntplus_records() {
    let rec = |nodeid: u64, name: &[u8]| {
        let mut r = vec![0u8; DIRENTPLUS_NAME_OFFSET];
        r[..8].copy_from_slice(&nodeid.to_le_bytes());
        r[ENTRY_OUT_LEN + 16..ENTRY_OUT_LEN + 20]
            .copy_from_slice(&(name.len() as u32).to_le_bytes());
        r.extend_from_slice(name);
        r.resize(r.len().div_ceil(8) * 8, 0);
        r
    };
    let mut body = rec(1, b".");
    body.extend(rec(5, b"file-one"));
    body.extend(rec(0, b"unlooked"));
    body.extend(rec(6, b"x"));
    let mut short = rec(7, b"cut");
    short.truncate(DIRENTPLUS_NAME_OFFSET + 1);
    body.extend(short);
    assert_eq!(
        direntplus_entries(&body),
        vec![(5, &b"file-one"[..]), (6, &b"x"[..])]
    );
}

#[test]
fn reply_fh_positions() {
    let mut open_out = vec![0u8; 16];
    open_out[..8].copy_from_slice(&77u64.to_le_bytes());
    assert_eq!(reply_fh(Opcode::Open, &open_out), Some(77));
    let mut create = vec![0u8; ENTRY_OUT_LEN];
    create.extend_from_slice(&open_out);
    assert_eq!(reply_fh(Opcode::Create, &create), Some(77));
    assert_eq!(reply_fh(Opcode::Create, &open_out), None);
    assert_eq!(reply_fh(Opcode::Read, &open_out), None);
}

fn batch_forget(n: u32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&n.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    for i in 0..n {
        body.extend_from_slice(&u64::from(i + 2).to_le_bytes());
        body.extend_from_slice(&1u64.to_le_bytes());
    }
    request(42, 100, 0, &body)
}

#[test]
fn batch_forget_split() {
    let m = batch_forget(10);
    assert_eq!(m.len(), 48 + 160);
    assert_eq!(split_batch_forget(&m, 4096).unwrap(), vec![m.clone()]);
    // 48 + 3 entries fit in 96 bytes.
    let parts = split_batch_forget(&m, 96).unwrap();
    assert_eq!(parts.len(), 4);
    let mut seen = Vec::new();
    for p in &parts {
        assert!(p.len() <= 96);
        let h = InHeader::parse(p).unwrap();
        assert_eq!(h.opcode, Opcode::BatchForget);
        let count = u32_at(p, 40).unwrap() as usize;
        assert_eq!(p.len(), 48 + count * 16);
        for i in 0..count {
            seen.push(u64_at(p, 48 + i * 16).unwrap());
        }
    }
    assert_eq!(seen, (2..12).collect::<Vec<u64>>());
    // Too small for one entry, or a count beyond the body.
    assert_eq!(split_batch_forget(&m, 60), None);
    let mut bad = batch_forget(10);
    put_u32(&mut bad, 40, 1000);
    assert_eq!(split_batch_forget(&bad, 96), None);
}

//! FLUSH semantics over a gcsfuse-like lower (bucketfs publishes only at FLUSH/FSYNC).
//!
//! In its own test binary, with the modes run one after another: any fork+exec in the same
//! process while the file is open (another test starting drainfs, say) closes an inherited
//! copy of the fd at exec, which is a FLUSH, and would publish the object early.

mod common;

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::time::Duration;

use common::*;
use fuse_tests::bucket::read_events;

#[test]
fn close_uploads_to_a_flush_only_lower_in_every_mode() {
    for mode in ["always", "never", "reads"] {
        close_uploads_to_a_flush_only_lower(mode);
    }
}

/// With a lower that publishes data only at FLUSH (like gcsfuse), the object exists in the
/// bucket the moment `close(2)` returns, and not before: FLUSH is forwarded inside close.
/// FSYNC publishes too.
fn close_uploads_to_a_flush_only_lower(mode: &str) {
    let s = over_bucketfs(mode, &[]);
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(s.m.path("obj"))
        .unwrap();
    let data = pattern(3, 300_000);
    f.write_all_at(&data, 0).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !s.bucket.join("obj").exists() || fs::read(s.bucket.join("obj")).unwrap().is_empty(),
        "published before any FLUSH/FSYNC"
    );
    close(f).unwrap();
    assert_eq!(
        fs::read(s.bucket.join("obj")).unwrap(),
        data,
        "in the bucket right after close returned"
    );
    let events = read_events(&s.events);
    assert!(
        events
            .iter()
            .any(|e| e.is("upload_done", "obj") && e.size == Some(data.len() as u64)),
        "{events:?}"
    );

    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(s.m.path("synced"))
        .unwrap();
    f.write_all_at(b"fsync publishes", 0).unwrap();
    f.sync_all().unwrap();
    assert_eq!(
        fs::read(s.bucket.join("synced")).unwrap(),
        b"fsync publishes",
        "in the bucket right after fsync returned"
    );
    close(f).unwrap();
}

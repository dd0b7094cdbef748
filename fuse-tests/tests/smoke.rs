//! Smoke test of the harness itself: mount, a round trip, clean stop.

use std::time::Duration;

use fuse_tests::harness::Mounted;

#[test]
fn mount_write_read_stop() {
    for mode in ["always", "never"] {
        let mut m = Mounted::new(mode);
        std::fs::write(m.path("hello.txt"), b"hi").unwrap();
        assert_eq!(std::fs::read(m.lower_path("hello.txt")).unwrap(), b"hi");
        let st = m.stop(Duration::from_secs(20));
        assert_eq!(st.code(), Some(0), "mode {mode}");
    }
}

//! A tracing layer for fuser's own log lines ([`StaleReplyFilter`]).

/// A tracing layer that drops fuser's "Failed to send FUSE reply" error when the write
/// failed with `ENOENT`: the kernel no longer waits for that request, which is what happens
/// to fuser's `ENOSYS` answer to every FUSE_INTERRUPT (an application's `close()` interrupted
/// by a signal): with one cloned `/dev/fuse` fd per worker thread, the interrupted request is
/// in another fd's processing queue, so the kernel finds nothing to answer. Nothing failed,
/// so no ERROR line. Any other reply failure is kept.
#[derive(Debug, Clone, Copy, Default)]
pub struct StaleReplyFilter;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for StaleReplyFilter {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        if *event.metadata().level() != tracing::Level::ERROR {
            return true;
        }
        struct Fields {
            fuser_reply: bool,
            enoent: bool,
        }
        impl tracing::field::Visit for Fields {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if field.name() == "log.target" {
                    self.fuser_reply = value == "fuser::reply";
                }
            }
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    let text = format!("{value:?}");
                    let enoent = format!("(os error {})", libc::ENOENT);
                    self.enoent =
                        text.starts_with("Failed to send FUSE reply") && text.ends_with(&enoent);
                }
            }
        }
        let mut f = Fields {
            fuser_reply: event.metadata().target() == "fuser::reply",
            enoent: false,
        };
        event.record(&mut f);
        !(f.fuser_reply && f.enoent)
    }
}

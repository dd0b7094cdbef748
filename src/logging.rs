//! Logging setup: human-readable text, or JSON with one object per line using Cloud
//! Logging's field names (`timestamp`, `severity`, `message`, then the event's fields), which
//! GKE's log agent parses into structured entries.
//!
//! The level comes from `--log-level`, else `RUST_LOG`, else `info`.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::{LogConfig, LogFormat};

/// Cloud Logging's severity name for a tracing level.
pub fn severity(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARNING",
        Level::INFO => "INFO",
        Level::DEBUG | Level::TRACE => "DEBUG",
    }
}

struct JsonVisitor(serde_json::Map<String, serde_json::Value>);

impl Visit for JsonVisitor {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(
            field.name().to_string(),
            serde_json::Value::String(format!("{value:?}")),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(
            field.name().to_string(),
            serde_json::Value::String(value.to_string()),
        );
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_string(), value.into());
    }
}

/// The JSON line format.
pub struct CloudJson;

impl<S, N> FormatEvent<S, N> for CloudJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut v = JsonVisitor(serde_json::Map::new());
        event.record(&mut v);
        let mut obj = serde_json::Map::new();
        obj.insert(
            "timestamp".into(),
            humantime::format_rfc3339_micros(std::time::SystemTime::now())
                .to_string()
                .into(),
        );
        obj.insert("severity".into(), severity(meta.level()).into());
        let message =
            v.0.remove("message")
                .unwrap_or_else(|| serde_json::Value::String(String::new()));
        obj.insert("message".into(), message);
        obj.insert("target".into(), meta.target().into());
        for (k, val) in v.0 {
            obj.insert(k, val);
        }
        let line = serde_json::to_string(&obj).map_err(|_| fmt::Error)?;
        writeln!(writer, "{line}")
    }
}

/// Installs the global subscriber (logs go to stderr). Idempotent: a second call is ignored.
pub fn init(cfg: &LogConfig) {
    let filter = cfg
        .level
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "info,fuser=error".to_string());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("drainfs: warning: bad log filter {filter:?} ({e}); using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        // A log reader that went away (a closed pipe) must not take the mount down: by default
        // tracing-subscriber reports a failed write with `eprintln!`, which panics on EPIPE.
        .log_internal_errors(false);
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let stale = crate::fuse::StaleReplyFilter;
    let _ = match cfg.format {
        LogFormat::Text => builder.with_target(false).finish().with(stale).try_init(),
        LogFormat::Json => builder
            .event_format(CloudJson)
            .finish()
            .with(stale)
            .try_init(),
    };
}

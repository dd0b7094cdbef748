//! Logging setup: human-readable text, or JSON with one object per line using Cloud
//! Logging's field names, which GKE's log agent parses into structured entries: `timestamp`
//! (RFC 3339, UTC), `severity` (`DEBUG`, `INFO`, `WARNING`, `ERROR`), `message`, `target`,
//! then the fields of the spans the event is in (outermost first; a failed request's
//! `unique`, `op`, `nodeid`, `name`) and the event's own fields, all flat.
//!
//! The JSON is tracing-subscriber's and tracing-serde's: span fields are recorded by
//! tracing-subscriber's [`JsonFields`], event fields serialized by tracing-serde. Only the
//! envelope is drainfs's ([`CloudJson`]): tracing-subscriber's own JSON format names the level
//! `level` with `WARN`, which Cloud Logging does not read as a severity, and the maintained
//! Cloud Logging layer (tracing-stackdriver) renames every field to camelCase and nests span
//! fields, which would change the documented field names.
//!
//! The gcsfuse drop-in uses the JSON format by default (`cli::dropin_args`): it logs to stdout,
//! where GKE's logging agent reads a JSON line's `severity` and files a text line as INFO.
//!
//! The level comes from `--log-level`, else `RUST_LOG`, else `info`.

use std::fmt;

use serde::ser::{SerializeMap, Serializer};
use serde_json::{Map, Value};
use tracing::{Event, Level, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_serde::fields::AsMap;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
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

/// The JSON line format: Cloud Logging's envelope around tracing-subscriber's span fields
/// and tracing-serde's event fields (see the module doc).
pub struct CloudJson;

impl<S> FormatEvent<S, JsonFields> for CloudJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        let mut fields = Map::new();
        for span in ctx.event_scope().into_iter().flat_map(|s| s.from_root()) {
            let ext = span.extensions();
            if let Some(f) = ext.get::<FormattedFields<JsonFields>>()
                && let Ok(Value::Object(m)) = serde_json::from_str::<Value>(f)
            {
                fields.extend(m);
            }
        }
        if let Ok(Value::Object(m)) = serde_json::to_value(event.field_map()) {
            // `log.*` fields are the `log` crate's metadata, already in `target`.
            fields.extend(m.into_iter().filter(|(k, _)| !k.starts_with("log.")));
        }
        let message = fields.remove("message").unwrap_or_else(|| "".into());
        let timestamp = humantime::format_rfc3339_micros(std::time::SystemTime::now());
        // Written key by key, so the envelope comes first in a fixed order.
        let mut buf = Vec::new();
        let mut ser = serde_json::Serializer::new(&mut buf);
        let mut map = ser.serialize_map(None).map_err(|_| fmt::Error)?;
        let e = |_| fmt::Error;
        map.serialize_entry("timestamp", &timestamp.to_string())
            .map_err(e)?;
        map.serialize_entry("severity", severity(meta.level()))
            .map_err(e)?;
        map.serialize_entry("message", &message).map_err(e)?;
        map.serialize_entry("target", meta.target()).map_err(e)?;
        for (k, v) in &fields {
            map.serialize_entry(k, v).map_err(e)?;
        }
        map.end().map_err(|_| fmt::Error)?;
        let text = String::from_utf8(buf).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// Installs the global subscriber (logs go to stderr, or stdout with `to_stdout`). Idempotent:
/// a second call is ignored.
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
        .with_writer(if cfg.to_stdout {
            tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stdout)
        } else {
            tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr)
        })
        .with_ansi(if cfg.to_stdout {
            std::io::stdout().is_terminal()
        } else {
            std::io::stderr().is_terminal()
        })
        // A log reader that went away (a closed pipe) must not take the mount down: by default
        // tracing-subscriber reports a failed write with `eprintln!`, which panics on EPIPE.
        .log_internal_errors(false);
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let stale = crate::fuse::StaleReplyFilter;
    let _ = match cfg.format {
        LogFormat::Text => builder.with_target(false).finish().with(stale).try_init(),
        LogFormat::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(CloudJson)
            .finish()
            .with(stale)
            .try_init(),
    };
}

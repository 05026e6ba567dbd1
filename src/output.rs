//! Every line ackd writes: tracing events rendered as one logfmt line each, on stdout.
//!
//! Fields are written in the order the event names them; the event's message, if any,
//! goes last as `msg=`. Levels other than info are written first as `level=`. Field
//! names `count#x`, `measure#x` and `sample#x` become `count#<prefix>.x` (l2met's
//! vocabulary under `ACKD_METRIC_PREFIX`), so call sites name metrics once, without the
//! prefix. Byte fields (message keys) are written with [`logfmt::write_bytes`].
//!
//! Writes go through a buffered, non-blocking writer thread: a slow log drain slows
//! ackd down (lines are never dropped) but a busy one costs a processor nothing.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::BufWriter;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::logfmt;

/// Keeps the writer thread alive; dropping it flushes every line still queued.
#[must_use = "dropping the guard stops log output"]
pub struct OutputGuard(#[allow(dead_code)] WorkerGuard);

/// Installs the logfmt subscriber. `level` is `ACKD_LOG_LEVEL`; `RUST_LOG`, when set and
/// valid, wins. Returns the guard and, when `RUST_LOG` was invalid, the reason.
pub fn init(level: &str, metric_prefix: &str) -> (OutputGuard, Option<String>) {
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("ackd-log")
        .finish(BufWriter::with_capacity(64 * 1024, std::io::stdout()));
    let mut rust_log_error = None;
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => match EnvFilter::try_new(&spec) {
            Ok(f) => f,
            Err(e) => {
                rust_log_error = Some(format!("RUST_LOG={spec:?} is not a valid filter: {e}"));
                EnvFilter::new(level)
            }
        },
        _ => EnvFilter::new(level),
    };
    let layer = tracing_subscriber::fmt::layer()
        .event_format(Logfmt::new(metric_prefix))
        .with_writer(writer)
        .with_ansi(false);
    // A second init (tests embedding ackd) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .try_init();
    (OutputGuard(guard), rust_log_error)
}

/// The event formatter.
pub struct Logfmt {
    prefix: String,
}

impl Logfmt {
    pub fn new(metric_prefix: &str) -> Self {
        Logfmt {
            prefix: metric_prefix.to_string(),
        }
    }

    /// Renders one event into `line` (without the newline).
    fn render(&self, event: &Event<'_>, line: &mut String, scratch: &mut String) {
        let meta = event.metadata();
        let level = *meta.level();
        if level != Level::INFO {
            logfmt::write_pair(line, "level", level_name(level));
        }
        let ours = meta.target().starts_with("ackd");
        if !ours {
            // librdkafka's own logs and any dependency's: say where they come from.
            let at = if meta.target().starts_with("librdkafka") {
                "librdkafka"
            } else {
                meta.target()
            };
            logfmt::write_pair(line, "at", at);
        }
        let mut visitor = FieldWriter {
            prefix: &self.prefix,
            line,
            scratch,
            message: None,
        };
        event.record(&mut visitor);
        if let Some(message) = visitor.message.take() {
            logfmt::write_pair(visitor.line, "msg", &message);
        }
    }
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

thread_local! {
    /// Reused per thread so a line costs no allocation beyond the writer's copy of it.
    static BUFFERS: RefCell<(String, String)> = const { RefCell::new((String::new(), String::new())) };
}

impl<S, N> FormatEvent<S, N> for Logfmt
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        BUFFERS.with(|b| {
            let mut b = b.borrow_mut();
            let (line, scratch) = &mut *b;
            line.clear();
            self.render(event, line, scratch);
            crate::secret::scrub(line); // no registered secret reaches a line (src/secret.rs)
            line.push('\n');
            writer.write_str(line)
        })
    }
}

struct FieldWriter<'a> {
    prefix: &'a str,
    line: &'a mut String,
    scratch: &'a mut String,
    message: Option<String>,
}

impl FieldWriter<'_> {
    fn key(&mut self, field: &Field) {
        if !self.line.is_empty() {
            self.line.push(' ');
        }
        let name = field.name();
        match name.split_once('#') {
            Some((kind @ ("count" | "measure" | "sample"), metric)) => {
                let _ = write!(self.line, "{kind}#{}.{metric}=", self.prefix);
            }
            _ => {
                self.line.push_str(name);
                self.line.push('=');
            }
        }
    }
}

impl Visit for FieldWriter<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.to_string());
            return;
        }
        self.key(field);
        logfmt::write_str(self.line, value);
    }

    fn record_bytes(&mut self, field: &Field, value: &[u8]) {
        self.key(field);
        logfmt::write_bytes(self.line, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.key(field);
        let _ = write!(self.line, "{value}");
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.key(field);
        let _ = write!(self.line, "{value}");
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.key(field);
        self.line.push_str(if value { "true" } else { "false" });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.scratch.clear();
        let _ = write!(self.scratch, "{value:?}");
        if field.name() == "message" {
            self.message = Some(self.scratch.clone());
            return;
        }
        self.key(field);
        logfmt::write_str(self.line, self.scratch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Captures lines written through the real formatter.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn capture(f: impl FnOnce()) -> String {
        let out = Capture::default();
        let sink = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .event_format(Logfmt::new("myapp"))
            .with_writer(move || sink.clone())
            .with_max_level(Level::TRACE)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn metric_names_get_the_prefix_and_fields_keep_their_order() {
        let key: Option<&[u8]> = Some(b"k 1");
        let out = capture(|| {
            tracing::info!(
                "count#messages.processed" = 1,
                source = "orders",
                topic = "orders",
                partition = 3,
                offset = 42i64,
                key = key
            )
        });
        assert_eq!(
            out,
            "count#myapp.messages.processed=1 source=orders topic=orders partition=3 offset=42 key=\"k 1\"\n"
        );
    }

    #[test]
    fn absent_keys_are_left_out_and_bytes_are_escaped() {
        let none: Option<&[u8]> = None;
        let bad: Option<&[u8]> = Some(&[0xff, b'x']);
        let out = capture(|| {
            tracing::info!(at = "a", key = none);
            tracing::info!(at = "b", key = bad);
        });
        assert_eq!(out, "at=a\nat=b key=\"\\xffx\"\n");
    }

    #[test]
    fn levels_messages_and_foreign_targets() {
        let out = capture(|| {
            tracing::warn!(at = "commit_failed", partition = 1, "broker said no");
            tracing::error!(target: "librdkafka", "FAIL [thrd:x]: down");
        });
        assert_eq!(
            out,
            "level=warn at=commit_failed partition=1 msg=\"broker said no\"\nlevel=error at=librdkafka msg=\"FAIL [thrd:x]: down\"\n"
        );
    }
}

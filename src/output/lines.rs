//! Every line ackd writes: tracing events rendered as one logfmt line each, on stdout.
//!
//! Fields are written in the order the event names them; the event's message, if any,
//! goes last as `msg=`. Levels other than info are written first as `level=`. Field
//! names `count#x`, `measure#x` and `sample#x` become `count#<prefix>.x` (l2met's
//! vocabulary under `ACKD_METRIC_PREFIX`), so call sites name metrics once, without the
//! prefix. Byte fields (message keys) are written with [`logfmt::write_bytes`].
//!
//! Writes go through a writer thread ([`Lines`]): a busy log drain costs a processor
//! nothing, and a slow one slows ackd down (lines wait for room, which comes back as stdout
//! takes bytes). A drain that takes no byte at all for [`STALL`] gets lines dropped
//! instead, counted and reported in an `at=lines_dropped` line once it takes bytes again:
//! processing, commits and the shutdown never wait on a stuck stdout for longer than that.
//! At exit ([`OutputGuard::finish`]) every line is written while stdout takes bytes, for at
//! most the shutdown timeout; what that cannot wait for is dropped and counted, and the
//! exit line, which carries the count, comes after it.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::logfmt;

/// Keeps the writer thread alive; [`OutputGuard::finish`] (or dropping it) writes every
/// line still queued while stdout takes bytes.
#[must_use = "dropping the guard stops log output"]
pub struct OutputGuard {
    shared: Arc<Shared>,
    /// The longest the drop waits for the writer thread; none: while stdout takes bytes.
    bound: Option<Duration>,
}

impl OutputGuard {
    /// At exit: every line queued is written while stdout takes bytes, for at most `bound`
    /// (the shutdown timeout), the lines that cannot wait dropped and counted
    /// ([`Lines::settle`]); then the writer thread writes what came since (the exit line)
    /// and stops, waited for as long again at most.
    pub fn finish(mut self, bound: Duration) {
        Lines(self.shared.clone()).settle(bound);
        self.bound = Some(bound);
    }
}

impl Drop for OutputGuard {
    fn drop(&mut self) {
        let deadline = self.bound.map(|b| Instant::now() + b);
        let mut state = self.shared.lock();
        state.closed = true;
        self.shared.queued.notify_all();
        while !state.done {
            let now = Instant::now();
            let mut wait = stall_left(&state, now);
            if let Some(deadline) = deadline {
                wait = wait.min(deadline.saturating_duration_since(now));
            }
            if wait.is_zero() {
                return; // stdout took nothing for STALL, or the bound passed
            }
            state = self
                .shared
                .written
                .wait_timeout(state, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Bytes of lines that may wait for stdout (queued, or handed to it and not taken yet)
/// before writers wait for room.
const MAX_QUEUED: usize = 1 << 20;
/// The writer thread writes once this much is queued, or when a line has waited
/// [`LINGER`]: one write (and one wake-up) per batch of lines, not per line.
const BATCH: usize = 64 * 1024;
const LINGER: Duration = Duration::from_millis(1);
/// The most one write hands to stdout, cut after a line: a pipe frees room a page at a
/// time, so the writer sees its reader's progress each time a page was taken, and one
/// large write unfinished is never taken for a stuck stdout. A regular file takes whole
/// batches (it takes them at once).
const PIECE: usize = 4096;
/// How long stdout may take no byte, with the buffer full, before lines are dropped rather
/// than waited for.
pub const STALL: Duration = Duration::from_secs(1);

/// Lines dropped since the start, because stdout took nothing for [`STALL`] (or, at
/// exit, did not take them all within the shutdown timeout).
static DROPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many lines were dropped since the start (for the exit line).
pub fn dropped_lines() -> u64 {
    DROPPED.load(std::sync::atomic::Ordering::Relaxed)
}

/// [`Lines::settle`] on the writer `init` installed (nothing to wait for if another
/// subscriber was installed first): before the exit line, which carries the count of
/// the lines this drops.
pub fn settle(bound: Duration) {
    if let Some((lines, _)) = DIRECT.get() {
        lines.settle(bound);
    }
}

/// The writer and the metric prefix of the subscriber `init` installed: lines written
/// with [`write_direct`] go there. Unset when another subscriber was installed first (an
/// embedding's own), so that such lines go through it instead.
static DIRECT: OnceLock<(Lines, String)> = OnceLock::new();

/// Queues the line `render` writes (given the metric prefix) as `Logfmt` would queue an
/// event's, skipping tracing's dispatch and field visitors: for the per-message line,
/// which cost about 2,000 instructions through them and costs a few hundred this way.
/// The caller checks the event's level is enabled. False (nothing written) when ackd's
/// subscriber is not the installed one: the caller logs through `tracing` then.
pub fn write_direct(render: impl FnOnce(&mut String, &str)) -> bool {
    let Some((lines, prefix)) = DIRECT.get() else {
        return false;
    };
    BUFFERS.with(|b| {
        let line = &mut b.borrow_mut().0;
        line.clear();
        render(line, prefix);
        // No registered secret reaches a line (src/settings/secret.rs).
        crate::settings::secret::scrub(line);
        line.push('\n');
        lines.append(line.as_bytes());
        if line.capacity() > KEEP_PER_THREAD {
            line.clear();
            line.shrink_to(KEEP_PER_THREAD);
        }
    });
    true
}

/// Capacity a per-thread line buffer keeps: a bigger one (after a huge line) is shrunk
/// back to this, so one huge line does not stay allocated on every thread.
const KEEP_PER_THREAD: usize = 16 * 1024;

/// Where every line goes: one buffer that threads append their lines to, under a lock
/// held for a copy, and that the writer thread takes whole and writes to stdout, at most
/// [`LINGER`] after a line was queued. A line costs no allocation and no message on a
/// channel (tracing-appender's writer, one `Vec` and one channel send per line, was a
/// third of what a per-message line cost).
#[derive(Clone)]
pub struct Lines(Arc<Shared>);

struct Shared {
    state: Mutex<State>,
    /// Wakes the writer thread: a first line, a full batch, or the close.
    queued: Condvar,
    /// Signalled when stdout took bytes (for blocked writers), a batch ended, and when done.
    written: Condvar,
    /// The most one write hands to stdout ([`PIECE`], or a whole batch).
    piece: usize,
}

#[derive(Default)]
struct State {
    buf: Vec<u8>,
    /// What the writer thread waits for, so that only a line that gives it that wakes it.
    waiting: Waiting,
    /// Writers waiting for room in the buffer.
    blocked: usize,
    /// Bytes of the batch being written that stdout has not taken yet.
    in_flight: usize,
    /// When stdout last took bytes of the batch being written, or when the batch began
    /// (None between batches).
    progress: Option<Instant>,
    /// stdout has taken no byte for [`STALL`] with the buffer full: lines are dropped until
    /// it takes some.
    stalled: bool,
    /// Lines dropped since the last `at=lines_dropped` report.
    dropped: u64,
    /// Bytes queued since the start, and bytes the writer thread is done with (written,
    /// or dropped at exit): what [`Lines::settle`] waits on.
    queued_total: u64,
    settled_total: u64,
    /// At exit: the rest of the batch being written is dropped, after the line under way.
    abandon: bool,
    closed: bool,
    done: bool,
}

impl State {
    /// Bytes waiting for stdout: queued, and handed to it but not taken.
    fn queued(&self) -> usize {
        self.buf.len() + self.in_flight
    }

    /// Drops every line not yet handed to stdout, and counts them.
    fn drop_queued(&mut self) {
        let lines = count_lines(&self.buf);
        self.count_dropped(lines);
        self.settled_total += self.buf.len() as u64;
        self.buf.clear();
    }

    fn count_dropped(&mut self, lines: u64) {
        self.dropped += lines;
        DROPPED.fetch_add(lines, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How much longer stdout may take no byte before it counts as stuck (zero: it is).
fn stall_left(state: &State, now: Instant) -> Duration {
    match state.progress {
        Some(since) => STALL.saturating_sub(now.saturating_duration_since(since)),
        // Between batches: the writer thread takes the next one within LINGER.
        None => STALL,
    }
}

fn count_lines(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b == b'\n').count() as u64
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum Waiting {
    #[default]
    Nothing,
    /// The buffer is empty: the next line wakes it.
    Line,
    /// Lines are queued, fewer than a batch: a full batch wakes it, else the linger ends.
    Batch,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The writer thread: takes batches of lines and writes them to `out` until closed.
    fn write_lines(&self, out: &mut impl std::io::Write) {
        let mut batch = Vec::new();
        loop {
            let Some(mut state) = self.next_batch(&mut batch) else {
                return;
            };
            state.in_flight = batch.len();
            state.progress = Some(Instant::now());
            drop(state);
            let abandoned = self.write_batch(out, &batch);
            let mut state = self.lock();
            state.in_flight = 0;
            state.progress = None;
            state.stalled = false;
            state.abandon = false;
            state.settled_total += batch.len() as u64;
            state.count_dropped(abandoned);
            self.written.notify_all();
            let dropped = std::mem::take(&mut state.dropped);
            drop(state);
            batch.clear();
            if batch.capacity() > 2 * MAX_QUEUED {
                batch.shrink_to(MAX_QUEUED); // grown by a huge line: give it back
            }
            if dropped > 0 {
                let _ = writeln!(
                    out,
                    "level=warn at=lines_dropped count={dropped} msg=\"stdout took no byte for {} ms, \
                     or not every line within the shutdown timeout at exit: these lines were dropped \
                     so that processing, commits and the shutdown do not wait for the log drain\"",
                    STALL.as_millis()
                )
                .and_then(|()| out.flush());
            }
        }
    }

    /// Waits for a batch (a full one, or lines that lingered) and swaps it into `batch`,
    /// returning the lock; None once closed with nothing left (then done is set).
    fn next_batch(&self, batch: &mut Vec<u8>) -> Option<MutexGuard<'_, State>> {
        let mut state = self.lock();
        let mut lingered = false;
        loop {
            if state.buf.len() >= BATCH || (!state.buf.is_empty() && (lingered || state.closed)) {
                break;
            }
            if state.buf.is_empty() && state.closed {
                state.done = true;
                self.written.notify_all();
                return None;
            }
            if state.buf.is_empty() {
                state.waiting = Waiting::Line;
                state = self.queued.wait(state).unwrap_or_else(|e| e.into_inner());
            } else {
                state.waiting = Waiting::Batch;
                state = self
                    .queued
                    .wait_timeout(state, LINGER)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                lingered = true;
            }
        }
        state.waiting = Waiting::Nothing;
        std::mem::swap(&mut state.buf, batch);
        Some(state)
    }

    /// Writes `batch` in pieces, each one's progress made known (room for blocked writers,
    /// and the proof that stdout is not stuck). Returns the lines dropped when the exit
    /// gave up on the rest ([`State::abandon`]).
    fn write_batch(&self, out: &mut impl std::io::Write, batch: &[u8]) -> u64 {
        let mut rest = batch;
        while !rest.is_empty() {
            let n = piece_end(rest, self.piece);
            // A drain that went away must not stop ackd: the lines are lost then.
            if out
                .write_all(&rest[..n])
                .and_then(|()| out.flush())
                .is_err()
            {
                return 0;
            }
            rest = &rest[n..];
            let mut state = self.lock();
            state.in_flight = rest.len();
            state.progress = Some(Instant::now());
            state.stalled = false;
            if state.blocked > 0 {
                self.written.notify_all();
            }
            if state.abandon && !rest.is_empty() {
                drop(state);
                // The line under way is finished: a log must not end inside a line.
                let end = if batch[..batch.len() - rest.len()].ends_with(b"\n") {
                    0
                } else {
                    rest.iter()
                        .position(|&b| b == b'\n')
                        .map_or(rest.len(), |i| i + 1)
                };
                let _ = out.write_all(&rest[..end]).and_then(|()| out.flush());
                return count_lines(&rest[end..]);
            }
        }
        0
    }
}

/// Where the next write of `rest` ends: after the last whole line within `piece` bytes,
/// or at `piece` within a line longer than that.
fn piece_end(rest: &[u8], piece: usize) -> usize {
    if rest.len() <= piece {
        return rest.len();
    }
    rest[..piece]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(piece, |i| i + 1)
}

/// The most one write hands to stdout: [`PIECE`], or whole batches when stdout is a
/// regular file.
fn piece_for_stdout() -> usize {
    use std::os::fd::AsFd;
    let regular = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .and_then(|f| f.metadata())
        .is_ok_and(|m| m.is_file());
    if regular {
        usize::MAX
    } else {
        PIECE
    }
}

impl Lines {
    /// Starts the writer thread, writing to `out` at most `piece` bytes at a time.
    fn start(mut out: impl std::io::Write + Send + 'static, piece: usize) -> (Lines, OutputGuard) {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            queued: Condvar::new(),
            written: Condvar::new(),
            piece,
        });
        let theirs = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("ackd-log".into())
            .spawn(move || theirs.write_lines(&mut out));
        if spawned.is_err() {
            // No thread: lines go nowhere rather than piling up.
            shared.lock().done = true;
        }
        let guard = OutputGuard {
            shared: shared.clone(),
            bound: None,
        };
        (Lines(shared), guard)
    }

    fn append(&self, line: &[u8]) {
        let mut state = self.0.lock();
        // Bytes waiting for stdout stay within MAX_QUEUED; a line longer than that waits
        // until nothing waits and goes alone. Wait for room while stdout takes bytes; once
        // it took none for STALL, the line is dropped and counted.
        while state.queued() > 0 && state.queued() + line.len() > MAX_QUEUED && !state.done {
            let wait = stall_left(&state, Instant::now());
            if state.stalled || wait.is_zero() {
                state.stalled = true;
                state.count_dropped(1);
                return;
            }
            state.blocked += 1;
            state = self
                .0
                .written
                .wait_timeout(state, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            state.blocked -= 1;
        }
        if state.done {
            return;
        }
        state.buf.extend_from_slice(line);
        state.queued_total += line.len() as u64;
        let wake = match state.waiting {
            Waiting::Line => true,
            Waiting::Batch => state.buf.len() >= BATCH,
            Waiting::Nothing => false,
        };
        if wake {
            state.waiting = Waiting::Nothing;
        }
        drop(state);
        if wake {
            self.0.queued.notify_one();
        }
    }

    /// Waits until every line queued before the call is written, while stdout takes
    /// bytes, for at most `bound`. Then the lines still queued are dropped and counted,
    /// and so is the rest of the batch being written, after its line under way; a stdout
    /// that takes no byte for [`STALL`] ends the wait at once (what it holds is lost).
    fn settle(&self, bound: Duration) {
        let deadline = Instant::now() + bound;
        let mut state = self.0.lock();
        let target = state.queued_total;
        let mut gave_up = false;
        while state.settled_total < target && !state.done {
            let now = Instant::now();
            let stall = stall_left(&state, now);
            if gave_up && stall.is_zero() {
                return;
            }
            if !gave_up && (now >= deadline || stall.is_zero()) {
                gave_up = true;
                state.drop_queued();
                state.abandon = state.in_flight > 0;
                continue;
            }
            let wait = if gave_up {
                stall
            } else {
                stall.min(deadline - now)
            };
            state = self
                .0
                .written
                .wait_timeout(state, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// What the fmt layer writes one event's line through.
pub struct LineWriter<'a>(&'a Lines);

impl std::io::Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.append(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Lines {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter(self)
    }
}

/// Installs the logfmt subscriber. `level` is `ACKD_LOG_LEVEL`; `RUST_LOG`, when set and
/// valid, wins. Returns the guard and, when `RUST_LOG` was invalid, the reason.
pub fn init(level: &str, metric_prefix: &str) -> (OutputGuard, Option<String>) {
    let (writer, guard) = Lines::start(std::io::stdout(), piece_for_stdout());
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
        .with_writer(writer.clone())
        .with_ansi(false);
    // A second init (tests embedding ackd) keeps the first subscriber.
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .try_init();
    if installed.is_ok() {
        let _ = DIRECT.set((writer, metric_prefix.to_string()));
    }
    (guard, rust_log_error)
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
            let from = if meta.target().starts_with("librdkafka") {
                "librdkafka"
            } else {
                meta.target()
            };
            // An embedded processor's event that names itself (`at = "…"`) keeps its
            // name; where it comes from goes beside it (one `at=` per line).
            let key = if meta.fields().field("at").is_some() {
                "target"
            } else {
                "at"
            };
            logfmt::write_pair(line, key, from);
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
            // No registered secret reaches a line (src/settings/secret.rs).
            crate::settings::secret::scrub(line);
            line.push('\n');
            let written = writer.write_str(line);
            for buf in [line, scratch] {
                if buf.capacity() > KEEP_PER_THREAD {
                    buf.clear();
                    buf.shrink_to(KEEP_PER_THREAD);
                }
            }
            written
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
        match metric_split(name) {
            Some((kind, metric)) => {
                // Pieces pushed, not `write!`: this runs for every field of every line.
                for piece in [kind, self.prefix, ".", metric, "="] {
                    self.line.push_str(piece);
                }
            }
            None => {
                self.line.push_str(name);
                self.line.push('=');
            }
        }
    }
}

/// `count#x`, `measure#x`, `sample#x` → (`count#`, `x`); any other name → `None`. By
/// prefix, not by searching the name for `#`: that search was most of what a line's
/// keys cost (every field of every per-message line comes here).
fn metric_split(name: &str) -> Option<(&str, &str)> {
    let kind = match name.as_bytes().first()? {
        b'c' => "count#",
        b'm' => "measure#",
        b's' => "sample#",
        _ => return None,
    };
    name.strip_prefix(kind).map(|metric| (kind, metric))
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

    // Integers (partition, offset, counts: on every line) through itoa rather than the
    // formatting machinery.
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.key(field);
        self.line.push_str(itoa::Buffer::new().format(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.key(field);
        self.line.push_str(itoa::Buffer::new().format(value));
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

    fn write_line(lines: &Lines, line: &str) {
        use std::io::Write as _;
        lines.make_writer().write_all(line.as_bytes()).unwrap();
    }

    #[test]
    fn every_line_is_written_in_order_by_the_time_the_guard_is_dropped() {
        let out = Capture::default();
        let (lines, guard) = Lines::start(out.clone(), PIECE);
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let lines = lines.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000 {
                        write_line(&lines, &format!("t={t} i={i}\n"));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let mut next = [0, 0];
        for line in text.lines() {
            let (t, i) = line.split_once(' ').unwrap();
            let t: usize = t.strip_prefix("t=").unwrap().parse().unwrap();
            let i: usize = i.strip_prefix("i=").unwrap().parse().unwrap();
            assert_eq!(i, next[t], "lines of one thread keep their order, whole");
            next[t] += 1;
        }
        assert_eq!(next, [20_000, 20_000]);
    }

    #[test]
    fn a_lone_line_is_written_without_waiting_for_a_batch() {
        let out = Capture::default();
        let (lines, _guard) = Lines::start(out.clone(), PIECE);
        write_line(&lines, "at=one\n");
        let deadline = Instant::now() + Duration::from_secs(5);
        while out.0.lock().unwrap().is_empty() {
            assert!(Instant::now() < deadline, "the line never came out");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(&*out.0.lock().unwrap(), b"at=one\n");
    }

    /// An output that writes only when allowed: a log drain that does not keep up.
    struct Gated {
        out: Capture,
        open: Arc<(Mutex<bool>, Condvar)>,
    }

    impl std::io::Write for Gated {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let (open, cond) = &*self.open;
            let mut open = open.lock().unwrap();
            while !*open {
                open = cond.wait(open).unwrap();
            }
            self.out.write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stuck_output_holds_writers_back_and_loses_no_line() {
        let out = Capture::default();
        let open = Arc::new((Mutex::new(false), Condvar::new()));
        let (lines, guard) = Lines::start(
            Gated {
                out: out.clone(),
                open: open.clone(),
            },
            PIECE,
        );
        let line = format!("{}\n", "x".repeat(99));
        let n = 3 * MAX_QUEUED / line.len();
        let writer = {
            let (lines, line) = (lines.clone(), line.clone());
            std::thread::spawn(move || {
                for _ in 0..n {
                    write_line(&lines, &line);
                }
            })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while lines.0.lock().blocked == 0 {
            assert!(Instant::now() < deadline, "no writer ever waited for room");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!writer.is_finished(), "the writer waits for room");
        assert!(lines.0.lock().queued() <= MAX_QUEUED);
        *open.0.lock().unwrap() = true;
        open.1.notify_all();
        writer.join().unwrap();
        drop(guard);
        assert_eq!(out.0.lock().unwrap().len(), n * line.len());
    }

    /// An output that takes one piece every `every`: a log drain that reads, slowly.
    struct Trickle {
        out: Capture,
        every: Duration,
    }

    impl std::io::Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            std::thread::sleep(self.every);
            let n = buf.len().min(PIECE);
            self.out.write(&buf[..n])
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// At exit the wait ends at its bound although stdout still takes bytes: what is left
    /// is dropped and counted, the log ends with a whole line, then the count.
    #[test]
    fn settling_past_its_bound_drops_the_rest_after_a_whole_line_and_counts_it() {
        let out = Capture::default();
        let every = Duration::from_millis(20);
        let (lines, guard) = Lines::start(
            Trickle {
                out: out.clone(),
                every,
            },
            PIECE,
        );
        // ~100 pieces, 2 s at the trickle's pace.
        let n = 100 * PIECE / 37;
        for i in 0..n {
            write_line(&lines, &format!("at=line i={i:>20}\n"));
        }
        lines.settle(10 * every);
        write_line(&lines, "at=exit\n");
        guard.finish(Duration::from_secs(10));
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let all: Vec<&str> = text.lines().collect();
        let written = all.iter().filter(|l| l.starts_with("at=line ")).count();
        let [report, exit] = all[written..] else {
            panic!(
                "{} lines after {written} written: {:?}",
                all.len() - written,
                &all[written..]
            );
        };
        assert!(
            report.starts_with("level=warn at=lines_dropped count="),
            "{report}"
        );
        assert_eq!(exit, "at=exit");
        for (i, line) in all[..written].iter().enumerate() {
            assert_eq!(*line, format!("at=line i={i:>20}"), "whole lines, in order");
        }
        let dropped: usize = report["level=warn at=lines_dropped count=".len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            written > 0 && dropped > 0,
            "{written} written, {dropped} dropped"
        );
        assert_eq!(written + dropped, n, "every line written or counted");
    }

    /// A line over the bound goes only into an empty queue: queued bytes never exceed
    /// MAX_QUEUED, or that one line alone.
    #[test]
    fn a_huge_line_never_queues_beside_others_and_is_written_whole() {
        let out = Capture::default();
        let open = Arc::new((Mutex::new(false), Condvar::new()));
        let (lines, guard) = Lines::start(
            Gated {
                out: out.clone(),
                open: open.clone(),
            },
            PIECE,
        );
        let small = format!("{}\n", "s".repeat(99));
        let huge = format!("{}\n", "h".repeat(3 * MAX_QUEUED));
        let writer = {
            let (lines, small, huge) = (lines.clone(), small.clone(), huge.clone());
            std::thread::spawn(move || {
                for _ in 0..100 {
                    write_line(&lines, &small);
                }
                write_line(&lines, &huge);
                write_line(&lines, &small);
            })
        };
        // The writer thread is stuck writing the first lines; a line that does not fit
        // waits for room: the huge one for an empty queue, or the small one after it.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let state = lines.0.lock();
            if state.blocked == 1 {
                // The small lines, or (if the writer thread took them all first) the
                // huge line alone: never both.
                let queued = state.buf.len();
                assert!(
                    queued <= 100 * small.len() || queued == huge.len(),
                    "{queued} bytes queued"
                );
                break;
            }
            drop(state);
            assert!(Instant::now() < deadline, "no writer ever waited for room");
            std::thread::sleep(Duration::from_millis(1));
        }
        *open.0.lock().unwrap() = true;
        open.1.notify_all();
        writer.join().unwrap();
        drop(guard);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text, [small.repeat(100), huge, small].concat());
    }

    /// The thread's reused buffers are shrunk back after a huge line.
    #[test]
    fn a_huge_line_does_not_stay_in_the_per_thread_buffer() {
        let huge = "x".repeat(4 << 20);
        let out = capture(|| tracing::info!(at = "big", line = huge.as_str()));
        assert_eq!(out.len(), huge.len() + "at=big line=\n".len());
        let kept = BUFFERS.with(|b| {
            let b = b.borrow();
            (b.0.capacity(), b.1.capacity())
        });
        assert!(
            kept.0 <= KEEP_PER_THREAD && kept.1 <= KEEP_PER_THREAD,
            "{kept:?}"
        );
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

    /// The per-message line written straight to the writer is the line `Logfmt`
    /// renders for the same event, byte for byte.
    #[test]
    fn the_direct_per_message_line_is_the_event_s_line() {
        let keys: [Option<&[u8]>; 5] = [
            None,
            Some(b"k-1"),
            Some(b"k 1=\"x\""),
            Some(b"\xff\x00"),
            Some(b""),
        ];
        for key in keys {
            for redelivered in [false, true] {
                for (source, topic) in [("orders", "orders"), ("src", "a b=c")] {
                    let fields = (source, topic, 3, 42i64, key);
                    let event = capture(|| {
                        crate::output::metrics::message_processed(
                            source,
                            topic,
                            3,
                            42,
                            key,
                            redelivered,
                        )
                    });
                    let mut direct = String::new();
                    crate::output::metrics::processed_line(
                        &mut direct,
                        "myapp",
                        fields,
                        redelivered,
                    );
                    direct.push('\n');
                    assert_eq!(direct, event, "key {key:?}, redelivered {redelivered}");
                }
            }
        }
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
    fn only_the_three_metric_kinds_before_the_first_hash_get_the_prefix() {
        let out = capture(|| {
            tracing::info!(
                "measure#commit.ms" = 3,
                "sample#lag" = 4,
                "counter#x" = 5,
                "count" = 6,
                "s#y" = 7,
                "count#a#b" = 8,
                "count#" = 9
            )
        });
        assert_eq!(
            out,
            "measure#myapp.commit.ms=3 sample#myapp.lag=4 counter#x=5 count=6 s#y=7 count#myapp.a#b=8 count#myapp.=9\n"
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
            tracing::info!(target: "my_processor", at = "loaded", rows = 3);
        });
        assert_eq!(
            out,
            "level=warn at=commit_failed partition=1 msg=\"broker said no\"\nlevel=error at=librdkafka msg=\"FAIL [thrd:x]: down\"\ntarget=my_processor at=loaded rows=3\n"
        );
    }
}

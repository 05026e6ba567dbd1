//! How ackd ends: its exit codes (after sysexits.h where one fits; docs/observability.md's
//! table explains each, by these names, and tests/docs_formats.rs keeps the two equal),
//! the end of the process once every line is written (`end_process`), and the panic hook
//! that makes a panic one line.

use std::time::Duration;

use crate::output;

/// Everything acknowledged was committed; the group was left.
pub const OK: i32 = 0;
/// Stopped, but not cleanly: a drain or the final commit missed the deadline or failed,
/// or a processor failure halted a partition. The log says which offsets were not
/// committed; they will be redelivered. Also when the final commit was only the release
/// mark (everything acknowledged was committed periodically) and it was not made: nothing
/// is redelivered, but the next owner reads no release and flags its predecessor's
/// dispatch window, as after a crash; exit 0 promises it a clean release.
pub const INCOMPLETE: i32 = 1;
/// The command line was wrong (EX_USAGE): ackd takes no argument, or one of `check`,
/// `status`, `--help` (`-h`, `help`), `--version` (`-V`); the usage went to stderr.
pub const USAGE: i32 = 64;
/// An internal invariant broke (EX_SOFTWARE); ackd stopped without committing past it.
pub const SOFTWARE: i32 = 70;
/// librdkafka reported a fatal error (EX_UNAVAILABLE), e.g. this member was fenced.
pub const UNAVAILABLE: i32 = 69;
/// A broker refused ackd's credentials or ackd refused the broker's certificate
/// (EX_NOPERM): TLS or SASL authentication failed (see src/consumer/auth.rs).
pub const NOPERM: i32 = 77;
/// A setting is missing or invalid (EX_CONFIG).
pub const CONFIG: i32 = 78;
/// A second SIGINT forced an immediate exit (128 + SIGINT).
pub const FORCED: i32 = 130;

/// Writes every queued line, then ends the process at once with `_exit`, without the C
/// library's exit handlers. A client ackd gave up on (a deadline passed, a forced stop, a
/// metadata request still under way when authentication failed) leaves librdkafka's
/// threads running; OpenSSL's exit handler would free what they still use, and with
/// them alive the process can die of SIGSEGV after its `at=exit` line (seen with
/// jemalloc). Nothing is left for those handlers to do: lines are flushed here, the
/// group was left and offsets committed (or given up on) before `at=exit`.
/// stdout is not flushed here: only the line writer writes to it (and flushes each
/// batch), and a stuck stdout must not hold the exit (the writer holds its lock).
/// `wait` bounds the wait for a slow stdout (the shutdown timeout); a stuck one is
/// given up on after `lines::STALL` without a byte taken.
pub(crate) fn end_process(lines: output::lines::OutputGuard, code: i32, wait: Duration) -> ! {
    lines.finish(wait);
    // SAFETY: _exit only ends the process; nothing runs after it.
    unsafe { libc::_exit(code) }
}

/// Panics become one logfmt line (no backtrace on the log drain). A processor's panic is
/// caught and fails only its message; anything else ends the process non-zero.
pub(crate) fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".to_string());
        tracing::error!(at = "panic", location, "{message}");
    }));
}

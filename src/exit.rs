//! Exit codes, after sysexits.h where one fits. docs/observability.md's table is made from these.

/// Everything acknowledged was committed; the group was left.
pub const OK: i32 = 0;
/// Stopped, but not cleanly: a drain or the final commit missed the deadline or failed,
/// or a processor failure halted a partition. The log says which offsets were not
/// committed; they will be redelivered. Also when the final commit was only the release
/// mark (everything acknowledged was committed periodically) and it was not made: nothing
/// is redelivered, but the next owner reads no release and flags its predecessor's
/// dispatch window, as after a crash; exit 0 promises it a clean release.
pub const INCOMPLETE: i32 = 1;
/// The command line was wrong (EX_USAGE): ackd takes no arguments but `--help` and
/// `--version`; the usage went to stderr.
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

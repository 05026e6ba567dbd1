//! ackd: a Kafka consumer daemon with at-least-once delivery and zero redelivery on a
//! graceful stop.
//!
//! The binary is a thin shell over this library: embed ackd with your own
//! [`Processor`] by calling [`main_with`] from your `main`, exactly as `ackd` does with
//! its built-in processors. See `examples/custom_processor.rs`.
//!
//! The pieces, one folder per concern:
//! - [`settings`]: every setting, validated ([`Settings`]), and settings →
//!   librdkafka;
//! - [`processors`]: the [`Processor`] trait and the built-ins (`log`, `noop`, `exec`,
//!   `http`);
//! - [`output`]: every line written, the l2met metrics, the health endpoint;
//! - [`consumer`]: the daemon (signals, exit code), the supervisor thread that owns the
//!   consumer and the group, one worker task per partition, the offset
//!   tracker ([`consumer::OffsetTracker`]), the committer, the memory budget;
//! - [`commands`]: `ackd check` and `ackd status`, which read the group without joining
//!   it;
//! - [`cli`]: the arguments, answered before any setting is read; `app` (private): the
//!   process from its arguments to its exit, behind [`main_with`].
//!
//! Folders import in one direction: settings ← processors, output ← consumer ← commands ←
//! app. A leaf at the root serves all of them: [`logfmt`] (the escaping of every line,
//! which the redaction of secrets in settings knows too).

mod app;
pub mod cli;
pub mod commands;
pub mod consumer;
pub mod exit;
pub mod logfmt;
pub mod output;
pub mod processors;
pub mod settings;

use std::process::ExitCode;

pub use processors::processor::{
    queued, BatchError, Decoded, DecodedPart, FailureKind, Header, Message, OwnedMessage,
    ProcessError, Processor, Queued, Taken,
};
pub use settings::SettingError;
pub use settings::Settings;

/// Runs ackd with settings from the environment and the processor `make` builds from
/// them. Arguments (`--help`, `--version`, usage errors: exit 64) return the exit code
/// for `main` to return; once the settings are read the process ends here, with every
/// line written. Logging, the panic hook and configuration errors
/// (exit 78, also for an `Err` from `make`) are handled here.
pub fn main_with<P: Processor>(
    make: impl FnOnce(&Settings) -> Result<P, SettingError>,
) -> ExitCode {
    app::main_with(make)
}

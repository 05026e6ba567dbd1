//! SIGTERM and SIGINT: what each one does to a running ackd.
//!
//! - the first SIGTERM or SIGINT starts a graceful stop with a deadline of
//!   `ACKD_SHUTDOWN_TIMEOUT_MS`;
//! - more SIGTERMs are logged and ignored (Heroku may send several), and so is a first
//!   SIGINT after a SIGTERM (a process manager's SIGTERM and the terminal's Ctrl-C);
//! - a second SIGINT (Ctrl-C twice) exits at once;
//! - before anything is consumed, either one exits 0 at once.

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook_tokio::Signals;

use crate::exit;

/// Installs the handlers of SIGTERM and SIGINT. `Err(code)`: they could not be.
pub(crate) fn install() -> Result<Signals, i32> {
    Signals::new([SIGTERM, SIGINT]).map_err(|e| {
        tracing::error!(at = "start_failed", error = %e, "cannot install signal handlers");
        exit::SOFTWARE
    })
}

/// Only a second SIGINT forces the exit: a person pressing Ctrl-C again. A SIGTERM never
/// does (Heroku may send several), nor does a first SIGINT after a SIGTERM: a process
/// manager (honcho, overmind, foreman) sends SIGTERM to its children while the terminal's
/// Ctrl-C sends SIGINT to the same process group, and both arrive together.
#[derive(Debug, Default)]
pub(crate) struct SigintCount(u32);

impl SigintCount {
    /// The count once `first` started the stop.
    pub(crate) fn after(first: Option<i32>) -> Self {
        SigintCount(u32::from(first == Some(SIGINT)))
    }

    /// Counts a signal received while stopping; true if it forces the exit.
    pub(crate) fn forces(&mut self, signal: Option<i32>) -> bool {
        if signal == Some(SIGINT) {
            self.0 += 1;
        }
        self.0 >= 2
    }
}

/// The name of `signal` in the `signal=` field of a line.
pub(crate) fn signal_name(signal: Option<i32>) -> &'static str {
    match signal {
        Some(SIGTERM) => "SIGTERM",
        Some(SIGINT) => "SIGINT",
        _ => "unknown",
    }
}

/// A signal before anything was consumed (while ackd waited for its topics, or counted
/// their partitions): ackd exits at once, 0.
pub(crate) fn stopped_while_waiting(signal: Option<i32>) -> i32 {
    tracing::info!(
        at = "signal",
        signal = signal_name(signal),
        "stopped before consuming anything: nothing to commit"
    );
    exit::OK
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The signals received, the first one starting the stop: whether the last forced it.
    fn forced(signals: &[i32]) -> bool {
        let mut count = SigintCount::after(Some(signals[0]));
        signals[1..].iter().any(|&s| count.forces(Some(s)))
    }

    #[test]
    fn only_a_second_sigint_forces_the_exit() {
        assert!(forced(&[SIGINT, SIGINT]));
        assert!(forced(&[SIGINT, SIGTERM, SIGINT]));
        assert!(forced(&[SIGTERM, SIGINT, SIGINT]));
        assert!(!forced(&[SIGTERM, SIGINT]));
        assert!(!forced(&[SIGINT, SIGTERM]));
        assert!(!forced(&[SIGTERM, SIGTERM, SIGTERM]));
    }
}

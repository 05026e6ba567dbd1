//! ackd with a slow processor, for `scripts/bench`'s memory run: every message takes
//! `SLOW_DELAY_MS` milliseconds (default 1; an async sleep, as a processor waiting on a
//! database would), then is acknowledged.
//!
//! It is the `ackd` daemon (same settings, lines and exit codes) with this processor
//! instead of a built-in one; like the testkit's `slow` processor it never ships in the
//! `ackd` binary, but it needs no separate build with `--features testkit`.
//!
//! ```text
//! KAFKA_URL=127.0.0.1:9092 ACKD_TOPICS=bench ACKD_GROUP_ID=slow SLOW_DELAY_MS=1 \
//!     cargo run --release --example slow_processor
//! ```

use std::process::ExitCode;
use std::time::Duration;

use ackd::{Message, ProcessError, Processor, SettingError};

struct Slow(Duration);

impl Processor for Slow {
    fn name(&self) -> &str {
        "slow"
    }

    async fn process(&self, _message: &Message<'_>) -> Result<(), ProcessError> {
        tokio::time::sleep(self.0).await;
        Ok(())
    }
}

fn main() -> ExitCode {
    ackd::main_with(|_settings| {
        let raw = std::env::var("SLOW_DELAY_MS").unwrap_or_else(|_| "1".into());
        let ms: u64 = raw.parse().map_err(|_| SettingError {
            setting: "SLOW_DELAY_MS".into(),
            value: Some(raw.clone()),
            problem: "expected milliseconds (a whole number)".into(),
        })?;
        Ok(Slow(Duration::from_millis(ms)))
    })
}

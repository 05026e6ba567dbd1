//! ackd with a slow processor, for `scripts/bench`: every message takes `SLOW_DELAY_MS`
//! milliseconds (default 1; `0-5`: uniform at random between 0 and 5 ms, as in Parallel
//! Consumer's benchmark), an async sleep, as a processor waiting on a database would, and
//! is then acknowledged.
//!
//! A tokio sleep lasts longer than asked (its timer rounds up to the next millisecond and
//! wakes when the runtime gets to it), so the processor times each one and, at the stop,
//! writes what they really took and when the first call started and the last one ended
//! (microseconds since the Unix epoch): `at=slow_delays count=N asked_mean_us=A
//! slept_mean_us=S first_started_us=F last_done_us=L`. The bench computes its ideal times
//! from `slept_mean_us`, and its processing time from F to L (the stop itself only comes
//! once librdkafka reports the end of the partition, after a fetch's long poll).
//!
//! `SLOW_FAIL_EVERY=K` (default 0: never) fails the messages at offsets K-1, 2K-1, ...
//! retryably on their first attempt (from a retry tier, attempt 2, they pass): the
//! bench's retry case (`scripts/bench retry`).
//!
//! It is the `ackd` daemon (same settings, lines and exit codes) with this processor
//! instead of a built-in one; like the testkit's `slow` processor it never ships in the
//! `ackd` binary, but it needs no separate build with `--features testkit`.
//!
//! ```text
//! KAFKA_URL=127.0.0.1:9092 ACKD_TOPICS=bench ACKD_GROUP_ID=slow SLOW_DELAY_MS=0-5 \
//!     cargo run --release --example slow_processor
//! ```

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ackd::settings::test_delay::Delay;
use ackd::{Message, ProcessError, Processor, SettingError};

struct Slow {
    delay: Delay,
    /// `SLOW_FAIL_EVERY`: 0, or every how many offsets a message fails once.
    fail_every: i64,
    count: AtomicU64,
    asked_us: AtomicU64,
    slept_us: AtomicU64,
    first_started_us: AtomicU64,
    last_done_us: AtomicU64,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Processor for Slow {
    fn name(&self) -> &str {
        "slow"
    }

    async fn process(&self, message: &Message<'_>) -> Result<(), ProcessError> {
        let k = self.fail_every;
        if k > 0 && message.attempt() == 1 && message.offset() % k == k - 1 {
            return Err(ProcessError::retryable("SLOW_FAIL_EVERY"));
        }
        let asked = self.delay.sample(&mut fastrand::Rng::new());
        self.first_started_us.fetch_min(now_us(), Ordering::Relaxed);
        let started = Instant::now();
        tokio::time::sleep(asked).await;
        let slept = started.elapsed();
        self.last_done_us.fetch_max(now_us(), Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.asked_us
            .fetch_add(asked.as_micros() as u64, Ordering::Relaxed);
        self.slept_us
            .fetch_add(slept.as_micros() as u64, Ordering::Relaxed);
        Ok(())
    }

    async fn shutdown(&self, _deadline: Instant) {
        let count = self.count.load(Ordering::Relaxed);
        let mean = |total: &AtomicU64| total.load(Ordering::Relaxed) / count.max(1);
        tracing::info!(
            at = "slow_delays",
            count,
            asked_mean_us = mean(&self.asked_us),
            slept_mean_us = mean(&self.slept_us),
            first_started_us = self.first_started_us.load(Ordering::Relaxed),
            last_done_us = self.last_done_us.load(Ordering::Relaxed),
        );
    }
}

fn main() -> ExitCode {
    ackd::main_with(|_settings| {
        let raw = std::env::var("SLOW_DELAY_MS").unwrap_or_else(|_| "1".into());
        let delay = Delay::parse(&raw, 3_600_000).map_err(|problem| SettingError {
            setting: "SLOW_DELAY_MS".into(),
            value: Some(raw.clone()),
            problem,
        })?;
        let fail = std::env::var("SLOW_FAIL_EVERY").unwrap_or_else(|_| "0".into());
        let fail_every = fail.parse::<i64>().ok().filter(|k| *k >= 0);
        let fail_every = fail_every.ok_or_else(|| SettingError {
            setting: "SLOW_FAIL_EVERY".into(),
            value: Some(fail.clone()),
            problem: "expected a whole number of offsets (0: never)".into(),
        })?;
        Ok(Slow {
            delay,
            fail_every,
            count: AtomicU64::new(0),
            asked_us: AtomicU64::new(0),
            slept_us: AtomicU64::new(0),
            first_started_us: AtomicU64::new(u64::MAX),
            last_done_us: AtomicU64::new(0),
        })
    })
}

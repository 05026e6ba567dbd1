//! Polling a condition until it holds.

use std::thread;
use std::time::{Duration, Instant};

/// Polls `cond` every 10 ms until it is true; panics (at the caller) after `timeout`.
#[track_caller]
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("condition not met within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(10));
    }
}

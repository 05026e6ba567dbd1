//! The daemon: settings in, exit code out.
//!
//! It starts ackd (`startup`: the clients, the health endpoint, the subscription; `session`:
//! the membership lease), hands the consumer to the supervisor thread
//! ([`crate::consumer::supervisor`]), and waits for a stop and its end: what each signal
//! does, the deadline and the exit code are the stop's ([`crate::consumer::stop`]).

mod session;
mod startup;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::consumer::{stop, supervisor};
use crate::exit;
use crate::processors::processor::Processor;
use crate::settings::Settings;

pub(crate) use startup::report_client_error;

/// Runs ackd until it is stopped; returns the process exit code.
pub fn run<P: Processor>(settings: Settings, processor: P) -> i32 {
    let started = Instant::now();
    let exit_wait = settings.shutdown_timeout;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ackd-runtime")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(at = "start_failed", error = %e, "cannot start the async runtime");
            return exit::SOFTWARE;
        }
    };
    let code = runtime.block_on(run_async(settings, processor));
    // Workers of an abandoned stop may still be parked; they must not hold up exit.
    runtime.shutdown_timeout(Duration::from_millis(100));
    // Every line before the exit line, which carries the count of those that could not wait.
    crate::output::lines::settle(exit_wait);
    let dropped = crate::output::lines::dropped_lines();
    tracing::info!(
        at = "exit",
        code,
        duration_ms = started.elapsed().as_millis() as u64,
        lines_dropped = (dropped > 0).then_some(dropped)
    );
    code
}

async fn run_async<P: Processor>(settings: Settings, processor: P) -> i32 {
    match start_and_run(settings, processor).await {
        Ok(code) | Err(code) => code,
    }
}

/// Starts ackd, runs it until a stop, and stops it: the exit code. `Err(code)`: the
/// exit code of a start that failed, or of a stop before anything was consumed.
async fn start_and_run<P: Processor>(settings: Settings, processor: P) -> Result<i32, i32> {
    let memory_limit = crate::consumer::memory::resolve(settings.memory);
    startup::log_start(&settings, &processor, memory_limit.as_ref());
    // Signals first: a SIGTERM that arrives while we connect must not kill us.
    let mut signals = stop::install()?;
    // The daemon keeps a handle to call the processor's shutdown hook after the final commit.
    let processor = Arc::new(processor);
    let copier = startup::copier(&settings)?;
    let memory = startup::plan_memory(&settings, memory_limit, &mut signals).await?;
    let parts = startup::Parts::new(&settings, memory);
    startup::serve_health(&settings, &parts.health)?;
    startup::lease(&settings, &parts, &mut signals).await?;
    let worker = startup::worker_config(&settings, processor.clone(), &parts, copier);
    let consumer = startup::create_consumer(&settings, &parts, worker)?;
    startup::subscribe(&consumer, &settings, &mut signals).await?;
    let reports = supervisor::spawn(
        consumer,
        parts.at_end.clone(),
        parts.commit_wanted.clone(),
        settings.commit_interval,
        settings.shutdown_timeout,
    )?;
    let stopping = stop::until_stop(
        settings.shutdown_timeout,
        &parts.stop_clock,
        &parts.health,
        &mut signals,
        reports,
        &processor,
    )
    .await?;
    Ok(stop::finish_stop(stopping, &mut signals, &parts.group, processor).await)
}

//! What follows a failed processor call: the wait before a retry, and the failure policy
//! (`ACKD_ON_FAILURE`: halt, skip, or dead-letter) once a message failed for good.

use super::handler::{Handled, Handler};
use crate::config::failure::OnFailure;
use crate::processors::processor::{Message, ProcessError, Processor};

impl<P: Processor> Handler<'_, P> {
    /// Logs a retry of `view` (and the `messages - 1` after it, for a batch) and waits for
    /// it. False: stop was requested meanwhile.
    pub(super) async fn wait_to_retry(
        &mut self,
        view: &Message<'_>,
        messages: usize,
        attempt: u32,
        error: &ProcessError,
    ) -> bool {
        let mut delay = self.config.retry.delay(attempt, self.rng);
        if let Some(after) = error.retry_after {
            // The processor knows better (Retry-After), within ACKD_RETRY_MAX_MS.
            delay = delay.max(after.min(self.config.retry.max));
        }
        self.shared.metrics.retried();
        tracing::warn!(
            at = "retry",
            topic = view.topic(),
            partition = view.partition(),
            offset = view.offset(),
            batch_messages = (self.config.batch.max_messages > 1).then_some(messages),
            attempt,
            max_attempts = self.config.retry.max_attempts,
            delay_ms = delay.as_millis() as u64,
            error = %error
        );
        tokio::select! {
            biased;
            _ = self.stop.wait_for(|s| *s) => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }

    /// The failure policy, once a message failed for good.
    pub(super) async fn give_up(
        &mut self,
        view: &Message<'_>,
        error: &ProcessError,
        attempts: u32,
    ) -> Handled {
        let (topic, partition, offset) = (view.topic(), view.partition(), view.offset());
        match self.config.on_failure {
            OnFailure::Halt => {
                tracing::error!(
                    at = "process_failed",
                    topic,
                    partition,
                    offset,
                    key = view.key(),
                    attempts,
                    error = %error,
                    "partition halted (ACKD_ON_FAILURE=halt): its offset is not committed past this message"
                );
                Handled::Halt
            }
            OnFailure::Skip => {
                self.shared.metrics.skipped();
                tracing::warn!(
                    at = "skipped",
                    topic,
                    partition,
                    offset,
                    key = view.key(),
                    attempts,
                    error = %error,
                    "acknowledged without processing (ACKD_ON_FAILURE=skip)"
                );
                Handled::Ack
            }
            OnFailure::DeadLetter => self.dead_letter(view, error, attempts).await,
        }
    }

    /// Hands the message to the dead-letter topic, retrying the produce like a processor
    /// failure; if it cannot be delivered, the partition halts: a message never goes nowhere.
    pub(super) async fn dead_letter(
        &mut self,
        view: &Message<'_>,
        error: &ProcessError,
        attempts: u32,
    ) -> Handled {
        let (topic, partition, offset) = (view.topic(), view.partition(), view.offset());
        let Some(dlq) = &self.config.dead_letter else {
            tracing::error!(at = "process_failed", topic, partition, offset, error = %error, "no dead-letter producer; partition halted");
            return Handled::Halt;
        };
        let mut attempt = 1;
        loop {
            match dlq.send(view, error).await {
                Ok((dl_partition, dl_offset)) => {
                    self.shared.metrics.dead_lettered();
                    tracing::warn!(
                        at = "dead_lettered",
                        topic,
                        partition,
                        offset,
                        key = view.key(),
                        attempts,
                        error = %error,
                        dead_letter_topic = dlq.topic(),
                        dead_letter_partition = dl_partition,
                        dead_letter_offset = dl_offset
                    );
                    return Handled::Ack;
                }
                Err(e) if self.config.retry.again(attempt) => {
                    let delay = self.config.retry.delay(attempt, self.rng);
                    tracing::warn!(at = "dead_letter_retry", topic, partition, offset, attempt, delay_ms = delay.as_millis() as u64, error = %e);
                    tokio::select! {
                        biased;
                        _ = self.stop.wait_for(|s| *s) => return Handled::Interrupted,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    attempt += 1;
                }
                Err(e) => {
                    tracing::error!(
                        at = "dead_letter_failed",
                        topic,
                        partition,
                        offset,
                        dead_letter_topic = dlq.topic(),
                        error = %e,
                        "could not dead-letter the message; partition halted, its offset is not committed past it"
                    );
                    return Handled::Halt;
                }
            }
        }
    }
}

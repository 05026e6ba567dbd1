//! Fetch errors on a partition's queue, and the offsets they may leave unread.

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::progress::Progress;
use crate::config::failure::OnFailure;

impl Progress<'_> {
    /// Offsets `from..to` are missing after a fetch error: they may be messages
    /// librdkafka could not read and moved past. The failure policy decides: with
    /// `skip` they are passed (a line says so), else the partition halts at `from`.
    pub(super) fn unread(&mut self, from: i64, to: i64, error: &KafkaError) -> Result<(), i64> {
        let skipped = (to - from) as u64;
        if self.on_failure == OnFailure::Skip {
            self.shared.metrics.offsets_skipped(skipped);
            self.shared.metrics.skipped();
            tracing::warn!(
                at = "skipped",
                topic = self.topic,
                partition = self.partition,
                offset = from,
                to,
                skipped,
                error = %error,
                "offsets left unread after a fetch error, passed without processing (ACKD_ON_FAILURE=skip)"
            );
            return Ok(());
        }
        self.fetch_halt(from, Some(to), error);
        Err(from)
    }

    /// The line of a partition halted by a fetch error at `offset`.
    fn fetch_halt(&self, offset: i64, to: Option<i64>, error: &KafkaError) {
        tracing::error!(
            at = "fetch_failed",
            topic = self.topic,
            partition = self.partition,
            offset,
            to,
            on_failure = self.on_failure.as_str(),
            error = %error,
            "messages from this offset could not be read: partition halted, its offset is not committed past them (a corrupt batch halts whatever ACKD_ON_FAILURE says; nothing unreadable can be dead-lettered)"
        );
    }

    /// A fetch error on the partition's queue. A batch that fails its CRC check
    /// (`check.crcs=true`) halts the partition at once, whatever `ACKD_ON_FAILURE` says:
    /// librdkafka fetches that batch again and again and never delivers what follows,
    /// so there is nothing to skip to (and nothing to dead-letter). Any other error is
    /// logged, and the offsets missing before the next message are then treated as
    /// unread ([`Progress::unread`]: an unsupported format, which librdkafka does move
    /// past, is skipped with `skip` and halts the partition otherwise). `Err(at)`: halt
    /// at `at`.
    pub(super) fn fetch_failed(&mut self, error: KafkaError) -> Result<(), i64> {
        // The end of the log is no error, and no message is missing after it.
        if let KafkaError::PartitionEOF(_) = error {
            return Ok(());
        }
        if matches!(
            error,
            KafkaError::MessageConsumption(RDKafkaErrorCode::BadMessage)
        ) {
            // Without a known position (no message yet, no committed offset) nothing
            // can be committed by this worker anyway.
            let at = self.expected().unwrap_or(0);
            self.fetch_halt(at, None, &error);
            return Err(at);
        }
        tracing::warn!(
            at = "fetch_error",
            topic = self.topic,
            partition = self.partition,
            expected_offset = self.expected(),
            error = %error,
            "offsets missing before the next message are treated as unread (ACKD_ON_FAILURE applies)"
        );
        self.fetch_error = Some(error);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::progress::testing::{counted, progress};
    use super::super::shared::WorkerShared;
    use super::*;
    use rdkafka::error::KafkaError;

    fn transient() -> KafkaError {
        KafkaError::MessageConsumption(RDKafkaErrorCode::UnknownTopicOrPartition)
    }

    #[test]
    fn offsets_missing_after_a_fetch_error_halt_the_partition_unless_skip() {
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        assert_eq!(p.dispatch(0), Ok(()));
        assert_eq!(p.dispatch(1), Ok(()));
        assert_eq!(p.fetch_failed(transient()), Ok(()));
        assert_eq!(p.dispatch(5), Err(2), "halted at the first unread offset");

        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::DeadLetter);
        assert_eq!(p.fetch_failed(transient()), Ok(()));
        assert_eq!(p.dispatch(3), Err(0), "unread from the committed offset");

        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Skip);
        assert_eq!(p.dispatch(0), Ok(()));
        assert_eq!(p.fetch_failed(transient()), Ok(()));
        assert_eq!(p.dispatch(4), Ok(()));
        assert_eq!(counted(&shared), (3, 1), "3 offsets passed, as one skip");
    }

    #[test]
    fn a_fetch_error_with_nothing_missing_after_it_is_forgotten() {
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        assert_eq!(p.dispatch(0), Ok(()));
        assert_eq!(p.fetch_failed(transient()), Ok(()));
        assert_eq!(p.dispatch(1), Ok(()));
        // A later gap is an ordinary one.
        assert_eq!(p.dispatch(9), Ok(()));
        assert_eq!(counted(&shared), (7, 0));
    }

    #[test]
    fn a_corrupt_batch_halts_at_the_next_offset_whatever_the_policy() {
        for policy in [OnFailure::Halt, OnFailure::Skip, OnFailure::DeadLetter] {
            let shared = WorkerShared::new();
            let mut p = progress(&shared, policy);
            assert_eq!(p.dispatch(0), Ok(()));
            let crc = KafkaError::MessageConsumption(RDKafkaErrorCode::BadMessage);
            assert_eq!(p.fetch_failed(crc), Err(1), "{policy:?}");
        }
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        assert_eq!(p.fetch_failed(KafkaError::PartitionEOF(0)), Ok(()));
        assert_eq!(p.dispatch(0), Ok(()));
        assert_eq!(
            p.dispatch(3),
            Ok(()),
            "the end of the log is no fetch error"
        );
    }
}

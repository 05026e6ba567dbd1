//! The group generation, as librdkafka knows it.

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

/// The group generation this member is in, as librdkafka knows it: in an assignment the
/// one that made it, in an eager revoke the one being left. On `assigned`/`revoked`
/// lines, so that who owned a partition when can be read across processes' logs.
pub(super) fn generation<C: ConsumerContext>(base: &BaseConsumer<C>) -> Option<i32> {
    // SAFETY: rd_kafka_consumer_group_metadata returns a copy the caller owns (or null
    // when the consumer is in no group), destroyed right after reading it.
    unsafe {
        let metadata = rdsys::rd_kafka_consumer_group_metadata(base.client().native_ptr());
        if metadata.is_null() {
            return None;
        }
        let generation = rdsys::rd_kafka_consumer_group_metadata_generation_id(metadata);
        rdsys::rd_kafka_consumer_group_metadata_destroy(metadata);
        (generation >= 0).then_some(generation)
    }
}

//! The name of one partition, shared by the group, the committer and the health
//! endpoint.

use std::sync::Arc;

/// A topic and a partition of it.
pub type TopicPartition = (Arc<str>, i32);

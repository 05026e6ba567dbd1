//! Output: every line ackd writes (`lines`: tracing events as logfmt on stdout, through a
//! writer thread, escaped by [`crate::logfmt`]), and the l2met metric vocabulary and
//! periodic summaries (`metrics`), and the HTTP health endpoint (`health`); and the name
//! of one partition (`TopicPartition`) they and the consumer share.

pub(crate) mod health;
pub(crate) mod lines;
pub(crate) mod metrics;

use std::sync::Arc;

/// A topic and a partition of it.
pub(crate) type TopicPartition = (Arc<str>, i32);

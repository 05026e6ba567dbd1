//! What the previous owner of a partition left behind, and how its next owner reads it,
//! one file per section of docs/guarantees.md: `commit_metadata` the metadata every
//! commit carries (`ackd/3:`, with the offsets acknowledged above the committed one);
//! `redelivery` where the next owner resumes, the acknowledged offsets it skips and the
//! ones it flags `redelivered`.

mod commit_metadata;
mod redelivery;

#[cfg(test)]
pub(crate) use commit_metadata::read_metadata;
pub(crate) use commit_metadata::{
    committed_with_metadata, count_offsets, encode_ranges, metadata, raw_metadata, MetadataState,
    Previous, ReadMetadata, RANGES_MAX_BYTES,
};
pub(crate) use redelivery::{resumed, Flagging, RedeliveryWindow, Resume, Skip};

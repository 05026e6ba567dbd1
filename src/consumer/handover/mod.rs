//! What the previous owner of a partition left behind, and how its next owner reads it:
//! the metadata every commit carries (`ackd/3:`, with the offsets acknowledged above the
//! committed one), in commit_metadata.rs. docs/guarantees.md describes it to operators.

mod commit_metadata;

#[cfg(test)]
pub(crate) use commit_metadata::read_metadata;
pub(crate) use commit_metadata::{
    committed_with_metadata, count_offsets, encode_ranges, metadata, raw_metadata, MetadataState,
    Previous, ReadMetadata, RANGES_MAX_BYTES,
};

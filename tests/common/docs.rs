//! Code blocks of the docs, read as the docs show them, for the tests that run them.

use std::path::Path;

/// The `n`th (from 1) block fenced with `fence` (e.g. "```python\n") after the first
/// occurrence of `heading` in `doc` (a path from the checkout, e.g. "docs/exec.md").
pub fn code_block(doc: &str, heading: &str, fence: &str, n: usize) -> String {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(doc))
        .unwrap_or_else(|e| panic!("read {doc}: {e}"));
    let section = text
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("{doc} has a {heading:?} section"));
    section
        .split(fence)
        .nth(n)
        .and_then(|rest| rest.split("```").next())
        .unwrap_or_else(|| panic!("{doc}'s {heading:?} section has a {fence:?} block number {n}"))
        .to_string()
}

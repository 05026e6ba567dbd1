//! The `ackd` binary: the library with its built-in processors.

use std::process::ExitCode;

/// jemalloc, also behind librdkafka's malloc and free (Cargo.toml says why).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    ackd::main_with(ackd::processors::Builtin::from_settings)
}

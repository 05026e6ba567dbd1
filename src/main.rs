//! The `ackd` binary: the library with its built-in processors.

use std::process::ExitCode;

/// jemalloc, also behind librdkafka's malloc and free (Cargo.toml says why).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options (a C string), read at its start; `MALLOC_CONF` in the environment
/// wins. Freed pages (fetch buffers, prefetched messages) go back to the system after
/// about 100 ms rather than jemalloc's default 10 s: 3 to 5 MiB less peak RSS on a
/// backlog for a few ms of CPU per million messages.
#[export_name = "malloc_conf"]
pub static MALLOC_CONF: &u8 = &b"dirty_decay_ms:100,muzzy_decay_ms:0\0"[0];

fn main() -> ExitCode {
    ackd::main_with(ackd::processors::Builtin::from_settings)
}

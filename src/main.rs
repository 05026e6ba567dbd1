//! The `ackd` binary: the library with its built-in processors.

use std::process::ExitCode;

/// jemalloc, also behind librdkafka's malloc and free (Cargo.toml says why).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options (a C string), read at its start; `MALLOC_CONF` in the environment
/// wins. Freed pages (fetch buffers, prefetched messages) go back to the system after
/// about 100 ms rather than jemalloc's default 10 s: 3 to 5 MiB less peak RSS on a
/// backlog for a few ms of CPU per million messages.
///
/// Other options measured (noop, 2,000,000 messages of 100 bytes, 4 partitions, Kafka,
/// medians of 5 alternating runs, peak RSS / CPU s): these 35-36 MiB / 1.09-1.18;
/// narenas:1 or 2 with or without tcache_max 1024 or 4096 34-37 / 1.12-1.15;
/// dirty_decay_ms 50 36 / 1.16; dirty_decay_ms 0 36 / 1.50 (+0.35 s system);
/// retain:false 36 / 1.18; background_thread 39 / 1.19; percpu_arena 42 / 1.17;
/// tcache:false 37 / 1.99. None lowers the peak: it comes in the first second, while
/// the four split partition queues each fill to queued.min.messages, and is live data
/// (it falls to 17 MiB once drained), not pages the allocator holds.
#[export_name = "malloc_conf"]
pub static MALLOC_CONF: &u8 = &b"dirty_decay_ms:100,muzzy_decay_ms:0\0"[0];

fn main() -> ExitCode {
    ackd::main_with(ackd::processors::Builtin::from_settings)
}

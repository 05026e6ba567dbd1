//! `ACKD_MEMORY_MB`: one memory budget for the whole process, on by default.
//!
//! Where it comes from ([`resolve`]): `ACKD_MEMORY_MB` in MiB (`memory_limit=setting`);
//! by default (`auto`) a quarter of the memory limit of the process's cgroup
//! (`memory_limit=cgroup`: a container, a Kubernetes pod, a Heroku dyno; the rest is
//! left to ackd's fixed baseline, librdkafka's allocator slack and an `exec` handler's
//! children, which run in the same cgroup), else [`DEFAULT_MB`] (`memory_limit=default`).
//! `ACKD_MEMORY_MB=off` turns it off.
//!
//! librdkafka fetches ahead into one queue per assigned partition (ackd splits them), and
//! with split queues its limits (`queued.max.messages.kbytes`, `queued.min.messages`)
//! apply per partition: prefetch memory is partitions × limit. Those limits are fixed
//! when the consumer is created, so a share per *held* partition cannot follow the
//! assignment; pausing partitions instead purges what librdkafka had fetched for them
//! (each pause bumps the partition's fetch version, and the purged messages are fetched
//! again) and races with revokes. So the budget is divided among the partitions ackd
//! *could* hold: every partition of `ACKD_TOPICS`, counted when ackd starts. Whatever
//! it is assigned, 1 or all, what it holds stays within the budget.
//!
//! With copies to make (retry tiers, dead letters), the producer of copies' queue
//! ([`COPIER_QUEUE`]) comes off the budget first; the partitions divide the rest.
//!
//! Per partition, with share S = budget / partitions, first [`PARTITION_COST`] for what
//! a partition costs held at all (its worker, librdkafka's partition state), and of the
//! rest, P:
//! - the queue stops fetching at Q = P/4 (`queued.max.messages.kbytes`), with a
//!   message count (`queued.min.messages`) that keeps librdkafka's own bookkeeping per
//!   message (a few hundred bytes) within P/8 when messages are small;
//! - one fetch response may land on top of a full queue with up to F = P/8 of the
//!   partition's messages (`max.partition.fetch.bytes`), and a queued message keeps its
//!   whole fetch response alive (librdkafka references responses, it does not copy
//!   them): F more per partition, which together size a response (`fetch.max.bytes`:
//!   partitions × F, at most the configured 1 MiB). librdkafka sends one fetch per
//!   broker at a time, so a response bounded by one partition's F would carry a few
//!   partitions' messages per round trip: with 1,000 partitions a tenth of the speed;
//! - the worker's read-ahead (src/consumer/partition_queue.rs) takes messages out of
//!   the queue, which librdkafka then refills: it takes about 16 KiB at a time, but
//!   when larger messages follow smaller ones, one call may take as much as the queue
//!   held, Q + F. A batch, and the messages `key`/`none` ordering holds in calls or
//!   waiting for their key, are held within the same Q + F ([`Budget::taken_bytes`]).
//!
//! 2Q + 3F + P/8 = P, with F at least a producer's record batch ([`RECORD_BATCH`]) and
//! Q giving way for it. Every limit is capped at the configured one (ackd's default, or a
//! value set by hand with `auto`), so a budget never raises the prefetch above what
//! ackd does without one. A message larger than its share still comes whole (a fetch
//! returns at least one record batch): the share bounds what piles up, not a message.
//! Behind a message larger than Q + F, librdkafka's limits would still let it fetch one
//! more whole batch, so the worker pauses its partition while it holds such a message
//! (src/consumer/partition_queue.rs): a partition of large messages holds one at a time.

mod cgroup;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, ClientContext};

use crate::settings::{MemorySetting, Settings};

/// The budget with no setting and no cgroup limit, in MiB: enough that 4 partitions keep
/// ackd's default limits (a share of 4 × 16 MiB and what a partition costs, rounded up).
pub const DEFAULT_MB: u64 = 320;
/// With `auto` under a cgroup memory limit, the budget is the limit divided by this.
pub const CGROUP_DIVISOR: u64 = 4;
/// What a partition costs held at all, taken from its share before the prefetch.
pub const PARTITION_COST: u64 = 32 * 1024;
/// The least share per partition: below it a partition fetches a few messages at a time.
pub const MIN_SHARE: u64 = 96 * 1024;
/// Partitions assumed when the brokers cannot tell how many the topics have.
pub const ASSUMED_PARTITIONS: u64 = 256;
/// librdkafka's least `message.max.bytes`.
const MIN_FETCH_BYTES: u64 = 8 * 1024;
/// The least a partition's piece of a fetch may be: a Java producer's record batch
/// (`batch.size` 16384). A broker answers a partition whose next batch does not fit its
/// piece with nothing (but for the first partition of a response), so below it a fetch
/// carries one partition's batch, a round trip each.
pub const RECORD_BATCH: u64 = 16 * 1024;
/// Where the files of `/proc/self/cgroup` and `/sys/fs/cgroup` are read; the testkit
/// stages a tree of its own with this variable.
#[cfg(feature = "testkit")]
pub const TEST_CGROUP_ROOT: &str = "TESTKIT_ACKD_CGROUP_ROOT";

/// Where the budget came from (`memory_limit=` on the start line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `ACKD_MEMORY_MB` in MiB.
    Setting,
    /// A fraction of the cgroup's limit, read from `file`.
    Cgroup { limit_bytes: u64, file: PathBuf },
    /// No setting, no cgroup limit: [`DEFAULT_MB`].
    Default,
}

impl Source {
    pub fn as_str(&self) -> &'static str {
        match self {
            Source::Setting => "setting",
            Source::Cgroup { .. } => "cgroup",
            Source::Default => "default",
        }
    }

    /// The cgroup's limit in MiB, for the start line.
    pub fn cgroup_limit_mb(&self) -> Option<u64> {
        match self {
            Source::Cgroup { limit_bytes, .. } => Some(limit_bytes >> 20),
            _ => None,
        }
    }
}

/// The budget's size and where it came from; `None`: `ACKD_MEMORY_MB=off`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub mb: u64,
    pub source: Source,
}

/// The budget `setting` asks for, reading the cgroup's limit for `auto`.
pub fn resolve(setting: MemorySetting) -> Option<Limit> {
    let root = PathBuf::from("/");
    #[cfg(feature = "testkit")]
    let root = std::env::var_os(TEST_CGROUP_ROOT).map_or(root, PathBuf::from);
    resolve_under(setting, &root)
}

fn resolve_under(setting: MemorySetting, root: &std::path::Path) -> Option<Limit> {
    match setting {
        MemorySetting::Off => None,
        MemorySetting::MiB(mb) => Some(Limit {
            mb,
            source: Source::Setting,
        }),
        MemorySetting::Auto => Some(match cgroup::read(root) {
            Some(l) => Limit {
                mb: ((l.bytes / CGROUP_DIVISOR) >> 20).max(1),
                source: Source::Cgroup {
                    limit_bytes: l.bytes,
                    file: l.file,
                },
            },
            None => Limit {
                mb: DEFAULT_MB,
                source: Source::Default,
            },
        }),
    }
}

/// The configured librdkafka limits (ackd's defaults, or set by hand with `auto`), which
/// a budget only ever lowers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    queue_kbytes: u64,
    queue_messages: u64,
    fetch_bytes: u64,
    response_bytes: u64,
    /// What the producer of copies may queue ([`COPIER_QUEUE`], with copies to make):
    /// kept out of what the partitions divide.
    copier_bytes: u64,
}

/// The producer of copies' queue (`queue.buffering.max.kbytes`; more only when a copy
/// topic takes larger messages, to fit one: src/consumer/copier.rs). Copies wait for
/// room beyond it.
pub const COPIER_QUEUE: u64 = 2 << 20;

impl Caps {
    /// From `settings`' `[rdkafka]` (config/default.toml's values layered under the
    /// environment).
    pub fn of(settings: &Settings) -> Caps {
        let configured =
            |property: &str| -> Option<u64> { settings.rdkafka.get(property)?.value.parse().ok() };
        let defaults = Caps::defaults();
        let fetch = configured("fetch.max.bytes").unwrap_or(defaults.fetch_bytes);
        Caps {
            queue_kbytes: configured("queued.max.messages.kbytes").unwrap_or(defaults.queue_kbytes),
            queue_messages: configured("queued.min.messages").unwrap_or(defaults.queue_messages),
            // fetch.message.max.bytes is librdkafka's other name for it.
            fetch_bytes: configured("max.partition.fetch.bytes")
                .or_else(|| configured("fetch.message.max.bytes"))
                .map_or(fetch, |p| p.min(fetch)),
            response_bytes: fetch,
            copier_bytes: if makes_copies(settings) {
                COPIER_QUEUE
            } else {
                0
            },
        }
    }

    /// config/default.toml's `[rdkafka]` limits (declared there only).
    pub fn defaults() -> Caps {
        let defaults = crate::settings::rdkafka_defaults();
        let limit = |property: &str| -> u64 {
            defaults
                .iter()
                .find(|(p, _)| p == property)
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or_else(|| panic!("config/default.toml sets {property} to a number"))
        };
        Caps {
            queue_kbytes: limit("queued.max.messages.kbytes"),
            queue_messages: limit("queued.min.messages"),
            fetch_bytes: limit("fetch.max.bytes"),
            response_bytes: limit("fetch.max.bytes"),
            copier_bytes: 0,
        }
    }
}

/// Whether ackd makes copies of failed messages (retry tiers, dead letters): as
/// src/consumer/daemon/startup.rs decides to make a producer of copies.
fn makes_copies(settings: &Settings) -> bool {
    let dead_letter = settings.failure.on_failure == crate::settings::OnFailure::DeadLetter
        && settings.failure.dead_letter_topic.is_some();
    dead_letter || !settings.failure.retry_tiers.is_empty()
}

/// The budget and what it gives each partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub bytes: u64,
    pub source: Source,
    /// The partitions it is divided among (those of the topics, or assumed).
    pub partitions: u64,
    /// Whether `partitions` was counted (false: [`ASSUMED_PARTITIONS`]).
    pub counted: bool,
    pub share: u64,
    pub queue_kbytes: u64,
    pub queue_messages: u64,
    /// Of one partition in one fetch response (`max.partition.fetch.bytes`).
    pub fetch_bytes: u64,
    /// One fetch response (`fetch.max.bytes`): what the partitions' `fetch_bytes` add up
    /// to, at most the configured value.
    pub response_bytes: u64,
}

impl Budget {
    /// Divides `limit` among `partitions` (`None`: unknown), under `caps`. `Err`: the
    /// problem, for an `at=config_error setting=ACKD_MEMORY_MB` line.
    pub fn plan(limit: &Limit, partitions: Option<u64>, caps: Caps) -> Result<Budget, String> {
        let bytes = limit.mb << 20;
        // The copier's queue first; the partitions divide the rest.
        let divided = bytes.saturating_sub(caps.copier_bytes);
        let (partitions, counted) = match partitions {
            Some(p) => (p.max(1), true),
            // Unknown: assume many, but never a share below the minimum.
            None => ((divided / MIN_SHARE).clamp(1, ASSUMED_PARTITIONS), false),
        };
        let share = divided / partitions;
        if share < MIN_SHARE {
            let needed = (partitions * MIN_SHARE).div_ceil(1 << 20);
            let cgroup = match &limit.source {
                Source::Cgroup { limit_bytes, .. } => format!(
                    " (a quarter of the container's memory limit, {} MiB; set ACKD_MEMORY_MB, or give the container more)",
                    limit_bytes >> 20
                ),
                _ => String::new(),
            };
            return Err(format!(
                "gives {} KiB per partition to the {partitions} partitions of ACKD_TOPICS{cgroup}; at least {} KiB each: {needed} or more",
                share / 1024,
                MIN_SHARE / 1024
            ));
        }
        let prefetch = share - PARTITION_COST;
        let fetch_bytes = (prefetch / 8).max(RECORD_BATCH).min(caps.fetch_bytes);
        // 2Q + 3F + P/8 = P: a piece of a fetch raised to a record batch comes out of
        // the queue, which is P/4 otherwise (and when a cap keeps F below P/8).
        let queue = (prefetch / 4).min(prefetch.saturating_sub(prefetch / 8 + 3 * fetch_bytes) / 2);
        Ok(Budget {
            bytes,
            source: limit.source.clone(),
            partitions,
            counted,
            share,
            // The configured caps win over the least values (they may be below them).
            queue_kbytes: (queue / 1024).max(1).min(caps.queue_kbytes),
            // librdkafka keeps a few hundred bytes per queued message besides its value:
            // bound the count too, for small messages.
            queue_messages: (prefetch / 8 / 512).max(16).min(caps.queue_messages),
            fetch_bytes,
            response_bytes: (partitions * fetch_bytes)
                .min(caps.response_bytes)
                .max(fetch_bytes),
        })
    }

    /// What a partition's worker may hold taken out of its queue (a read-ahead at a
    /// change of sizes, a batch): what the queue held at most, its bound and a response.
    pub fn taken_bytes(&self) -> usize {
        (self.queue_kbytes * 1024 + self.fetch_bytes) as usize
    }

    /// `ACKD_BATCH_MAX_BYTES` (0: none) under the budget: a batch is taken out of the
    /// queue, which librdkafka refills, so it is held within [`Budget::taken_bytes`].
    pub fn batch_max_bytes(budget: Option<&Budget>, configured: usize) -> usize {
        match (budget.map(Budget::taken_bytes), configured) {
            (None, c) => c,
            (Some(b), 0) => b,
            (Some(b), c) => c.min(b),
        }
    }

    /// Sets the librdkafka limits.
    pub fn apply(&self, config: &mut ClientConfig) {
        config
            .set("queued.max.messages.kbytes", self.queue_kbytes.to_string())
            .set("queued.min.messages", self.queue_messages.to_string())
            // A partition's fetch may be below librdkafka's least fetch.max.bytes.
            .set(
                "fetch.max.bytes",
                self.response_bytes.max(MIN_FETCH_BYTES).to_string(),
            )
            .set("max.partition.fetch.bytes", self.fetch_bytes.to_string())
            // fetch.max.bytes must be at least this (a producer's setting, unused here).
            .set(
                "message.max.bytes",
                self.fetch_bytes
                    .clamp(MIN_FETCH_BYTES, 1_000_000)
                    .to_string(),
            );
    }

    /// The `at=memory_budget` line, at start and whenever the assignment changes.
    pub fn log(&self, held: Option<usize>) {
        let over = held.is_some_and(|h| h as u64 > self.partitions);
        let prefetch_kb = held.map(|h| h as u64 * self.share / 1024);
        if over {
            tracing::warn!(
                at = "memory_budget",
                memory_mb = self.bytes >> 20,
                partitions = held,
                divided_among = self.partitions,
                share_kb = self.share / 1024,
                prefetch_kb,
                "more partitions than the budget was divided among (partitions added, or unknown at start): memory may exceed the budget until ackd restarts"
            );
        } else {
            tracing::info!(
                at = "memory_budget",
                memory_mb = self.bytes >> 20,
                memory_limit = held.is_none().then_some(self.source.as_str()),
                partitions = held,
                divided_among = self.partitions,
                counted = self.counted,
                share_kb = self.share / 1024,
                prefetch_kb,
                queued_max_messages_kbytes = held.is_none().then_some(self.queue_kbytes),
                queued_min_messages = held.is_none().then_some(self.queue_messages),
                max_partition_fetch_bytes = held.is_none().then_some(self.fetch_bytes),
                fetch_max_bytes = held.is_none().then_some(self.response_bytes),
            );
        }
    }
}

/// The partitions of the topics ackd consumes (`ACKD_TOPICS` and their retry tiers: each
/// tier partition has a queue and a worker like any other), from the brokers; `None` when they cannot be
/// asked (or a topic does not exist yet) within `timeout`, or at once when the brokers
/// refuse ackd's credentials: the consumer reports that (`at=auth_failed`, exit 77)
/// without this count holding it up.
pub fn count_partitions(settings: &Settings, timeout: Duration) -> Option<u64> {
    let consumer: BaseConsumer<CountContext> =
        crate::settings::client_config::asking_config(settings)
            .create_with_context(CountContext::default())
            .ok()?;
    let deadline = Instant::now() + timeout;
    let mut total = 0;
    for topic in &settings.consumed_topics() {
        // In slices, serving librdkafka's error events between them.
        let metadata = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match consumer.fetch_metadata(Some(topic), left.min(Duration::from_millis(250))) {
                Ok(m) => break m,
                Err(_) if left.is_zero() => return None,
                Err(_) => {}
            }
            let _ = consumer.poll(Duration::ZERO);
            if consumer.context().auth_failed.load(Ordering::Relaxed) {
                return None;
            }
        };
        let t = metadata.topics().iter().find(|t| t.name() == topic)?;
        if t.error().is_some() || t.partitions().is_empty() {
            return None;
        }
        total += t.partitions().len() as u64;
    }
    Some(total)
}

/// The counting client's errors: only whether one was an authentication failure (the
/// consumer logs its own).
#[derive(Default)]
struct CountContext {
    auth_failed: AtomicBool,
}

impl ClientContext for CountContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if crate::consumer::auth::is_auth_failure(&error, reason) {
            self.auth_failed.store(true, Ordering::Relaxed);
        }
    }
}

impl ConsumerContext for CountContext {}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting(mb: u64) -> Limit {
        Limit {
            mb,
            source: Source::Setting,
        }
    }

    fn plan(mb: u64, partitions: Option<u64>) -> Result<Budget, String> {
        Budget::plan(&setting(mb), partitions, Caps::defaults())
    }

    #[test]
    fn divides_the_budget_among_the_partitions() {
        let b = plan(64, Some(200)).unwrap();
        assert_eq!(b.share, (64 << 20) / 200);
        let p = b.share - PARTITION_COST;
        assert_eq!(b.queue_kbytes, p / 4 / 1024);
        assert_eq!(b.fetch_bytes, p / 8);
        assert_within_share(&b);
    }

    /// The queue, a response on top, responses kept alive, a read-ahead of what the
    /// queue held, and librdkafka's bookkeeping per message: within the share.
    fn assert_within_share(b: &Budget) {
        let queue = b.queue_kbytes * 1024;
        let bookkeeping = b.queue_messages * 512;
        assert!(
            PARTITION_COST + 2 * queue + 3 * b.fetch_bytes + bookkeeping <= b.share,
            "{b:?}"
        );
    }

    #[test]
    fn a_partitions_piece_of_a_fetch_holds_a_record_batch() {
        // 1,000 partitions under 128 MiB, 300 under 32 MiB, the least share: an eighth
        // of the prefetch is below a record batch, the queue gives way, the share holds.
        for (mb, partitions) in [(128, 1000), (32, 300), (19, 200)] {
            let b = plan(mb, Some(partitions)).unwrap();
            assert_eq!(b.fetch_bytes, RECORD_BATCH, "{b:?}");
            assert!(b.queue_kbytes >= 1, "{b:?}");
            assert_within_share(&b);
        }
        // A piece capped below an eighth (1 MiB here) leaves the queue at a quarter.
        let b = plan(128, Some(8)).unwrap();
        assert_eq!(
            b.queue_kbytes,
            (b.share - PARTITION_COST) / 4 / 1024,
            "{b:?}"
        );
    }

    #[test]
    fn a_response_carries_many_partitions() {
        // 1,000 partitions of 320 MiB: 38 KiB each in a response, and a response of the
        // configured 1 MiB, not one partition's 38 KiB (a tenth of the speed).
        let b = plan(320, Some(1000)).unwrap();
        assert!(b.fetch_bytes < 40 * 1024, "{b:?}");
        assert_eq!(b.response_bytes, Caps::defaults().response_bytes);
        // What the partitions' pieces add up to, when that is less.
        let b = plan(1, Some(2)).unwrap();
        assert_eq!(b.response_bytes, 2 * b.fetch_bytes);
        let b = plan(1, Some(1)).unwrap();
        assert_eq!(b.response_bytes, b.fetch_bytes);
    }

    #[test]
    fn the_copiers_queue_comes_out_of_the_budget() {
        let without = plan(64, Some(4)).unwrap();
        let copies = Caps {
            copier_bytes: COPIER_QUEUE,
            ..Caps::defaults()
        };
        let with = Budget::plan(&setting(64), Some(4), copies).unwrap();
        assert_eq!(with.share, ((64 << 20) - COPIER_QUEUE) / 4);
        assert!(with.share < without.share);
        assert!(with.share * 4 + COPIER_QUEUE <= with.bytes);
        let settings = |extra: &[(&str, &str)]| {
            let mut v: Vec<(String, String)> = [
                ("KAFKA_URL", "kafka://127.0.0.1:9092"),
                ("ACKD_TOPICS", "t"),
                ("ACKD_GROUP_ID", "g"),
            ]
            .iter()
            .chain(extra)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            v.sort();
            Settings::from_vars(v).unwrap()
        };
        let tiers = settings(&[("ACKD_RETRY_TOPICS", "10s")]);
        assert_eq!(Caps::of(&tiers).copier_bytes, COPIER_QUEUE);
        assert_eq!(Caps::of(&settings(&[])).copier_bytes, 0);
    }

    #[test]
    fn never_raises_the_configured_limits() {
        let b = plan(4096, Some(1)).unwrap();
        let most = Caps::defaults();
        assert_eq!(b.queue_kbytes, most.queue_kbytes);
        assert_eq!(b.queue_messages, most.queue_messages);
        assert_eq!(b.fetch_bytes, most.fetch_bytes);
        let lower = Caps {
            queue_kbytes: 1024,
            queue_messages: 100,
            fetch_bytes: 65536,
            response_bytes: 65536,
            copier_bytes: 0,
        };
        let b = Budget::plan(&setting(4096), Some(1), lower).unwrap();
        assert_eq!(
            (b.queue_kbytes, b.queue_messages, b.fetch_bytes),
            (1024, 100, 65536)
        );
    }

    #[test]
    fn with_auto_a_limit_set_by_hand_is_the_cap() {
        let vars = |extra: &[(&str, &str)]| {
            let mut v = vec![
                (
                    "KAFKA_URL".to_string(),
                    "kafka://127.0.0.1:9092".to_string(),
                ),
                ("ACKD_TOPICS".to_string(), "t".to_string()),
                ("ACKD_GROUP_ID".to_string(), "g".to_string()),
            ];
            v.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            Settings::from_vars(v).unwrap()
        };
        assert_eq!(Caps::of(&vars(&[])), Caps::defaults());
        let by_hand = vars(&[
            ("ACKD_RDKAFKA_QUEUED_MAX_MESSAGES_KBYTES", "1024"),
            ("ACKD_RDKAFKA_MAX_PARTITION_FETCH_BYTES", "65536"),
        ]);
        let b = Budget::plan(&setting(320), Some(4), Caps::of(&by_hand)).unwrap();
        assert_eq!((b.queue_kbytes, b.fetch_bytes), (1024, 65536));
        assert_eq!(b.queue_messages, Caps::defaults().queue_messages);
    }

    #[test]
    fn the_default_budget_keeps_the_default_limits_at_four_partitions() {
        // What a 4-partition backlog needs to run at full speed is what ackd's
        // defaults give it: the default budget must not lower them.
        let default =
            resolve_under(MemorySetting::Auto, std::path::Path::new("/nonexistent")).unwrap();
        assert_eq!(default.source, Source::Default);
        let b = Budget::plan(&default, Some(4), Caps::defaults()).unwrap();
        let most = Caps::defaults();
        assert_eq!(
            (b.queue_kbytes, b.queue_messages, b.fetch_bytes),
            (most.queue_kbytes, most.queue_messages, most.fetch_bytes)
        );
    }

    #[test]
    fn auto_takes_a_quarter_of_the_cgroup_limit_and_off_is_none() {
        let root = std::env::temp_dir().join(format!("ackd-resolve-{}", std::process::id()));
        std::fs::create_dir_all(root.join("proc/self")).unwrap();
        std::fs::create_dir_all(root.join("sys/fs/cgroup")).unwrap();
        std::fs::write(root.join("proc/self/cgroup"), "0::/\n").unwrap();
        std::fs::write(root.join("sys/fs/cgroup/cgroup.controllers"), "memory").unwrap();
        std::fs::write(root.join("sys/fs/cgroup/memory.max"), "536870912").unwrap();
        let l = resolve_under(MemorySetting::Auto, &root).unwrap();
        assert_eq!(l.mb, 128);
        assert_eq!(l.source.as_str(), "cgroup");
        assert_eq!(l.source.cgroup_limit_mb(), Some(512));
        assert_eq!(resolve_under(MemorySetting::Off, &root), None);
        assert_eq!(
            resolve_under(MemorySetting::MiB(64), &root),
            Some(setting(64))
        );
    }

    #[test]
    fn too_small_a_share_is_refused_with_what_would_do() {
        let e = plan(8, Some(200)).unwrap_err();
        assert!(e.contains("200 partitions"), "{e}");
        assert!(e.contains("19 or more"), "{e}");
        assert!(plan(19, Some(200)).is_ok());
    }

    #[test]
    fn unknown_partitions_assume_many_within_the_minimum() {
        let b = plan(64, None).unwrap();
        assert_eq!(b.partitions, ASSUMED_PARTITIONS);
        assert!(!b.counted);
        let small = plan(4, None).unwrap();
        assert!(small.share >= MIN_SHARE);
    }

    #[test]
    fn librdkafka_accepts_the_limits() {
        // Caps set by hand below ackd's least values (tests/partition_worker.rs sets
        // these): they win, without a panic, and librdkafka takes them.
        let tiny = Caps {
            queue_kbytes: 1,
            queue_messages: 5,
            fetch_bytes: 512,
            response_bytes: 512,
            copier_bytes: 0,
        };
        let b = Budget::plan(&setting(320), Some(1), tiny).unwrap();
        assert_eq!(
            (b.queue_kbytes, b.queue_messages, b.fetch_bytes),
            (1, 5, 512)
        );
        let mut config = ClientConfig::new();
        config.set("group.id", "g");
        b.apply(&mut config);
        config.create::<BaseConsumer>().expect("tiny caps");
        for (mb, p) in [(1, Some(1)), (64, Some(200)), (19, Some(200)), (1024, None)] {
            let b = plan(mb, p).unwrap();
            let mut config = ClientConfig::new();
            config.set("group.id", "g");
            b.apply(&mut config);
            if let Err(e) = config.create::<BaseConsumer>() {
                panic!("{mb} MiB, {p:?}: {e}");
            }
        }
    }
}

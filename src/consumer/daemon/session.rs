//! The session timeout this member is under, read once at start, and the membership
//! lease derived from it (src/consumer/membership.rs): `at=membership_lease`.
//!
//! Classic protocol: the client's own `session.timeout.ms` and `heartbeat.interval.ms`.
//! KIP-848 (`ACKD_GROUP_PROTOCOL=consumer`): the broker sets both, so they are read with
//! DescribeConfigs, the group's own config first (`consumer.session.timeout.ms`, whose
//! value is the broker's when the group has none), else a broker's
//! (`group.consumer.session.timeout.ms`); unreadable (no `DESCRIBE_CONFIGS` permission,
//! an older broker), a short session is assumed, with a warning: a lease too short costs
//! renewal reads and a held partition now and then, one too long would not protect.

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

use crate::consumer::membership::LeaseTerms;
use crate::settings::client_config::{asking_config, consumer_config};
use crate::settings::{GroupProtocol, Settings};

/// librdkafka's defaults for the classic protocol.
const CLASSIC_SESSION: Duration = Duration::from_millis(45_000);
const CLASSIC_HEARTBEAT: Duration = Duration::from_millis(3_000);
/// Assumed when the broker's session cannot be read: shorter than Kafka's default (45 s,
/// its default minimum too) and its heartbeat longer than the default (5 s) allows.
const ASSUMED_SESSION: Duration = Duration::from_millis(10_000);
const ASSUMED_HEARTBEAT: Duration = Duration::from_millis(3_000);

/// Where the session timeout was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    Client,
    GroupConfig,
    BrokerConfig,
    Assumed,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Client => "client",
            Source::GroupConfig => "group_config",
            Source::BrokerConfig => "broker_config",
            Source::Assumed => "assumed",
        }
    }
}

/// The lease's terms for this member, logged once. Blocks (a KIP-848 member asks the
/// broker, for `timeout` at most in all).
pub(super) fn lease_terms(settings: &Settings, timeout: Duration) -> LeaseTerms {
    let (terms, from, error) = match settings.group.protocol {
        GroupProtocol::Classic => {
            let config = consumer_config(settings);
            let ms = |key: &str, default: Duration| {
                config
                    .get(key)
                    .and_then(|v| v.parse::<u64>().ok())
                    .map_or(default, Duration::from_millis)
            };
            let session = ms("session.timeout.ms", CLASSIC_SESSION);
            let heartbeat = ms("heartbeat.interval.ms", CLASSIC_HEARTBEAT);
            (LeaseTerms::new(session, heartbeat), Source::Client, None)
        }
        GroupProtocol::Consumer => match read_from_broker(settings, timeout) {
            Ok((session, heartbeat, from)) => (LeaseTerms::new(session, heartbeat), from, None),
            Err(e) => (
                LeaseTerms::new(ASSUMED_SESSION, ASSUMED_HEARTBEAT),
                Source::Assumed,
                Some(e),
            ),
        },
    };
    log(&terms, from, error.as_deref());
    terms
}

fn log(terms: &LeaseTerms, from: Source, error: Option<&str>) {
    let ms = |d: Duration| d.as_millis() as u64;
    match error {
        None => tracing::info!(
            at = "membership_lease",
            session_timeout_ms = ms(terms.session),
            heartbeat_interval_ms = ms(terms.heartbeat),
            from = from.as_str(),
            lease_ms = ms(terms.term),
            renew_after_ms = ms(terms.renew_after),
            "partitions start messages only while the group coordinator answered within lease_ms"
        ),
        Some(error) => tracing::warn!(
            at = "membership_lease",
            session_timeout_ms = ms(terms.session),
            heartbeat_interval_ms = ms(terms.heartbeat),
            from = from.as_str(),
            lease_ms = ms(terms.term),
            renew_after_ms = ms(terms.renew_after),
            error,
            "the broker's group.consumer.session.timeout.ms could not be read (DescribeConfigs): a short session is assumed; a broker session shorter than it would let a member cut off by the network start messages its successor processes too"
        ),
    }
}

/// The session timeout and heartbeat interval of a KIP-848 group: the group's config,
/// else a broker's.
fn read_from_broker(
    settings: &Settings,
    timeout: Duration,
) -> Result<(Duration, Duration, Source), String> {
    let admin: AdminClient<DefaultClientContext> = asking_config(settings)
        .create()
        .map_err(|e| e.to_string())?;
    // One budget for every request: a broker that does not answer delays the start once.
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("no answer within {} ms", timeout.as_millis()))
    };
    let group = ResourceSpecifier::Group(&settings.group_id);
    let read = |spec: &ResourceSpecifier<'_>, session: &str, heartbeat: &str| {
        let opts = AdminOptions::new().request_timeout(Some(left()?));
        let results = futures::executor::block_on(admin.describe_configs([spec], &opts))
            .map_err(|e| e.to_string())?;
        let resource = results
            .into_iter()
            .next()
            .ok_or("no answer")?
            .map_err(|code| code.to_string())?;
        let ms = |key: &str| {
            resource
                .get(key)
                .and_then(|e| e.value.as_deref()?.parse::<u64>().ok())
                .map(Duration::from_millis)
                .ok_or_else(|| format!("no {key} in the answer"))
        };
        Ok::<_, String>((ms(session)?, ms(heartbeat)?))
    };
    let from_group = read(
        &group,
        "consumer.session.timeout.ms",
        "consumer.heartbeat.interval.ms",
    );
    if let Ok((s, h)) = from_group {
        return Ok((s, h, Source::GroupConfig));
    }
    let metadata = admin
        .inner()
        .fetch_metadata(None, left()?)
        .map_err(|e| e.to_string())?;
    let broker = metadata
        .brokers()
        .first()
        .ok_or("no broker in the metadata")?;
    let (s, h) = read(
        &ResourceSpecifier::Broker(broker.id()),
        "group.consumer.session.timeout.ms",
        "group.consumer.heartbeat.interval.ms",
    )
    .map_err(|e| match &from_group {
        Err(g) => format!("group config: {g}; broker config: {e}"),
        Ok(_) => e,
    })?;
    Ok((s, h, Source::BrokerConfig))
}

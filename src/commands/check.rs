//! `ackd check`: is this configuration right? One `at=check check=NAME ok=true|false`
//! line per check (settings, brokers, auth, one per topic, group), each with what it
//! found; the exit code is the daemon's for the same problem: 78 a setting (a missing
//! topic included), 77 authentication, 69 brokers unreachable within
//! [`super::connect::CONNECT_BOUND`]. It never joins the group and never commits.

use std::time::Instant;

use crate::exit;
use crate::settings::Settings;

use super::connect::{connect, create, partitions, Probe, Unreached};
use super::describe::describe_group;

/// Runs every check that can run; returns the exit code.
pub fn run(settings: &Settings) -> i32 {
    settings_ok(settings);
    let probe = match create(settings, "check") {
        Ok(p) => p,
        Err(code) => return code,
    };
    let started = Instant::now();
    if let Err(code) = check_brokers(settings, &probe) {
        return code;
    }
    let mut code = check_topics(settings, &probe);
    if !check_group(settings, &probe) && code == exit::OK {
        code = exit::UNAVAILABLE;
    }
    tracing::debug!(
        at = "check_done",
        took_ms = started.elapsed().as_millis() as u64
    );
    code
}

/// The settings were read: what they name.
fn settings_ok(settings: &Settings) {
    tracing::info!(
        at = "check",
        check = "settings",
        ok = true,
        topics = settings.topics.join(","),
        group = &settings.group_id,
        bootstrap = settings.brokers.bootstrap_servers(),
        security = settings.brokers.security.protocol(),
    );
}

/// The brokers answer and accept ackd's credentials; `Err` is the exit code.
fn check_brokers(settings: &Settings, probe: &Probe) -> Result<(), i32> {
    match connect(probe, settings.topics.first().map(String::as_str)) {
        Ok((metadata, took)) => {
            metadata_ok(settings, &metadata, took);
            Ok(())
        }
        Err(Unreached::Auth) => {
            tracing::error!(
                at = "check",
                check = "auth",
                ok = false,
                security = settings.brokers.security.protocol(),
                "the brokers refused ackd's credentials or ackd refused theirs (see at=auth_failed)"
            );
            Err(exit::NOPERM)
        }
        Err(e @ Unreached::Unavailable { .. }) => {
            if let Unreached::Unavailable { waited, error } = &e {
                tracing::error!(
                    at = "check",
                    check = "brokers",
                    ok = false,
                    bootstrap = settings.brokers.bootstrap_servers(),
                    waited_ms = waited.as_millis() as u64,
                    error = error.as_str(),
                    "no broker answered"
                );
            }
            Err(e.code())
        }
    }
}

/// One line per configured topic (retry tiers' included); the exit code so far.
fn check_topics(settings: &Settings, probe: &Probe) -> i32 {
    match partitions(probe, &settings.consumed_topics()) {
        Ok(found) => {
            let mut missing = Vec::new();
            for (topic, partitions) in &found {
                match partitions {
                    Some(ps) => tracing::info!(
                        at = "check",
                        check = "topic",
                        ok = true,
                        topic = topic.as_str(),
                        partitions = ps.len()
                    ),
                    None => {
                        tracing::error!(
                            at = "check",
                            check = "topic",
                            ok = false,
                            topic = topic.as_str(),
                            "the topic does not exist"
                        );
                        missing.push(topic.clone());
                    }
                }
            }
            if missing.is_empty() {
                return exit::OK;
            }
            // The daemon's own line for it, word for word: the same contract.
            crate::consumer::topics::report_missing_all(settings, &missing);
            exit::CONFIG
        }
        Err(e) => {
            tracing::error!(at = "check", check = "topic", ok = false, error = %e, "could not ask for the topics");
            exit::UNAVAILABLE
        }
    }
}

/// The group, as the brokers describe it; false if they could not.
fn check_group(settings: &Settings, probe: &Probe) -> bool {
    match describe_group(probe, &settings.group_id) {
        Ok(g) => {
            tracing::info!(
                at = "check",
                check = "group",
                ok = true,
                group = &settings.group_id,
                state = g.state.as_str(),
                protocol = (!g.protocol.is_empty()).then_some(g.protocol.as_str()),
                kind = (!g.kind.is_empty()).then_some(g.kind.as_str()),
                members = g.members.len(),
            );
            true
        }
        Err(e) => {
            tracing::error!(at = "check", check = "group", ok = false, group = &settings.group_id, error = %e, "the group could not be described");
            false
        }
    }
}

fn metadata_ok(
    settings: &Settings,
    metadata: &rdkafka::metadata::Metadata,
    took: std::time::Duration,
) {
    tracing::info!(
        at = "check",
        check = "brokers",
        ok = true,
        brokers = metadata.brokers().len(),
        bootstrap = settings.brokers.bootstrap_servers(),
        took_ms = took.as_millis() as u64,
    );
    tracing::info!(
        at = "check",
        check = "auth",
        ok = true,
        security = settings.brokers.security.protocol(),
        tls = crate::settings::security::tls_summary(settings.tls.as_ref()),
        sasl = crate::settings::security::sasl_summary(settings.sasl.as_ref()),
    );
}

//! Shared harness for the integration tests (`mod common;` in each test binary), one module
//! a concern; a test imports what it uses, e.g. `use common::{ackd::*, lines::*, topics::*};`.
//!
//! Every test binary uses a subset, hence the `dead_code` allowance.
//!
//! Children (the broker, ackd) are spawned by one dedicated thread that never exits, with
//! `PR_SET_PDEATHSIG = SIGKILL`: the kernel delivers that signal when the *thread* that forked
//! the child exits, and libtest runs each test on its own short-lived thread.

#![allow(dead_code)]

/// Accounting across runs: lost, duplicated, refused commits ([`accounting::Tally`]).
pub mod accounting;
/// Running the real `ackd` binary ([`ackd::AckdBuilder`], [`ackd::AckdProcess`]).
pub mod ackd;
/// Kafka brokers: the shared one per test binary, with options, or a cluster of a test's own.
pub mod broker;
/// Every delivery a processor saw, with its redelivered flag, checked against the bounds
/// `at=assigned` stated ([`deliveries::assert_flagged`]).
pub mod deliveries;
/// Code blocks of the docs, as the docs show them ([`docs::code_block`]).
pub mod docs;
/// Reading ackd's output: logfmt fields, `at=` lines, processed messages, refused commits.
pub mod lines;
/// Log ends and committed offsets of a group: read, asserted, committed raw.
pub mod offsets;
/// A throwaway PKI for the TLS and SASL tests ([`pki::Pki`]).
pub mod pki;
/// Producing test messages (delivery reports as ground truth) and reading them back.
pub mod produce;
/// A TCP proxy between one client and the broker that can cut, heal, reset and delay
/// ([`proxy::Proxy`]).
pub mod proxy;
/// The test Schema Registry (Apicurio) and the registry-aware producer.
pub mod registry;
/// Spawning children tied to the test process, free ports, the log directory.
pub mod spawn;
/// Messages with known timestamps and the lag in seconds reported for them.
pub mod stamped;
/// Unique names and topics.
pub mod topics;
/// Polling a condition until it holds ([`wait::wait_until`]).
pub mod wait;

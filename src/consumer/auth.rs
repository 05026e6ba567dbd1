//! Authentication failures at run time: a TLS handshake the broker or ackd refused, or a
//! SASL login the broker refused.
//!
//! librdkafka retries every connection error forever: its error callback carries errors
//! "of an informational nature ... the client will automatically try to recover from all
//! errors, given that the client and cluster is correctly configured" (INTRODUCTION.md,
//! "Threads and callbacks"), and none of these is one of its fatal errors ("Fatal
//! errors": idempotence, static-membership fencing). An authentication failure is the
//! case that premise excludes: a wrong CA, a missing or refused client certificate, a
//! wrong password do not fix themselves, and librdkafka also reports identical errors
//! only once per 30 s (`rd_kafka_broker_set_error`), so left alone ackd would spin
//! silently. ackd therefore treats the first one as fatal: it logs one `at=auth_failed`
//! line with the broker and the reason, stops gracefully and exits 77 (EX_NOPERM); the
//! platform restarts it with whatever configuration is current.
//!
//! What counts (see [`is_auth_failure`]):
//! - `RD_KAFKA_RESP_ERR__SSL`: librdkafka reports disconnects during the handshake as
//!   transport errors instead ("since these disconnects are at the transport level (e.g.,
//!   incorrect listener, flaky load balancer, etc) and not due to SSL issues", CHANGELOG
//!   v1.7.0), so what remains is a real TLS failure: an unverifiable broker chain, a
//!   host-name mismatch, no TLS on that port.
//! - `RD_KAFKA_RESP_ERR__AUTHENTICATION`: SASL refused (mechanism or credentials).
//! - `RD_KAFKA_RESP_ERR__TRANSPORT` whose reason is an OpenSSL certificate error or a TLS
//!   alert from the broker: with TLS 1.3 the server checks the client certificate after
//!   the client finished its handshake, so "certificate required" / "unknown ca" arrive
//!   as a receive failure.
//!
//! A broker that is down, refuses connections, or drops them ("Connection refused",
//! "Disconnected", "unexpected eof", "All broker connections are down") is not an
//! authentication failure: ackd keeps retrying.

use std::sync::atomic::{AtomicBool, Ordering};

use rdkafka::consumer::{ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// Whether an error from librdkafka's error callback is an authentication failure.
pub fn is_auth_failure(error: &KafkaError, reason: &str) -> bool {
    let Some(code) = error.rdkafka_error_code() else {
        return false;
    };
    match code {
        RDKafkaErrorCode::SSL | RDKafkaErrorCode::Authentication => true,
        RDKafkaErrorCode::BrokerTransportFailure => {
            reason.contains("SSL routines")
                && (reason.contains("alert") || reason.contains("certificate"))
        }
        _ => false,
    }
}

/// The broker an error is about. librdkafka starts the reason with the broker's name,
/// `proto://host:port/id: ...`, or for a logical broker with its role and address,
/// `GroupCoordinator: host:port: ...`.
pub fn broker_of(reason: &str) -> &str {
    for part in reason.split(": ") {
        if let Some((_, rest)) = part.split_once("://") {
            return rest.rsplit_once('/').map_or(rest, |(addr, _)| addr);
        }
        let is_address = part.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && !host.contains(' ') && port.parse::<u16>().is_ok()
        });
        if is_address {
            return part;
        }
    }
    "unknown"
}

/// What to check, for the log line. `client_cert`: whether ackd presents a client
/// certificate (`KAFKA_CLIENT_CERT`).
pub fn hint(error: &KafkaError, reason: &str, client_cert: bool) -> &'static str {
    let r = reason.to_ascii_lowercase();
    let broker_alert = r.contains("unknown ca")
        || r.contains("bad certificate")
        || r.contains("certificate unknown")
        || r.contains("certificate expired")
        || r.contains("certificate revoked")
        || r.contains("handshake failure");
    if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Authentication) {
        "the broker refused the SASL login: check ACKD_SASL_MECHANISM and the user name and password"
    } else if r.contains("certificate required") || (broker_alert && !client_cert) {
        // Kafka's (Java's) TLS answers a missing client certificate with bad_certificate
        // or handshake_failure, not TLS 1.3's certificate_required: without a client
        // certificate, any refusal by the broker means it wants one.
        "the broker requires a client certificate: set KAFKA_CLIENT_CERT and KAFKA_CLIENT_CERT_KEY"
    } else if r.contains("certificate verify failed") {
        "the broker's certificate was not signed by KAFKA_TRUSTED_CERT (or, without it, by a system root with a matching host name)"
    } else if broker_alert {
        "the broker refused the client certificate (KAFKA_CLIENT_CERT)"
    } else if r.contains("wrong version number") {
        "the broker does not speak TLS on this port: check the KAFKA_URL scheme"
    } else {
        "the TLS connection to the broker failed"
    }
}

/// Remembers whether an authentication failure happened; logs the first one.
#[derive(Debug, Default)]
pub struct AuthFailures {
    failed: AtomicBool,
    /// Whether ackd presents a client certificate: it decides the hint for a TLS alert.
    client_cert: bool,
}

impl AuthFailures {
    /// `client_cert`: whether ackd presents a client certificate (`KAFKA_CLIENT_CERT`).
    pub fn new(client_cert: bool) -> Self {
        AuthFailures {
            failed: AtomicBool::new(false),
            client_cert,
        }
    }

    /// Looks at an error from librdkafka's error callback. Returns true if it is an
    /// authentication failure (the first is logged here; later ones are not logged
    /// again), false for any other error, which the caller logs as usual.
    pub fn observe(&self, error: &KafkaError, reason: &str) -> bool {
        if !is_auth_failure(error, reason) {
            return false;
        }
        if !self.failed.swap(true, Ordering::AcqRel) {
            tracing::error!(
                at = "auth_failed",
                broker = broker_of(reason),
                error = %error,
                reason,
                hint = hint(error, reason, self.client_cert),
                "authentication with the broker failed; librdkafka would retry forever: stopping (exit 77)"
            );
        }
        true
    }

    /// Whether an authentication failure happened: the supervisor then stops.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
}

/// Serves the consumer's queue until `failures` saw an authentication failure. Before ackd
/// subscribes nothing else polls that queue, and librdkafka's error callback runs only
/// from a poll: without this the topic check (a metadata request of up to 10 s) is waited
/// out before the failure is even seen. Nothing is assigned yet: no message comes.
pub async fn failed_before_subscribing<C: ConsumerContext + 'static>(
    consumer: &StreamConsumer<C>,
    failures: &AuthFailures,
) {
    while !failures.failed() {
        // Errors reach the context's error callback, which calls `observe`.
        let _ = consumer.recv().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn global(code: RDKafkaErrorCode) -> KafkaError {
        KafkaError::Global(code)
    }

    // Reasons as librdkafka 2.12 wrote them against a TLS proxy (OpenSSL's server) and as
    // its sources word SASL failures; Kafka's own are in the tests below.
    const NO_CLIENT_CERT: &str = "ssl://127.0.0.1:39202/bootstrap: Receive failed: error:0A00045C:SSL routines::tlsv13 alert certificate required: SSL alert number 116 (after 0ms in state APIVERSION_QUERY)";
    const WRONG_CA: &str = "ssl://127.0.0.1:39202/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly configured or root CA certificates are installed (install ca-certificates package) (after 6ms in state SSL_HANDSHAKE)";
    const WRONG_CA_TRANSPORT: &str = "ssl://127.0.0.1:39202/bootstrap: error:0A000086:SSL routines::certificate verify failed (after 5ms in state SSL_HANDSHAKE)";
    const SASL: &str = "sasl_ssl://b-1.example.com:9096/1: SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 312ms in state AUTH_REQ)";

    #[test]
    fn tls_and_sasl_failures_are_authentication_failures() {
        use RDKafkaErrorCode::*;
        for (code, reason) in [
            (BrokerTransportFailure, NO_CLIENT_CERT),
            (SSL, WRONG_CA),
            (BrokerTransportFailure, WRONG_CA_TRANSPORT),
            (Authentication, SASL),
        ] {
            assert!(is_auth_failure(&global(code), reason), "{reason}");
        }
        assert_eq!(broker_of(NO_CLIENT_CERT), "127.0.0.1:39202");
        assert_eq!(broker_of(SASL), "b-1.example.com:9096");
        assert_eq!(
            broker_of("GroupCoordinator: 127.0.0.1:33331: Receive failed: error:0A00045C:SSL routines::tlsv13 alert certificate required: SSL alert number 116 (after 1ms in state APIVERSION_QUERY)"),
            "127.0.0.1:33331"
        );
        assert_eq!(broker_of("1/1 brokers are down"), "unknown");
        assert!(hint(&global(BrokerTransportFailure), NO_CLIENT_CERT, false)
            .contains("requires a client certificate"));
        assert!(hint(&global(SSL), WRONG_CA, true).contains("KAFKA_TRUSTED_CERT"));
        assert!(hint(&global(Authentication), SASL, false).contains("password"));
    }

    #[test]
    fn a_bad_certificate_alert_means_a_missing_or_a_refused_client_certificate() {
        // Apache Kafka 4.4 (Java 17) answers both a missing and an untrusted client
        // certificate with this alert (tests/tls.rs).
        let bad = "ssl://127.0.0.1:42915/bootstrap: Receive failed: error:0A000412:SSL routines::sslv3 alert bad certificate: SSL alert number 42 (after 16ms in state APIVERSION_QUERY)";
        let e = global(RDKafkaErrorCode::BrokerTransportFailure);
        assert!(is_auth_failure(&e, bad));
        assert_eq!(
            hint(&e, bad, false),
            "the broker requires a client certificate: set KAFKA_CLIENT_CERT and KAFKA_CLIENT_CERT_KEY"
        );
        assert_eq!(
            hint(&e, bad, true),
            "the broker refused the client certificate (KAFKA_CLIENT_CERT)"
        );
    }

    #[test]
    fn a_broker_that_is_down_or_drops_connections_is_not() {
        use RDKafkaErrorCode::*;
        for (code, reason) in [
            (BrokerTransportFailure, "ssl://127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: Connection refused (after 0ms in state CONNECT)"),
            (BrokerTransportFailure, "ssl://b:9093/bootstrap: SSL handshake failed: Disconnected: connecting to a PLAINTEXT broker listener? (after 2ms in state SSL_HANDSHAKE)"),
            (BrokerTransportFailure, "ssl://b:9093/1: Receive failed: error:0A000126:SSL routines::unexpected eof while reading (after 20000ms in state UP)"),
            (AllBrokersDown, "1/1 brokers are down"),
            (BrokerTransportFailure, "kafka://b:9092/1: Disconnected (after 5000ms in state UP)"),
        ] {
            assert!(!is_auth_failure(&global(code), reason), "{reason}");
        }
        assert!(!is_auth_failure(
            &KafkaError::ConsumerCommit(RDKafkaErrorCode::IllegalGeneration),
            "x"
        ));
    }

    #[test]
    fn only_the_first_failure_is_reported_and_it_sticks() {
        let f = AuthFailures::default();
        assert!(!f.observe(
            &global(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down"
        ));
        assert!(!f.failed());
        assert!(f.observe(&global(RDKafkaErrorCode::SSL), WRONG_CA));
        assert!(f.observe(&global(RDKafkaErrorCode::SSL), WRONG_CA));
        assert!(f.failed());
    }
}

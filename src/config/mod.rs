//! Configuration: every setting, typed and validated ([`settings`]), the error a setting
//! gets ([`error`]), the broker address ([`kafka_url`]), librdkafka pass-through
//! properties ([`rdkafka_env`]), TLS and SASL ([`security`]), the secrets no line may show
//! ([`secret`]), the failure policy ([`failure`]), and the translation of all of it into
//! librdkafka properties (`client_config`). Knows nothing of tasks or processing.

pub(crate) mod client_config;
pub mod delay;
pub mod error;
pub mod failure;
pub mod kafka_url;
pub mod rdkafka_env;
pub mod secret;
pub mod security;
pub mod settings;

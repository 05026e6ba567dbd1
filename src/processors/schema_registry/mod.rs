//! Schema Registry decoding (docs/schemas.md): keys and values in the Confluent wire
//! format (a 0 byte, the schema id as 4 bytes big-endian, the payload) handed to the
//! processor as JSON. [`Decoding`] wraps any processor: it decodes a message, puts the
//! result on it ([`Message::decoded_value`]) and calls the processor; with both formats
//! raw (the default) it calls the processor and does nothing else.

mod avro;
mod protobuf;
mod registry;

use std::sync::Arc;
use std::time::Instant;

use crate::processors::processor::{BatchError, Message, ProcessError, Processor};
pub use crate::processors::processor::{Decoded, DecodedPart};
use crate::settings::{Format, SchemaSettings, SettingError};

use registry::{Parsed, Registry};

/// Decodes keys and values as the settings say.
pub struct Decoder {
    key: Format,
    value: Format,
    raw_bytes: bool,
    registry: Registry,
}

impl Decoder {
    /// `None` when keys and values are raw.
    pub fn from_settings(settings: &crate::Settings) -> Result<Option<Decoder>, SettingError> {
        settings.schemas.as_ref().map(Decoder::new).transpose()
    }

    pub fn new(settings: &SchemaSettings) -> Result<Decoder, SettingError> {
        Ok(Decoder {
            key: settings.key,
            value: settings.value,
            raw_bytes: settings.raw_bytes,
            registry: Registry::new(settings)?,
        })
    }

    /// The message's key and value as the formats say. A message that cannot be decoded
    /// fails permanently; a registry that cannot answer, retryably.
    pub async fn decode(&self, m: &Message<'_>) -> Result<Decoded, ProcessError> {
        Ok(Decoded {
            key: self.part(m.topic(), m.key(), self.key, "key").await?,
            value: self
                .part(m.topic(), m.payload(), self.value, "value")
                .await?,
            raw_bytes: self.raw_bytes,
        })
    }

    async fn part(
        &self,
        topic: &str,
        bytes: Option<&[u8]>,
        format: Format,
        which: &str,
    ) -> Result<Option<DecodedPart>, ProcessError> {
        let (Format::Registry(expected), Some(bytes)) = (format, bytes) else {
            return Ok(None);
        };
        let (id, payload) = header(bytes).map_err(|why| {
            ProcessError::permanent(format!(
                "the {which} is not in the Schema Registry wire format: {why}"
            ))
        })?;
        let schema = self.registry.schema(id).await?;
        let bad =
            |why: String| ProcessError::permanent(format!("the {which} (schema id {id}): {why}"));
        if let Some(expected) = expected.filter(|e| *e != schema.kind) {
            return Err(bad(format!(
                "the registry states a {} schema, the format expects {}",
                schema.kind.registry_name(),
                expected.registry_name()
            )));
        }
        let json = match &schema.parsed {
            Parsed::Avro(avro) => avro.decode(payload).map_err(bad)?,
            Parsed::Json => serde_json::from_slice(payload)
                .map_err(|e| bad(format!("the payload is not JSON: {e}")))?,
            Parsed::Protobuf(proto) => proto.decode(payload).map_err(bad)?,
        };
        Ok(Some(DecodedPart {
            schema_id: id,
            subject: schema.subject(topic, which).cloned(),
            json,
        }))
    }
}

/// The wire format's schema id and payload.
fn header(bytes: &[u8]) -> Result<(u32, &[u8]), String> {
    match bytes {
        [0, a, b, c, d, payload @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), payload)),
        [0, ..] => Err(format!(
            "{} bytes, shorter than its 5-byte header",
            bytes.len()
        )),
        [] => Err("it is empty".into()),
        [first, ..] => Err(format!("its first byte is {first}, not the magic byte 0")),
    }
}

/// A processor whose messages are decoded before it sees them (see the module).
pub struct Decoding<P> {
    inner: P,
    decoder: Option<Arc<Decoder>>,
}

impl<P: Processor> Decoding<P> {
    pub fn new(inner: P, decoder: Option<Decoder>) -> Self {
        Decoding {
            inner,
            decoder: decoder.map(Arc::new),
        }
    }

    async fn decode_then_process(
        &self,
        decoder: &Decoder,
        m: &Message<'_>,
    ) -> Result<(), ProcessError> {
        // A retry of the same fetched message keeps what it decoded.
        if m.decoded().is_some() {
            return self.inner.process(m).await;
        }
        let decoded = decoder.decode(m).await?;
        match m.attach_decoded(decoded) {
            Ok(()) => self.inner.process(m).await,
            // A message built by hand (tests, embedding) has no headers: copied whole.
            Err(decoded) => {
                self.inner
                    .process(&m.rebuilt().with_decoded(&decoded))
                    .await
            }
        }
    }

    async fn decode_batch(
        &self,
        decoder: &Decoder,
        messages: &[Message<'_>],
    ) -> Result<(), BatchError> {
        // Per message: what could not be put on the message itself (built by hand).
        let mut kept: Vec<Option<Decoded>> = Vec::with_capacity(messages.len());
        let mut failed = None;
        for m in messages {
            if m.decoded().is_some() {
                kept.push(None);
                continue;
            }
            match decoder.decode(m).await {
                Ok(d) => kept.push(m.attach_decoded(d).err()),
                Err(e) => {
                    failed = Some(BatchError::new(m.offset(), e));
                    break;
                }
            }
        }
        let decoded = &messages[..kept.len()];
        if !decoded.is_empty() {
            if kept.iter().all(Option::is_none) {
                self.inner.process_batch(decoded).await?;
            } else {
                // Built by hand (no headers), so copied whole.
                let views: Vec<Message<'_>> = decoded
                    .iter()
                    .zip(&kept)
                    .map(|(m, d)| match d {
                        Some(d) => m.rebuilt().with_decoded(d),
                        None => m.rebuilt(),
                    })
                    .collect();
                self.inner.process_batch(&views).await?;
            }
        }
        failed.map_or(Ok(()), Err)
    }
}

impl<P: Processor> Processor for Decoding<P> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn calls_may_wait(&self) -> bool {
        self.inner.calls_may_wait()
    }

    async fn process(&self, message: &Message<'_>) -> Result<(), ProcessError> {
        match &self.decoder {
            None => self.inner.process(message).await,
            // Boxed: the raw path's future stays the processor's own size.
            Some(d) => Box::pin(self.decode_then_process(d, message)).await,
        }
    }

    async fn process_batch(&self, messages: &[Message<'_>]) -> Result<(), BatchError> {
        match &self.decoder {
            None => self.inner.process_batch(messages).await,
            Some(d) => Box::pin(self.decode_batch(d, messages)).await,
        }
    }

    async fn shutdown(&self, deadline: Instant) {
        self.inner.shutdown(deadline).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_or_why_not() {
        assert_eq!(header(&[0, 0, 0, 1, 2, 9]).unwrap(), (258, &[9][..]));
        assert_eq!(header(&[0, 0, 0, 0, 7]).unwrap(), (7, &[][..]));
        assert!(header(&[0, 0, 1]).unwrap_err().contains("shorter"));
        assert!(header(&[1, 0, 0, 0, 1]).unwrap_err().contains("magic byte"));
        assert!(header(&[]).unwrap_err().contains("empty"));
    }
}

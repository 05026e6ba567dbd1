//! Protobuf to JSON: the schema text (and its imports, from the registry) compiled in
//! process, the message type picked by the wire format's message-index list, the payload
//! as protobuf's canonical JSON mapping (proto3 JSON: lowerCamelCase names, 64-bit
//! integers and bytes as strings, enums by name, default values left out).

use std::collections::HashMap;

use prost_reflect::prost::Message as _;
use prost_reflect::prost_types::FileDescriptorProto;
use prost_reflect::{DescriptorPool, DynamicMessage, FileDescriptor, MessageDescriptor};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};
use serde_json::Value;

/// The name the schema's own text is compiled under.
const MAIN: &str = "ackd_registry_schema.proto";

pub(crate) struct ProtoSchema {
    file: FileDescriptor,
    _pool: DescriptorPool,
}

/// Schema texts by import name, then the well-known types.
struct Sources(HashMap<String, String>);

impl FileResolver for Sources {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        match self.0.get(name) {
            Some(source) => File::from_source(name, source),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}

impl ProtoSchema {
    /// `text` with the files it imports (`(import name, text)`). Each is `.proto` source,
    /// or a base64 `FileDescriptorProto`, the form some serializers (confluent-kafka's
    /// Python one) register.
    pub(crate) fn parse(text: &str, imports: &[(String, String)]) -> Result<ProtoSchema, String> {
        match descriptor(text) {
            Some(main) => from_descriptors(main, imports),
            None => from_source(text, imports),
        }
    }
    /// The payload (after the schema id) as JSON: its message-index list, then the
    /// message.
    pub(crate) fn decode(&self, payload: &[u8]) -> Result<Value, String> {
        let (indexes, message) = message_indexes(payload)?;
        let descriptor = self.message_type(&indexes)?;
        let decoded = DynamicMessage::decode(descriptor.clone(), message).map_err(|e| {
            format!(
                "the payload does not match its Protobuf message {}: {e}",
                descriptor.full_name()
            )
        })?;
        serde_json::to_value(&decoded).map_err(|e| format!("the message has no JSON form: {e}"))
    }

    /// The message type at `indexes`: the file's top-level message, then nested ones.
    fn message_type(&self, indexes: &[usize]) -> Result<MessageDescriptor, String> {
        let missing = || format!("the schema has no message at index path {indexes:?}");
        let mut current = self.file.messages().nth(indexes[0]).ok_or_else(missing)?;
        for &i in &indexes[1..] {
            let child = current.child_messages().nth(i);
            current = child.ok_or_else(missing)?;
        }
        Ok(current)
    }
}

/// `text` and its imports compiled from source.
fn from_source(text: &str, imports: &[(String, String)]) -> Result<ProtoSchema, String> {
    let mut sources: HashMap<String, String> = imports.iter().cloned().collect();
    sources.insert(MAIN.to_string(), text.to_string());
    let mut resolver = ChainFileResolver::new();
    resolver.add(Sources(sources));
    resolver.add(GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.include_imports(true);
    compiler.open_file(MAIN).map_err(|e| e.to_string())?;
    let pool = compiler.descriptor_pool();
    let file = pool
        .get_file_by_name(MAIN)
        .ok_or_else(|| "the compiled schema has no file".to_string())?;
    Ok(ProtoSchema { file, _pool: pool })
}

/// A base64 `FileDescriptorProto`, if `text` is one.
fn descriptor(text: &str) -> Option<FileDescriptorProto> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()?;
    FileDescriptorProto::decode(bytes.as_slice()).ok()
}

/// A pool of the well-known types, the imports (source or descriptors) and `main`.
fn from_descriptors(
    main: FileDescriptorProto,
    imports: &[(String, String)],
) -> Result<ProtoSchema, String> {
    let mut resolver = ChainFileResolver::new();
    let wkt = "google/protobuf/";
    let all: String = [
        "any",
        "duration",
        "empty",
        "field_mask",
        "struct",
        "timestamp",
        "wrappers",
    ]
    .iter()
    .map(|n| format!("import \"{wkt}{n}.proto\";\n"))
    .collect();
    resolver.add(Sources(HashMap::from([(
        MAIN.to_string(),
        format!("syntax = \"proto3\";\n{all}"),
    )])));
    resolver.add(GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.include_imports(true);
    compiler.open_file(MAIN).map_err(|e| e.to_string())?;
    let mut pool = compiler.descriptor_pool();
    for (name, text) in imports {
        let import = match descriptor(text) {
            Some(d) => d,
            None => from_source(text, &[])?.file.file_descriptor_proto().clone(),
        };
        if pool.get_file_by_name(name).is_none() {
            pool.add_file_descriptor_proto(import)
                .map_err(|e| e.to_string())?;
        }
    }
    let name = main.name().to_string();
    pool.add_file_descriptor_proto(main)
        .map_err(|e| e.to_string())?;
    let file = pool
        .get_file_by_name(&name)
        .ok_or_else(|| "the schema's descriptor has no file".to_string())?;
    Ok(ProtoSchema { file, _pool: pool })
}

/// The wire format's message-index list (zigzag varints: a count, then the indexes; a
/// count of 0 means `[0]`, the first message) and the bytes after it.
fn message_indexes(mut bytes: &[u8]) -> Result<(Vec<usize>, &[u8]), String> {
    let bad = || "the payload's message-index list is cut short or invalid".to_string();
    let count = zigzag(&mut bytes).ok_or_else(bad)?;
    if count == 0 {
        return Ok((vec![0], bytes));
    }
    if !(1..=100).contains(&count) {
        return Err(bad());
    }
    let mut indexes = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let i = zigzag(&mut bytes).ok_or_else(bad)?;
        indexes.push(usize::try_from(i).map_err(|_| bad())?);
    }
    Ok((indexes, bytes))
}

/// One zigzag-encoded varint off the front of `bytes`.
fn zigzag(bytes: &mut &[u8]) -> Option<i64> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str = r#"syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Order {
  int64 id = 1;
  string note = 2;
  google.protobuf.Timestamp placed_at = 3;
  message Line { string sku = 1; int32 qty = 2; }
  repeated Line lines = 4;
}
message Other { bool flag = 1; }
"#;

    #[test]
    fn the_message_by_its_index_as_canonical_json() {
        let s = ProtoSchema::parse(SCHEMA, &[]).unwrap();
        let order = s.message_type(&[0]).unwrap();
        let json = serde_json::json!({"id": "42", "note": "gift",
            "placedAt": "2023-11-14T22:13:20.123Z", "lines": [{"sku": "a", "qty": 2}]});
        let msg = DynamicMessage::deserialize(order, json.clone()).unwrap();
        // The first message: a count of 0.
        let payload = [&[0u8][..], &msg.encode_to_vec()].concat();
        assert_eq!(s.decode(&payload).unwrap(), json);
        // [1]: count 1 (zigzag 2), index 1 (zigzag 2).
        let other = s.message_type(&[1]).unwrap();
        let flag = DynamicMessage::deserialize(other, serde_json::json!({"flag": true})).unwrap();
        let payload = [&[2u8, 2][..], &flag.encode_to_vec()].concat();
        assert_eq!(
            s.decode(&payload).unwrap(),
            serde_json::json!({"flag": true})
        );
        // [0, 0]: Order.Line.
        let line = s.message_type(&[0, 0]).unwrap();
        assert_eq!(line.full_name(), "shop.Order.Line");
        assert!(s.decode(&[2, 8]).unwrap_err().contains("no message"));
        assert!(s
            .decode(&[0, 0x0a, 5, b'a'])
            .unwrap_err()
            .contains("does not match"));
        assert!(s.decode(&[]).is_err());
    }

    #[test]
    fn a_base64_descriptor_as_confluent_kafkas_python_serializer_registers_it() {
        // Its registration of shop/order.proto (Order: int64 id = 1, string note = 2).
        let b64 = "ChBzaG9wL29yZGVyLnByb3RvEgRzaG9wIiEKBU9yZGVyEgoKAmlkGAEgASgDEgwKBG5vdGUYAiABKAliBnByb3RvMw==";
        let s = ProtoSchema::parse(b64, &[]).unwrap();
        // Its serializer's bytes after the schema id: [0], id 42, note "gift".
        let payload = [0x00, 0x08, 0x2a, 0x12, 0x04, b'g', b'i', b'f', b't'];
        assert_eq!(
            s.decode(&payload).unwrap(),
            serde_json::json!({"id": "42", "note": "gift"})
        );
    }
}

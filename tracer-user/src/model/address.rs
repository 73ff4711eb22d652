//! Addresses are `u64` in the code and `"0x…"` strings in the JSON (the
//! schema's form since version 1): a serde adapter for both directions.
use std::{borrow::Cow, collections::BTreeMap};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serializer};

/// The JSON Schema of an address as this module writes it (`0x` and
/// lowercase hex digits, no padding): `#[schemars(with = "address::Hex")]`
/// on a field serialized here.
pub(crate) struct Hex;

impl JsonSchema for Hex {
    fn schema_name() -> Cow<'static, str> {
        "Address".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "An address in the target: `0x` and lowercase hex digits, no padding (`0x55c1a55154b0`).",
            "type": "string",
            "pattern": "^0x[0-9a-f]+$"
        })
    }
}

pub(crate) fn serialize<S: Serializer>(address: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format!("{address:#x}"))
}

/// A lock's address without the lifetime bits of its key (see `Lock::address`).
pub(crate) fn serialize_without_lifetime<S: Serializer>(
    address: &u64,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serialize(&tracer_common::lifetime::split(*address).0, serializer)
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse(&text).ok_or_else(|| serde::de::Error::custom(format!("{text:?} is not a 0x… address")))
}

/// `0x1f` → 31; None for anything else.
pub(crate) fn parse(text: &str) -> Option<u64> {
    u64::from_str_radix(text.strip_prefix("0x")?, 16).ok()
}

/// Below this an attributed address is no lock (a null or small argument).
pub(crate) const LOWEST_LOCK_ADDRESS: u64 = 4096;

/// The row whose lock bytes contain `address`, if any (`rows` by address,
/// `span` their bytes). Addresses below the lowest a lock can have are in
/// none.
pub(crate) fn row_holding<V>(
    rows: &BTreeMap<u64, V>,
    address: u64,
    span: impl Fn(&V) -> u64,
) -> Option<u64> {
    if address < LOWEST_LOCK_ADDRESS {
        return None;
    }
    rows.range(..=address)
        .next_back()
        .filter(|(start, row)| address - **start < span(row))
        .map(|(start, _)| *start)
}

#[cfg(test)]
mod tests {
    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Holder {
        #[serde(with = "super")]
        address: u64,
    }

    #[test]
    fn round_trips_as_hex_text() {
        let text = serde_json::to_string(&Holder {
            address: 0x55c1a55154b0,
        })
        .unwrap();
        assert_eq!(text, r#"{"address":"0x55c1a55154b0"}"#);
        assert_eq!(
            serde_json::from_str::<Holder>(&text).unwrap(),
            Holder {
                address: 0x55c1a55154b0
            }
        );
        assert!(serde_json::from_str::<Holder>(r#"{"address":"12"}"#).is_err());
    }
}

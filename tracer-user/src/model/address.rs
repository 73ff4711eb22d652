//! Addresses are `u64` in the code and `"0x…"` strings in the JSON (the
//! schema's form since version 1): a serde adapter for both directions.
use serde::{Deserialize, Deserializer, Serializer};

pub fn serialize<S: Serializer>(address: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format!("{address:#x}"))
}

/// A lock's address without the lifetime bits of its key (see `Lock::address`).
pub fn serialize_without_lifetime<S: Serializer>(
    address: &u64,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serialize(&tracer_common::lifetime::split(*address).0, serializer)
}

pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse(&text).ok_or_else(|| serde::de::Error::custom(format!("{text:?} is not a 0x… address")))
}

/// `0x1f` → 31; None for anything else.
pub fn parse(text: &str) -> Option<u64> {
    u64::from_str_radix(text.strip_prefix("0x")?, 16).ok()
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

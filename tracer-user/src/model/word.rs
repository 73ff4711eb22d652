//! Kinds that a report writes as one open-ended word: the known words are
//! variants, any other word (a module's section name, a reason from a newer
//! version) is kept as it was read. `worded!` gives such a type its
//! `Display`, serde (the word itself), equality and order (by word, as the
//! JSON object's keys were sorted when they were strings).

/// A kind written as one word.
pub(crate) trait Worded: Sized {
    /// The word in the report.
    fn word(&self) -> std::borrow::Cow<'_, str>;
    /// The kind a report's word names; never fails (unknown words are kept).
    fn from_word(word: &str) -> Self;
}

/// `Display`, `Serialize`, `Deserialize`, `Eq`, `Hash` and `Ord` by the
/// word of a [`Worded`] type: two values that write the same word are the
/// same (a section name read back from a report is the one named). With
/// `sentence NAME, DESCRIPTION`: its JSON Schema too, a string.
macro_rules! worded {
    ($kind:ty, sentence $name:literal, $description:literal) => {
        $crate::model::word::worded!($kind);

        impl schemars::JsonSchema for $kind {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                $name.into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({"description": $description, "type": "string"})
            }
        }
    };
    ($kind:ty) => {
        impl std::fmt::Display for $kind {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&$crate::model::word::Worded::word(self))
            }
        }

        impl serde::Serialize for $kind {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&$crate::model::word::Worded::word(self))
            }
        }

        impl<'de> serde::Deserialize<'de> for $kind {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let word = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                Ok(<$kind as $crate::model::word::Worded>::from_word(&word))
            }
        }

        impl PartialEq for $kind {
            fn eq(&self, other: &Self) -> bool {
                use $crate::model::word::Worded;
                self.word() == other.word()
            }
        }

        impl Eq for $kind {}

        impl std::hash::Hash for $kind {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                $crate::model::word::Worded::word(self).hash(state)
            }
        }

        impl PartialOrd for $kind {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl Ord for $kind {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                use $crate::model::word::Worded;
                self.word().cmp(&other.word())
            }
        }
    };
}
pub(crate) use worded;

/// The JSON Schema of a worded kind: a string, one of `known` or any other.
pub(crate) fn schema(description: &str, known: &[&str]) -> schemars::Schema {
    schemars::json_schema!({
        "description": description,
        "anyOf": [
            {"enum": known},
            {"type": "string"}
        ]
    })
}

/// Test helper: each word reads as a kind that writes it back unchanged,
/// in the JSON and by `Display`.
#[cfg(test)]
pub(crate) fn assert_round_trips<T>(word: &str)
where
    T: Worded + std::fmt::Display + serde::Serialize + serde::de::DeserializeOwned,
{
    let json = serde_json::to_string(word).unwrap();
    let kind: T = serde_json::from_str(&json).unwrap();
    assert_eq!(serde_json::to_string(&kind).unwrap(), json);
    assert_eq!(kind.to_string(), word);
    assert_eq!(T::from_word(word).word(), word);
}

/// The fields of `word` between `literals` (`literals[0]` starts it, the
/// last ends it, each field runs to the next literal's first occurrence),
/// or None if `word` is not of that form.
pub(crate) fn fields<'a>(word: &'a str, literals: &[&str]) -> Option<Vec<&'a str>> {
    let (first, rest) = literals.split_first()?;
    let mut word = word.strip_prefix(first)?;
    let mut out = Vec::new();
    for (i, literal) in rest.iter().enumerate() {
        let field = if i + 1 == rest.len() {
            let field = word.strip_suffix(literal)?;
            word = "";
            field
        } else {
            let (field, after) = word.split_once(literal).filter(|_| !literal.is_empty())?;
            word = after;
            field
        };
        out.push(field);
    }
    word.is_empty().then_some(out)
}

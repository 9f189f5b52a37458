//! Bounds on what a request may ask for, and deserializers that hold them while parsing.
//!
//! Design: no number or list from a request sizes an allocation or a loop without a bound
//! stated here (or, for what depends on the model, checked against the context in
//! [`super::Settings::fit`]). Lists are read element by element and refused as soon as they
//! pass their cap, so a 4 MiB body of `[0,0,…]` or `[{},{},…]` costs the cap, not a
//! `serde_json::Value` per element (32+ bytes each). A value past its bound is a 400 that names
//! the field and the bound. Cost: a counter per element while parsing.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// Chat messages per request.
pub const MAX_MESSAGES: usize = 4096;
/// Stop strings per request, and bytes per stop string: the engine's stop matcher owns these
/// (it holds back at most the longest one).
pub use engine::{MAX_STOPS, MAX_STOP_BYTES};
/// Entries of a request's `lora` list; the largest scale magnitude is the adapters' own.
pub const MAX_LORA: usize = 64;
pub const MAX_LORA_SCALE: f32 = crate::adapters::MAX_SCALE;
/// Entries of `tools` read before the list is refused (a non-empty list is refused anyway).
pub const MAX_TOOLS: usize = 64;
/// Token ids of a completion prompt read while parsing (the context refuses most of these
/// later; this bounds the parse itself).
pub const MAX_PROMPT_IDS: usize = 1 << 18;
/// Entries of `logit_bias`, and the bias range (OpenAI's).
pub const MAX_LOGIT_BIAS: usize = 1024;
pub const MAX_BIAS: f32 = 100.0;
/// `repeat_last_n` before the context is known (the sampler's own bound); the context bounds it
/// further.
pub const MAX_REPEAT_LAST_N: i64 = engine::MAX_REPEAT_LAST_N as i64;
/// JSON values (each number, string, list, object and its entries) a chat request may send
/// outside what the server reads itself: unknown message fields and tool definitions, which
/// are kept as `serde_json::Value` (32 B a value) and rendered by the template.
pub const MAX_EXTRA_VALUES: usize = 1 << 16;

/// `Ok` if `values` hold at most [`MAX_EXTRA_VALUES`] JSON values in all (counted without
/// recursion, stopping at the bound), else the 400's message.
pub fn check_json_values<'a>(
    values: impl IntoIterator<Item = &'a serde_json::Value>,
) -> Result<(), String> {
    let mut stack: Vec<&serde_json::Value> = values.into_iter().collect();
    let mut n = 0usize;
    while let Some(v) = stack.pop() {
        n += 1;
        if n > MAX_EXTRA_VALUES {
            return Err(format!("the messages' other fields and the tools hold more than {MAX_EXTRA_VALUES} JSON values: send less"));
        }
        match v {
            serde_json::Value::Array(a) => stack.extend(a),
            serde_json::Value::Object(o) => stack.extend(o.values()),
            _ => {}
        }
    }
    Ok(())
}

/// OpenAI's temperature range.
pub const MAX_TEMPERATURE: f32 = 2.0;

/// A sequence read into a `Vec` of at most `max` elements, else an error naming `field`.
struct Capped<T> {
    max: usize,
    field: &'static str,
    _t: PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Capped<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a list of at most {} entries", self.max)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.max).min(64));
        while let Some(x) = seq.next_element()? {
            if out.len() == self.max {
                return Err(de::Error::custom(too_many(self.field, self.max)));
            }
            out.push(x);
        }
        Ok(out)
    }
}

/// The message for a list past its cap.
pub fn too_many(field: &str, max: usize) -> String {
    format!("{field} has more than {max} entries; send at most {max}")
}

/// `d` as a list of at most `max` elements.
pub fn capped<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
    max: usize,
    field: &'static str,
) -> Result<Vec<T>, D::Error> {
    d.deserialize_seq(Capped { max, field, _t: PhantomData })
}

/// `serde(deserialize_with)` helpers: each field's list with its cap.
pub fn messages<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    capped(d, MAX_MESSAGES, "messages")
}

pub fn opt_stops<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    opt_capped(d, MAX_STOPS, "stop")
}

pub fn opt_lora<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Vec<T>>, D::Error> {
    opt_capped(d, MAX_LORA, "lora")
}

pub fn opt_tools<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Vec<T>>, D::Error> {
    opt_capped(d, MAX_TOOLS, "tools")
}

/// `d` as null or a list of at most `max` elements.
pub fn opt_capped<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
    max: usize,
    field: &'static str,
) -> Result<Option<Vec<T>>, D::Error> {
    struct Opt<T>(Capped<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Opt<T> {
        type Value = Option<Vec<T>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            self.0.expecting(f)?;
            f.write_str(" or null")
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_seq(self.0).map(Some)
        }
    }
    d.deserialize_option(Opt(Capped { max, field, _t: PhantomData }))
}

/// OpenAI's `logit_bias`: a map from token ids (as strings) to a bias in
/// [-[`MAX_BIAS`], [`MAX_BIAS`]], at most [`MAX_LOGIT_BIAS`] entries, read without buffering.
pub fn opt_logit_bias<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<(u32, f32)>>, D::Error> {
    struct Map;
    impl<'de> Visitor<'de> for Map {
        type Value = Option<Vec<(u32, f32)>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "an object of at most {MAX_LOGIT_BIAS} token ids and biases, or null")
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_map(self)
        }
        fn visit_map<A: de::MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut out: Vec<(u32, f32)> = Vec::new();
            while let Some(k) = m.next_key::<std::borrow::Cow<'de, str>>()? {
                let b: f32 = m.next_value()?;
                if out.len() == MAX_LOGIT_BIAS {
                    return Err(de::Error::custom(too_many("logit_bias", MAX_LOGIT_BIAS)));
                }
                let t: u32 = k.parse().map_err(|_| {
                    de::Error::custom(format!("logit_bias key {k:?} is not a token id"))
                })?;
                if !(-MAX_BIAS..=MAX_BIAS).contains(&b) {
                    return Err(de::Error::custom(format!(
                        "logit_bias of token {t} is {b}; a bias must be in [-{MAX_BIAS}, {MAX_BIAS}]"
                    )));
                }
                out.push((t, b));
            }
            out.sort_unstable_by_key(|&(t, _)| t);
            if out.windows(2).any(|w| w[0].0 == w[1].0) {
                return Err(de::Error::custom("logit_bias names a token twice"));
            }
            Ok(Some(out))
        }
    }
    d.deserialize_option(Map)
}

/// Stop strings checked: at most [`MAX_STOPS`] of at most [`MAX_STOP_BYTES`] bytes each.
pub fn check_stops(stops: &[String]) -> Result<(), String> {
    if stops.len() > MAX_STOPS {
        return Err(too_many("stop", MAX_STOPS));
    }
    match stops.iter().position(|s| s.len() > MAX_STOP_BYTES) {
        Some(i) => Err(format!(
            "stop[{i}] is {} bytes long; a stop string may have at most {MAX_STOP_BYTES}",
            stops[i].len()
        )),
        None => Ok(()),
    }
}

/// A seed as either API sends it: any integer from `i64::MIN` to `u64::MAX` (a negative one is
/// taken as its two's-complement bits).
pub fn opt_seed<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct Seed;
    impl Visitor<'_> for Seed {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an integer seed from -9223372036854775808 to 18446744073709551615")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<u64>, E> {
            Ok(Some(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Option<u64>, E> {
            Ok(Some(v as u64))
        }
    }
    struct OptSeed;
    impl<'de> Visitor<'de> for OptSeed {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            Seed.expecting(f)
        }
        fn visit_none<E: de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Option<u64>, D2::Error> {
            d.deserialize_any(Seed)
        }
    }
    d.deserialize_option(OptSeed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct M {
        #[serde(deserialize_with = "messages")]
        messages: Vec<serde_json::Value>,
        #[serde(default, deserialize_with = "opt_stops")]
        stop: Option<Vec<String>>,
        #[serde(default, deserialize_with = "opt_seed")]
        seed: Option<u64>,
    }

    #[test]
    fn json_values_are_counted_to_their_bound() {
        let ok = serde_json::json!({"x": vec![0; MAX_EXTRA_VALUES - 2]}); // object, list, zeros
        assert!(check_json_values([&ok]).is_ok());
        let over = serde_json::json!({"x": vec![0; MAX_EXTRA_VALUES - 1]});
        assert!(check_json_values([&over]).unwrap_err().contains("JSON values"));
        let nested = serde_json::json!([[{"a": [1, 2]}], "s"]); // 7 values
        let many: Vec<_> = std::iter::repeat_n(&nested, MAX_EXTRA_VALUES / 7 + 1).collect();
        assert!(check_json_values(many).is_err());
    }

    #[test]
    fn lists_past_their_cap_are_refused_while_parsing() {
        let n = MAX_MESSAGES + 1;
        let body = format!("{{\"messages\":[{}]}}", vec!["{}"; n].join(","));
        let e = serde_json::from_str::<M>(&body).err().expect("refused");
        assert!(e.to_string().contains("messages has more than 4096 entries"), "{e}");
        let ok = format!("{{\"messages\":[{}]}}", vec!["{}"; MAX_MESSAGES].join(","));
        assert_eq!(serde_json::from_str::<M>(&ok).unwrap().messages.len(), MAX_MESSAGES);
        let stops = format!("{{\"messages\":[],\"stop\":[{}]}}", vec!["\"a\""; 17].join(","));
        let e = serde_json::from_str::<M>(&stops).err().expect("refused");
        assert!(e.to_string().contains("stop has more than 16"), "{e}");
        let stops = format!("{{\"messages\":[],\"stop\":[{}]}}", vec!["\"a\""; 16].join(","));
        assert_eq!(serde_json::from_str::<M>(&stops).unwrap().stop.map(|s| s.len()), Some(16));
        assert_eq!(check_stops(&["x".repeat(257)]).unwrap_err().split(' ').next(), Some("stop[0]"));
        assert!(check_stops(&["x".repeat(256)]).is_ok());
    }

    #[test]
    fn seeds_take_the_whole_u64_and_i64_ranges() {
        let seed =
            |s: &str| serde_json::from_str::<M>(&format!("{{\"messages\":[],\"seed\":{s}}}"));
        assert_eq!(seed("18446744073709551615").unwrap().seed, Some(u64::MAX));
        assert_eq!(seed("-1").unwrap().seed, Some(u64::MAX));
        assert_eq!(seed("7").unwrap().seed, Some(7));
        assert_eq!(seed("null").unwrap().seed, None);
        assert!(seed("18446744073709551616").is_err());
        assert!(seed("1.5").is_err());
    }
}

//! The JSON-RPC peek: reads only the fields correlation needs from one message, borrowing from
//! the frame, and skips everything else with `IgnoredAny` (DESIGN §8).
//!
//! Goes in: the bytes of one JSON-RPC message (a batch is split first, see
//! [`super::frame::split_batch`]). Comes out: a [`Peek`] holding `id`, `method`, `params.name`,
//! top-level argument keys with their scalar values, the `_meta` entries we use, `requestId`,
//! `error.code`, `result.isError`, `result.resultType`, `serverInfo.name`, protocol version,
//! `clientInfo.name` and `requestState`. It never builds a `serde_json::Value`, so a 50 MB result
//! costs one scan and no allocation for its content. Every field is lenient: a field of an
//! unexpected type is recorded as [`Lenient::Wrong`] instead of failing the whole message, so the
//! caller can count it as malformed.
//!
//! It reads JSON as servers do (DESIGN §2 invariant 10), so that no call a server executes
//! escapes: a key given twice keeps its last value, at every level ([`FromObject`]; serde's
//! derive would reject the message), `arguments` included; ids and argument numbers are read
//! from their text ([`number_id`]): equal numbers are one id however written (`1.0` = `1`), and a
//! number no float holds (`1e400`) does not fail the message.
//!
//! Two readings, one answer: a small message written plainly (no escapes, no number serde would
//! refuse, shallow) is read by [`plain`]'s single pass, anything else by serde. The plain path
//! gives up rather than decide anything serde would decide differently, and tests and a fuzz
//! target hold the two readings equal (bench/README.md, "The peek read in one pass").

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::event::privacy::Scalar;

mod plain;

/// A field that was absent, of the expected type, or of another type.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Lenient<T> {
    #[default]
    Absent,
    Ok(T),
    Wrong,
}

impl<T> Lenient<T> {
    pub fn ok(&self) -> Option<&T> {
        match self {
            Lenient::Ok(t) => Some(t),
            _ => None,
        }
    }
    /// Only tests ask: the observer tells a wrong field from an absent one by matching.
    #[cfg(test)]
    pub fn is_wrong(&self) -> bool {
        matches!(self, Lenient::Wrong)
    }
}

/// The string a lenient string field holds, if it holds one of the expected type.
pub(super) fn lenient_str<'a>(l: &'a Lenient<Cow<'_, str>>) -> Option<&'a str> {
    l.ok().map(|c| c.as_ref())
}

/// A JSON-RPC id, keyed as a server compares ids: equal numbers are one id however they are
/// written (`1`, `1.0`, `1e0`, `10E-1`), and a string is never a number (`"1"` ≠ `1`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RpcId {
    /// A number with an integral value that fits an `i128`.
    Num(i128),
    /// Any other number, in one canonical spelling: `[-]<digits>e<exponent>` with no leading or
    /// trailing zero digit (`1.5` and `15e-1` are both `15e-1`).
    Dec(String),
    Str(String),
}

/// Most decimal digits of an integral id kept as [`RpcId::Num`]: every 38-digit number fits an
/// `i128`.
const MAX_NUM_ID_DIGITS: usize = 38;

/// The id a JSON number's text names (see [`RpcId`]). Computed from the text, never through a
/// float, so equal values are equal ids exactly and `1e400` is an id like any other.
#[inline]
pub fn number_id(text: &str) -> RpcId {
    // The usual case, a short plain integer (every SDK counts its ids up from 0 or 1), summed
    // digit by digit where it is read: 18 digits cannot overflow a u64. The general reading,
    // out of line, took about 130 instructions for a four-digit id (bench/README.md).
    let (neg, unsigned) = match text.as_bytes() {
        [b'-', rest @ ..] => (true, rest),
        all => (false, all),
    };
    if (1..=18).contains(&unsigned.len()) && unsigned.iter().all(u8::is_ascii_digit) {
        let n = unsigned
            .iter()
            .fold(0u64, |n, b| n * 10 + u64::from(b - b'0'));
        let n = i128::from(n);
        return RpcId::Num(if neg { -n } else { n });
    }
    number_id_general(text)
}

#[inline(never)]
fn number_id_general(text: &str) -> RpcId {
    let (neg, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    // A longer integer.
    if !unsigned.is_empty()
        && unsigned.len() <= MAX_NUM_ID_DIGITS
        && unsigned.bytes().all(|b| b.is_ascii_digit())
    {
        if let Ok(n) = text.parse::<i128>() {
            return RpcId::Num(n);
        }
    }
    let (mantissa, exp) = match unsigned.find(['e', 'E']) {
        Some(i) => (&unsigned[..i], unsigned[i + 1..].parse::<i64>().ok()),
        None => (unsigned, Some(0)),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: String = int.chars().chain(frac.chars()).collect();
    let trimmed = digits.trim_start_matches('0');
    let significant = trimmed.trim_end_matches('0');
    if significant.is_empty() {
        // Zero, whatever its sign or spelling.
        return RpcId::Num(0);
    }
    // value = significant × 10^(exp − fraction digits + trailing zeros dropped)
    let zeros = trimmed.len() - significant.len();
    let power = exp.and_then(|e| {
        e.checked_sub(i64::try_from(frac.len()).ok()?)?
            .checked_add(i64::try_from(zeros).ok()?)
    });
    let Some(power) = power else {
        // An exponent beyond i64: distinct by its text, which no server echoes anyway.
        return RpcId::Dec(text.to_string());
    };
    if let Ok(width) = usize::try_from(power) {
        if significant.len().saturating_add(width) <= MAX_NUM_ID_DIGITS {
            if let Ok(mut n) = significant.parse::<i128>() {
                for _ in 0..width {
                    n *= 10;
                }
                return RpcId::Num(if neg { -n } else { n });
            }
        }
    }
    let sign = if neg { "-" } else { "" };
    RpcId::Dec(format!("{sign}{significant}e{power}"))
}

/// Visitor methods for scalar kinds a lenient value must not be: each is [`Lenient::Wrong`].
macro_rules! wrong_scalars {
    ($($visit:ident: $t:ty),*) => {
        $(fn $visit<E: de::Error>(self, _: $t) -> Result<Self::Value, E> {
            Ok(Lenient::Wrong)
        })*
    };
}

/// What a value looked like, for the lenient visitors.
macro_rules! ignore_rest {
    () => {
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Lenient::Wrong)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(Lenient::Wrong)
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Lenient::Wrong)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Lenient::Wrong)
        }
    };
}

/// The rest of a visitor that wants an object: any other value is read past and is `Wrong`,
/// except `null`, which is as good as absent (`"arguments": null`).
macro_rules! not_an_object {
    () => {
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Lenient::Wrong)
        }
        wrong_scalars!(
            visit_bool: bool,
            visit_i64: i64,
            visit_u64: u64,
            visit_f64: f64,
            visit_str: &str
        );
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Lenient::Absent)
        }
    };
}

/// The raw text of the next value, unparsed (`serde_json` only checks its syntax): what the id
/// and argument readers classify themselves, so a number is never forced through a float (an
/// out-of-range `1e400` would otherwise fail the whole message, which servers read fine).
fn raw<'de, D: Deserializer<'de>>(d: D) -> Result<&'de str, D::Error> {
    <&'de serde_json::value::RawValue>::deserialize(d).map(|r| r.get())
}

/// A raw JSON string's value: borrowed when it has no escapes, else unescaped by `serde_json`.
fn raw_str<'de, E: de::Error>(raw: &'de str) -> Result<Cow<'de, str>, E> {
    if !raw.contains('\\') {
        if let Some(inner) = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
            return Ok(Cow::Borrowed(inner));
        }
    }
    serde_json::from_str::<String>(raw)
        .map(Cow::Owned)
        .map_err(E::custom)
}

/// Lenient id: number or string; `null` and anything else are [`Lenient::Wrong`].
impl<'de> Deserialize<'de> for Lenient<RpcId> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = raw(d)?;
        Ok(match text.as_bytes().first() {
            Some(b'"') => Lenient::Ok(RpcId::Str(raw_str::<D::Error>(text)?.into_owned())),
            Some(b) if *b == b'-' || b.is_ascii_digit() => Lenient::Ok(number_id(text)),
            _ => Lenient::Wrong,
        })
    }
}

/// Lenient borrowed string.
impl<'de: 'a, 'a> Deserialize<'de> for Lenient<Cow<'a, str>> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Lenient<Cow<'a, str>>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Lenient::Ok(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Lenient::Ok(Cow::Owned(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Lenient::Ok(Cow::Owned(v)))
            }
            wrong_scalars!(visit_i64: i64, visit_u64: u64, visit_f64: f64);
            ignore_rest!();
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// Lenient bool.
impl<'de> Deserialize<'de> for Lenient<bool> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Lenient<bool>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a bool")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(Lenient::Ok(v))
            }
            wrong_scalars!(visit_i64: i64, visit_u64: u64, visit_f64: f64, visit_str: &str);
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Lenient::Wrong)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Lenient::Wrong)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Lenient::Wrong)
            }
        }
        d.deserialize_any(V)
    }
}

/// Lenient integer (JSON-RPC error codes).
impl<'de> Deserialize<'de> for Lenient<i64> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Lenient<i64>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Lenient::Ok(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(i64::try_from(v).map_or(Lenient::Wrong, Lenient::Ok))
            }
            wrong_scalars!(visit_f64: f64, visit_str: &str);
            ignore_rest!();
        }
        d.deserialize_any(V)
    }
}

/// An owned scalar argument value (the peek's copy of a top-level argument).
#[derive(Debug, Clone, PartialEq)]
pub enum ArgValue<'a> {
    Str(Cow<'a, str>),
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    /// Null, array or object: never captured.
    NotScalar,
}

impl ArgValue<'_> {
    pub fn as_scalar(&self) -> Option<Scalar<'_>> {
        Some(match self {
            ArgValue::Str(s) => Scalar::Str(s),
            ArgValue::Bool(b) => Scalar::Bool(*b),
            ArgValue::I64(n) => Scalar::I64(*n),
            ArgValue::U64(n) => Scalar::U64(*n),
            ArgValue::F64(f) => Scalar::F64(*f),
            ArgValue::NotScalar => return None,
        })
    }
}

/// Read from the value's raw text (see [`raw`]): a number that no float holds (`1e400`) is
/// not a scalar we capture, and not a reason to lose the call.
impl<'de: 'a, 'a> Deserialize<'de> for ArgValue<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        arg_value(raw(d)?)
    }
}

/// An argument's value from its raw text (both readings of the peek use this one).
fn arg_value<'a, E: de::Error>(text: &'a str) -> Result<ArgValue<'a>, E> {
    Ok(match text.as_bytes().first() {
        Some(b'"') => ArgValue::Str(raw_str::<E>(text)?),
        Some(b't') => ArgValue::Bool(true),
        Some(b'f') => ArgValue::Bool(false),
        Some(b) if *b == b'-' || b.is_ascii_digit() => {
            if let Ok(n) = text.parse::<u64>() {
                ArgValue::U64(n)
            } else if let Ok(n) = text.parse::<i64>() {
                ArgValue::I64(n)
            } else {
                match text.parse::<f64>() {
                    Ok(f) if f.is_finite() => ArgValue::F64(f),
                    _ => ArgValue::NotScalar,
                }
            }
        }
        _ => ArgValue::NotScalar,
    })
}

/// Most top-level argument keys kept per call; the rest are skipped (only allow-listed keys are
/// ever captured, and there are far fewer of those).
pub const MAX_ARGS_PEEKED: usize = 256;

/// Argument keys looked up by a scan for a repeat; past this many, by a hash map.
const ARGS_SCANNED: usize = 16;

/// Top-level `params.arguments`: each key once, with its last value (or [`Lenient::Wrong`] if not an object).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Args<'a>(pub Vec<(Cow<'a, str>, ArgValue<'a>)>);

impl<'de: 'a, 'a> Deserialize<'de> for Lenient<Args<'a>> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Lenient<Args<'a>>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out: Vec<(Cow<'a, str>, ArgValue<'a>)> = Vec::new();
                // Key → position, built once there are too many keys to scan.
                let mut index: Option<HashMap<Cow<'a, str>, usize>> = None;
                while let Some(k) = map.next_key::<Lenient<Cow<'a, str>>>()? {
                    let Lenient::Ok(k) = k else {
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    };
                    // A repeated key keeps its last value (even past the cap), as the server
                    // reads it: never capture a value the tool did not get.
                    let seen = match &index {
                        Some(ix) => ix.get(&k).copied(),
                        None => out.iter().position(|(o, _)| *o == k),
                    };
                    if let Some(i) = seen {
                        out[i].1 = map.next_value()?;
                        continue;
                    }
                    if out.len() >= MAX_ARGS_PEEKED {
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    }
                    let v: ArgValue<'a> = map.next_value()?;
                    if let Some(ix) = &mut index {
                        ix.insert(k.clone(), out.len());
                    }
                    out.push((k, v));
                    if index.is_none() && out.len() > ARGS_SCANNED {
                        index = Some(
                            out.iter()
                                .enumerate()
                                .map(|(i, (k, _))| (k.clone(), i))
                                .collect(),
                        );
                    }
                }
                Ok(Lenient::Ok(Args(out)))
            }
            not_an_object!();
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// A struct read from a JSON object the way servers read one (`JSON.parse`, Python's `json`):
/// a key given twice keeps its last value, where serde's derive would fail the whole message
/// (and a call a server executes would go unobserved). Keys are compared after unescaping;
/// keys not listed are skipped unread. Implemented by [`keep_last!`].
pub(crate) trait FromObject<'de>: Default {
    /// The keys read, in field order.
    const KEYS: &'static [&'static str];
    /// Reads the value of `KEYS[key]` into its field, replacing what an earlier one put there.
    fn set<A: MapAccess<'de>>(&mut self, key: usize, map: &mut A) -> Result<(), A::Error>;
}

/// Which of `KEYS` a key is, without allocating (the key is matched where it lies).
struct KeyIndex(&'static [&'static str]);

impl<'de> de::DeserializeSeed<'de> for KeyIndex {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIndex {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|k| *k == v))
    }
}

/// Reads an object into `T`, field by field (see [`FromObject`]).
pub(crate) fn read_object<'de, T: FromObject<'de>, A: MapAccess<'de>>(
    mut map: A,
) -> Result<T, A::Error> {
    let mut out = T::default();
    while let Some(key) = map.next_key_seed(KeyIndex(T::KEYS))? {
        match key {
            Some(i) => out.set(i, &mut map)?,
            None => {
                map.next_value::<IgnoredAny>()?;
            }
        }
    }
    Ok(out)
}

/// Implements [`FromObject`] for a struct: `keep_last!(impl<'a> T<'a> { "key" => field, … })`.
macro_rules! keep_last {
    (impl<$($lt:lifetime),*> $t:ty { $($key:literal => $field:ident),+ $(,)? }) => {
        impl<'de $(: $lt)*, $($lt),*> $crate::observe::peek::FromObject<'de> for $t {
            const KEYS: &'static [&'static str] = &[$($key),+];
            fn set<A: serde::de::MapAccess<'de>>(
                &mut self,
                key: usize,
                map: &mut A,
            ) -> Result<(), A::Error> {
                let mut i = 0usize;
                $(
                    if key == i {
                        self.$field = map.next_value()?;
                        return Ok(());
                    }
                    i += 1;
                )+
                let _ = i;
                map.next_value::<serde::de::IgnoredAny>().map(|_| ())
            }
        }
    };
}
pub(crate) use keep_last;

/// An object read by [`read_object`], for a caller outside the peek (the catalog).
#[derive(Debug, Default)]
pub(crate) struct Object<T>(pub T);

impl<'de, T: FromObject<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: FromObject<'de>> Visitor<'de> for V<T> {
            type Value = Object<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                read_object(map).map(Object)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// Generates a lenient wrapper for a [`FromObject`] struct: an object parses into `Ok`, anything else
/// is skipped and becomes `Wrong`. `boxed`: for a struct kept in a `Box`, the two large ones
/// (`params`, `result`), so that [`Peek`] itself stays small: serde moves a value several times
/// on its way out of `from_slice`, and with the big parts inline that was half a kilobyte copied
/// per move, for every message, present or not.
macro_rules! lenient_struct {
    ($t:ident) => {
        lenient_struct!(@impl $t, $t<'a>, |v| v);
    };
    ($t:ident, boxed) => {
        lenient_struct!(@impl $t, Box<$t<'a>>, Box::new);
    };
    (@impl $t:ident, $out:ty, $wrap:expr) => {
        impl<'de: 'a, 'a> Deserialize<'de> for Lenient<$out> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V<'a>(std::marker::PhantomData<&'a ()>);
                impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
                    type Value = Lenient<$out>;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str("an object")
                    }
                    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                        read_object::<$t<'a>, A>(map).map(|v| Lenient::Ok(($wrap)(v)))
                    }
                    not_an_object!();
                }
                d.deserialize_any(V(std::marker::PhantomData))
            }
        }
    };
}

/// `{ name }` of `clientInfo` / `serverInfo`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Info<'a> {
    pub name: Lenient<Cow<'a, str>>,
    /// `serverInfo.version` (OTLP's `service.version`).
    pub version: Lenient<Cow<'a, str>>,
}
keep_last!(impl<'a> Info<'a> { "name" => name, "version" => version });
lenient_struct!(Info);

/// The `_meta` entries the observer reads.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Meta<'a> {
    /// Opaque end-customer id (DESIGN §4).
    pub on_behalf_of: Lenient<Cow<'a, str>>,
    /// 2026-07-28: per-request protocol version.
    pub protocol_version: Lenient<Cow<'a, str>>,
    /// 2026-07-28: per-request client identity.
    pub client_info: Lenient<Info<'a>>,
    /// 2026-07-28 (SDK form): the echoed `requestState` of a retry.
    pub request_state: Lenient<Cow<'a, str>>,
    /// W3C trace context propagated in `_meta` (SEP-414), unprefixed.
    pub traceparent: Lenient<Cow<'a, str>>,
    pub tracestate: Lenient<Cow<'a, str>>,
}
keep_last!(impl<'a> Meta<'a> {
    "bounded/onBehalfOf" => on_behalf_of,
    "io.modelcontextprotocol/protocolVersion" => protocol_version,
    "io.modelcontextprotocol/clientInfo" => client_info,
    "io.modelcontextprotocol/requestState" => request_state,
    "traceparent" => traceparent,
    "tracestate" => tracestate,
});
lenient_struct!(Meta);

/// `params`, a superset of the shapes the observer reads (which one applies depends on the
/// method, which may come after `params` in the object).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Params<'a> {
    /// `tools/call`: the tool.
    pub name: Lenient<Cow<'a, str>>,
    pub arguments: Lenient<Args<'a>>,
    pub meta: Lenient<Meta<'a>>,
    /// `notifications/cancelled`.
    pub request_id: Lenient<RpcId>,
    /// `initialize`: the version the client asks for.
    pub protocol_version: Lenient<Cow<'a, str>>,
    pub client_info: Lenient<Info<'a>>,
    /// `tools/list`: present on every page but the first.
    pub cursor: Lenient<Cow<'a, str>>,
    /// 2026-07-28 retry: the state echoed from the `input_required` result.
    pub request_state: Lenient<Cow<'a, str>>,
    /// 2026-07-28 retry: the client's answers (only presence matters).
    pub input_responses: Option<IgnoredAny>,
}
keep_last!(impl<'a> Params<'a> {
    "name" => name,
    "arguments" => arguments,
    "_meta" => meta,
    "requestId" => request_id,
    "protocolVersion" => protocol_version,
    "clientInfo" => client_info,
    "cursor" => cursor,
    "requestState" => request_state,
    "inputResponses" => input_responses,
});
lenient_struct!(Params, boxed);

/// `result._meta` entries the observer reads.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResultMeta<'a> {
    /// 2026-07-28 SDKs (e.g. rmcp) put the server identity of `server/discover` here.
    pub server_info: Lenient<Info<'a>>,
}
keep_last!(impl<'a> ResultMeta<'a> { "io.modelcontextprotocol/serverInfo" => server_info });
lenient_struct!(ResultMeta);

/// `result`, the fields the observer reads.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResultPeek<'a> {
    pub is_error: Lenient<bool>,
    /// `"input_required"` / `"incomplete"` (2026-07-28 multi round-trip), `"complete"`.
    pub result_type: Lenient<Cow<'a, str>>,
    pub request_state: Lenient<Cow<'a, str>>,
    pub server_info: Lenient<Info<'a>>,
    /// `initialize`: the negotiated version.
    pub protocol_version: Lenient<Cow<'a, str>>,
    pub meta: Lenient<ResultMeta<'a>>,
    /// `tools/list`: a further page exists.
    pub next_cursor: Lenient<Cow<'a, str>>,
    /// `tools/call`: the content, unparsed (skipped over as cheaply as an ignored value), read
    /// only when the result is an error (its first text is fingerprinted, see
    /// `super::fingerprint`).
    pub content: RawContent<'a>,
}
keep_last!(impl<'a> ResultPeek<'a> {
    "isError" => is_error,
    "resultType" => result_type,
    "requestState" => request_state,
    "serverInfo" => server_info,
    "protocolVersion" => protocol_version,
    "_meta" => meta,
    "nextCursor" => next_cursor,
    "content" => content,
});
lenient_struct!(ResultPeek, boxed);

/// A JSON value kept as its text, borrowed from the message (`None`: absent, or not borrowable).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RawContent<'a>(pub Option<&'a str>);

impl<'de: 'a, 'a> Deserialize<'de> for RawContent<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a serde_json::value::RawValue>::deserialize(d).map(|r| RawContent(Some(r.get())))
    }
}

impl RawContent<'_> {
    /// The `text` of the first `{"type":"text"}` item of a content array, if any.
    pub fn first_text(&self) -> Option<String> {
        #[derive(Deserialize)]
        struct Item<'b> {
            #[serde(rename = "type", borrow)]
            kind: Option<Cow<'b, str>>,
            #[serde(borrow)]
            text: Option<Cow<'b, str>>,
        }
        let items: Vec<Item<'_>> = serde_json::from_str(self.0?).ok()?;
        items
            .into_iter()
            .find(|i| i.kind.as_deref() == Some("text"))
            .and_then(|i| i.text.map(Cow::into_owned))
    }
}

/// `error`, the fields the observer reads.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ErrorPeek<'a> {
    pub code: Lenient<i64>,
    /// Read only to fingerprint its shape (`super::fingerprint`); never kept, never sent.
    pub message: Lenient<Cow<'a, str>>,
}
keep_last!(impl<'a> ErrorPeek<'a> { "code" => code, "message" => message });
lenient_struct!(ErrorPeek);

/// One JSON-RPC message, as far as the observer cares.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Peek<'a> {
    pub id: Lenient<RpcId>,
    pub method: Lenient<Cow<'a, str>>,
    pub params: Lenient<Box<Params<'a>>>,
    pub result: Lenient<Box<ResultPeek<'a>>>,
    pub error: Lenient<ErrorPeek<'a>>,
}
keep_last!(impl<'a> Peek<'a> {
    "id" => id,
    "method" => method,
    "params" => params,
    "result" => result,
    "error" => error,
});

impl<'de: 'a, 'a> Deserialize<'de> for Peek<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Object::<Peek<'a>>::deserialize(d).map(|o| o.0)
    }
}

/// Why a message could not be peeked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeekError {
    /// Not JSON at all (or truncated).
    NotJson,
    /// JSON, but not an object.
    NotObject,
}

/// Peeks one message. `Ok` may still carry [`Lenient::Wrong`] fields.
pub fn peek(msg: &[u8]) -> Result<Peek<'_>, PeekError> {
    let first = msg.iter().find(|b| !b.is_ascii_whitespace());
    match first {
        Some(b'{') => {}
        Some(b'[') | Some(b'"') | Some(b't') | Some(b'f') | Some(b'n') | Some(b'-') => {
            return Err(if serde_json::from_slice::<IgnoredAny>(msg).is_ok() {
                PeekError::NotObject
            } else {
                PeekError::NotJson
            })
        }
        Some(b) if b.is_ascii_digit() => {
            return Err(if serde_json::from_slice::<IgnoredAny>(msg).is_ok() {
                PeekError::NotObject
            } else {
                PeekError::NotJson
            })
        }
        _ => return Err(PeekError::NotJson),
    }
    // A small message that is valid UTF-8 throughout is parsed as text: serde_json then does not
    // check each string it borrows again, and for an ordinary call those checks cost more than
    // the one pass. Such a message, written plainly, is first read by the plain path, which
    // gives up on anything serde must decide. A larger message, or one that is not UTF-8, is
    // parsed from its bytes, where the values it skips are never checked at all. The result is
    // the same every way.
    let text = (msg.len() <= WHOLE_UTF8_MAX)
        .then(|| crate::text::utf8(msg))
        .flatten();
    if let Some(p) = text.and_then(plain::peek) {
        return Ok(p);
    }
    by_serde(msg, text)
}

fn by_serde<'a>(msg: &'a [u8], text: Option<&'a str>) -> Result<Peek<'a>, PeekError> {
    match text {
        Some(t) => serde_json::from_str::<Peek<'_>>(t),
        None => serde_json::from_slice::<Peek<'_>>(msg),
    }
    .map_err(|_| PeekError::NotJson)
}

/// An object message as serde alone reads it, and whether the plain path read it too: for the
/// checks that the two readings agree (the `peek_plain` fuzz target).
#[cfg(any(test, feature = "fuzzing"))]
pub fn both_readings(msg: &str) -> (Result<Peek<'_>, PeekError>, Option<Peek<'_>>) {
    (by_serde(msg.as_bytes(), Some(msg)), plain::peek(msg))
}

/// Largest message [`peek`] checks as UTF-8 whole before parsing (see there).
const WHOLE_UTF8_MAX: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    /// Parsed as text or as bytes, a message reads the same: valid ones, and ones with bytes
    /// that are not UTF-8 in a key, in a value read, in a value skipped, or outside any string.
    #[test]
    fn text_and_bytes_parse_alike() {
        // `@` stands for the given bytes.
        let with = |json: &str, b: &[u8]| -> Vec<u8> {
            let (a, z) = json.split_once('@').expect("a placeholder");
            [a.as_bytes(), b, z.as_bytes()].concat()
        };
        let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t\u00e9@","arguments":{"a":"x","b":1.5,"c":[1,{"d":"x"}]}}}"#;
        let key = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"@":1}}}"#;
        let text = r#"{"jsonrpc":"2.0","id":"s","result":{"content":[{"type":"text","text":"ok @"}],"isError":false}}"#;
        let skipped = r#"{"jsonrpc":"2.0","id":1,"result":{"other":"@"}}"#;
        let outside = r#"{"jsonrpc":"2.0",@"id":1}"#;
        let mut msgs = Vec::new();
        for json in [call, key, text, skipped, outside] {
            for b in [&b""[..], "é✓".as_bytes(), b"\xff", b"\xc3", b"\xfe\xff"] {
                msgs.push(with(json, b));
            }
        }
        // The same past the size where whole-message checking stops.
        let pad = format!(r#"{{"pad":"{}","#, "p".repeat(WHOLE_UTF8_MAX));
        let big: Vec<Vec<u8>> = msgs
            .iter()
            .map(|m| [pad.as_bytes(), &m[1..]].concat())
            .collect();
        let mut text_path = 0;
        for m in msgs.iter().chain(&big) {
            let bytes = serde_json::from_slice::<Peek<'_>>(m).map_err(|_| PeekError::NotJson);
            assert_eq!(peek(m), bytes, "{}", String::from_utf8_lossy(m));
            text_path += usize::from(m.len() <= WHOLE_UTF8_MAX && std::str::from_utf8(m).is_ok());
        }
        assert_eq!(text_path, 10, "the valid small messages took the text path");
    }

    #[test]
    fn reads_a_tools_call_request() {
        let m = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"issue_refund",
            "arguments":{"amount_cents":4900,"currency":"EUR","customer_email":"j@x.io","nested":{"a":[1]},"ok":true,"f":1.5,"neg":-3},
            "_meta":{"bounded/onBehalfOf":"cust_1","progressToken":"p"}}}"#;
        let p = peek(m).expect("peek");
        assert_eq!(p.id, Lenient::Ok(RpcId::Num(7)));
        assert_eq!(p.method.ok().map(|m| m.as_ref()), Some("tools/call"));
        let params = p.params.ok().expect("params");
        assert_eq!(params.name.ok().map(|m| m.as_ref()), Some("issue_refund"));
        let args = &params.arguments.ok().expect("args").0;
        assert_eq!(args.len(), 7);
        assert_eq!(
            args[0],
            (Cow::Borrowed("amount_cents"), ArgValue::U64(4900))
        );
        assert_eq!(args[3].1, ArgValue::NotScalar);
        assert_eq!(args[6].1, ArgValue::I64(-3));
        let meta = params.meta.ok().expect("meta");
        assert_eq!(meta.on_behalf_of.ok().map(|m| m.as_ref()), Some("cust_1"));
    }

    #[test]
    fn reads_responses_and_errors() {
        let p =
            peek(br#"{"id":"a","result":{"content":[{"type":"text","text":"x"}],"isError":true}}"#)
                .expect("peek");
        assert_eq!(p.id, Lenient::Ok(RpcId::Str("a".into())));
        assert_eq!(p.result.ok().expect("r").is_error, Lenient::Ok(true));
        let p = peek(br#"{"id":1,"error":{"code":-32601,"message":"no"}}"#).expect("peek");
        assert_eq!(p.error.ok().expect("e").code, Lenient::Ok(-32601));
        let p = peek(br#"{"id":1,"result":{"resultType":"input_required","requestState":"s1"}}"#)
            .expect("peek");
        let r = p.result.ok().expect("r");
        assert_eq!(
            r.result_type.ok().map(|s| s.as_ref()),
            Some("input_required")
        );
        assert_eq!(r.request_state.ok().map(|s| s.as_ref()), Some("s1"));
    }

    #[test]
    fn wrong_types_are_marked_not_fatal() {
        let p = peek(br#"{"id":{"x":1},"method":"tools/call","params":"str"}"#).expect("peek");
        assert!(p.id.is_wrong());
        assert!(p.params.is_wrong());
        let p = peek(br#"{"id":1,"method":"tools/call","params":{"name":5,"arguments":[1]}}"#)
            .expect("peek");
        let params = p.params.ok().expect("params");
        assert!(params.name.is_wrong());
        assert!(params.arguments.is_wrong());
        let p = peek(br#"{"id":null,"error":{"code":"x"}}"#).expect("peek");
        assert!(p.id.is_wrong());
        assert!(p.error.ok().expect("e").code.is_wrong());
    }

    #[test]
    fn escaped_strings_are_unescaped() {
        let p = peek(br#"{"id":"a\"b","method":"tools\/call"}"#).expect("peek");
        assert_eq!(p.id, Lenient::Ok(RpcId::Str("a\"b".into())));
        assert_eq!(p.method.ok().map(|m| m.as_ref()), Some("tools/call"));
    }

    #[test]
    fn non_json_and_non_objects_are_told_apart() {
        assert_eq!(peek(b"hello"), Err(PeekError::NotJson));
        assert_eq!(peek(b"{\"id\":"), Err(PeekError::NotJson));
        assert_eq!(peek(b"42"), Err(PeekError::NotObject));
        assert_eq!(peek(b"\"s\""), Err(PeekError::NotObject));
    }

    #[test]
    fn huge_result_is_skipped_without_building_it() {
        let mut m = br#"{"id":3,"result":{"content":[{"type":"text","text":""#.to_vec();
        m.extend(std::iter::repeat_n(b'x', 5_000_000));
        m.extend_from_slice(br#""}]}}"#);
        let p = peek(&m).expect("peek");
        assert_eq!(p.id, Lenient::Ok(RpcId::Num(3)));
        assert_eq!(p.result.ok().expect("r").is_error, Lenient::Absent);
    }

    /// A server reads a duplicated key as its last value (`JSON.parse`, Python's `json`): so
    /// does the peek, for every field it reads, at every level.
    #[test]
    fn duplicate_keys_keep_the_last_value() {
        let m = br#"{"id":1,"method":"tools/list","id":2,"method":"tools/call",
            "params":{"name":"decoy","arguments":{"amount_cents":1,"note":"x","amount_cents":4900},
              "_meta":{"bounded/onBehalfOf":"a","bounded/onBehalfOf":"b"},"name":"issue_refund"}}"#;
        let p = peek(m).expect("peek");
        assert_eq!(p.id, Lenient::Ok(RpcId::Num(2)));
        assert_eq!(p.method.ok().map(|m| m.as_ref()), Some("tools/call"));
        let params = p.params.ok().expect("params");
        assert_eq!(params.name.ok().map(|m| m.as_ref()), Some("issue_refund"));
        let args = &params.arguments.ok().expect("args").0;
        let amounts: Vec<&ArgValue<'_>> = args
            .iter()
            .filter(|(k, _)| k == "amount_cents")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(amounts, [&ArgValue::U64(4900)], "one key, its last value");
        let meta = params.meta.ok().expect("meta");
        assert_eq!(meta.on_behalf_of.ok().map(|m| m.as_ref()), Some("b"));

        // A whole object given twice: the last one, not a merge of both.
        let p = peek(
            br#"{"id":1,"method":"tools/call","params":{"name":"a","arguments":{"x":1}},
            "params":{"name":"b"}}"#,
        )
        .expect("peek");
        let params = p.params.ok().expect("params");
        assert_eq!(params.name.ok().map(|m| m.as_ref()), Some("b"));
        assert_eq!(params.arguments, Lenient::Absent);

        // A last value of the wrong type is what the server sees: wrong, not the first.
        let p = peek(br#"{"id":1,"method":"tools/call","params":{"name":"a","name":7}}"#)
            .expect("peek");
        assert!(p.params.ok().expect("params").name.is_wrong());

        let p = peek(br#"{"id":3,"error":{"code":-32601,"code":-32602}}"#).expect("peek");
        assert_eq!(p.error.ok().expect("e").code, Lenient::Ok(-32602));
        let p = peek(
            br#"{"id":3,"result":{"isError":true,"isError":false,
                "resultType":"input_required","resultType":"complete",
                "protocolVersion":"2024-11-05","protocolVersion":"2025-11-25",
                "serverInfo":{"name":"x","name":"srv"}}}"#,
        )
        .expect("peek");
        let r = p.result.ok().expect("r");
        assert_eq!(r.is_error, Lenient::Ok(false));
        assert_eq!(r.result_type.ok().map(|s| s.as_ref()), Some("complete"));
        assert_eq!(
            r.protocol_version.ok().map(|s| s.as_ref()),
            Some("2025-11-25")
        );
        let info = r.server_info.ok().expect("serverInfo");
        assert_eq!(info.name.ok().map(|s| s.as_ref()), Some("srv"));
        let p = peek(
            br#"{"id":4,"method":"initialize","params":{"protocolVersion":"a","protocolVersion":"b",
                "clientInfo":{"name":"c1"},"clientInfo":{"name":"c2"}}}"#,
        )
        .expect("peek");
        let params = p.params.ok().expect("params");
        assert_eq!(params.protocol_version.ok().map(|s| s.as_ref()), Some("b"));
        let client = params.client_info.ok().expect("clientInfo");
        assert_eq!(client.name.ok().map(|s| s.as_ref()), Some("c2"));
    }

    /// Keys are compared as the server compares them: after unescaping.
    #[test]
    fn an_escaped_duplicate_key_is_the_same_key() {
        let p = peek(br#"{"id":1,"method":"tools/call","params":{"name":"a","n\u0061me":"b"}}"#)
            .expect("peek");
        let params = p.params.ok().expect("params");
        assert_eq!(params.name.ok().map(|m| m.as_ref()), Some("b"));
    }

    fn id_of(text: &str) -> Lenient<RpcId> {
        let m = format!(r#"{{"jsonrpc":"2.0","id":{text},"result":{{}}}}"#);
        peek(m.as_bytes()).expect("peek").id
    }

    /// Equal JSON numbers are one id, however they are written; a string never equals a number.
    #[test]
    fn equal_numeric_ids_are_one_id() {
        let one = id_of("1");
        for text in ["1.0", "1e0", "10E-1", "0.1e1", "1.000", "100e-2"] {
            assert_eq!(id_of(text), one, "{text}");
        }
        assert_eq!(id_of("-0"), id_of("0.0"));
        assert_eq!(id_of("-7.0"), id_of("-7"));
        assert_eq!(id_of("1.5"), id_of("15e-1"));
        assert_ne!(id_of("1.5"), one);
        assert_ne!(id_of(r#""1""#), one);
        assert_ne!(id_of(r#""1.0""#), one);
        assert_eq!(
            id_of("18446744073709551615"),
            id_of("18446744073709551615.0")
        );
    }

    /// The short-integer path and the general one name the same id on each side of the
    /// 18-digit boundary between them.
    #[test]
    fn short_and_long_integer_ids_are_read_alike() {
        for text in [
            "0",
            "-0",
            "7",
            "-7",
            "4900",
            "999999999999999999",
            "-999999999999999999",
            "1000000000000000000",
            "-1000000000000000000",
            "18446744073709551615",
            "99999999999999999999999999999999999999",
        ] {
            let want = RpcId::Num(text.parse::<i128>().expect("an i128"));
            assert_eq!(number_id(text), want, "{text}");
            assert_eq!(id_of(text), Lenient::Ok(want), "{text}");
        }
    }

    /// A number no float holds is still JSON, and servers read it: it neither fails the
    /// message (the call would go unobserved) nor becomes a captured value.
    #[test]
    fn out_of_range_numbers_do_not_hide_a_call() {
        let p = peek(
            br#"{"jsonrpc":"2.0","id":1e400,"method":"tools/call",
            "params":{"name":"t","arguments":{"amount":1e400,"n":-1E+400,"ok":7}}}"#,
        )
        .expect("peek");
        assert_eq!(p.id, id_of("10e399"));
        let params = p.params.ok().expect("params");
        assert_eq!(params.name.ok().map(|m| m.as_ref()), Some("t"));
        let args = &params.arguments.ok().expect("args").0;
        assert_eq!(args[0].1, ArgValue::NotScalar);
        assert_eq!(args[1].1, ArgValue::NotScalar);
        assert_eq!(args[2].1, ArgValue::U64(7));
    }

    proptest::proptest! {
        /// Any integer, written with a fraction or a (scaled) exponent, is the id it names.
        #[test]
        fn integral_ids_are_one_id_in_every_spelling(
            n in -(1i64 << 53)..(1i64 << 53),
            scale in 0u32..6,
            zeros in 0usize..4,
        ) {
            let plain = id_of(&n.to_string());
            let padded = format!("{n}.{}", "0".repeat(zeros + 1));
            let scaled = format!("{}E-{scale}", i128::from(n) * 10i128.pow(scale));
            let exp = format!("{n}e+0");
            for text in [padded, scaled, exp] {
                proptest::prop_assert_eq!(&id_of(&text), &plain, "{}", text);
            }
            proptest::prop_assert_ne!(id_of(&format!("\"{n}\"")), plain);
        }

        /// Any number is one id wherever its decimal point and exponent sit, and its negation
        /// is another.
        #[test]
        fn a_number_is_one_id_wherever_its_point_and_exponent_sit(
            m in 1u64..u64::MAX,
            point in 1usize..20,
            e in -400i64..400,
            zeros in 0usize..4,
        ) {
            let d = m.to_string();
            let p = point.min(d.len());
            let frac = d.len() - p;
            let base = id_of(&format!("{d}e{e}"));
            let pointed = if frac == 0 {
                format!("{d}E{e}")
            } else {
                format!("{}.{}e{}", &d[..p], &d[p..], e + frac as i64)
            };
            let padded = format!("{d}{}e{}", "0".repeat(zeros), e - zeros as i64);
            for text in [pointed, padded] {
                proptest::prop_assert_eq!(&id_of(&text), &base, "{}", text);
            }
            proptest::prop_assert_ne!(id_of(&format!("-{d}e{e}")), base);
        }
    }
}

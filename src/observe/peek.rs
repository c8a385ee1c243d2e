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

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::event::privacy::Scalar;

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
    pub fn is_wrong(&self) -> bool {
        matches!(self, Lenient::Wrong)
    }
}

/// A JSON-RPC id. `1` and `"1"` are different ids.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RpcId {
    Num(i128),
    Str(String),
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

/// Lenient id: number or string; `null` and anything else are [`Lenient::Wrong`].
impl<'de> Deserialize<'de> for Lenient<RpcId> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Lenient<RpcId>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON-RPC id")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Lenient::Ok(RpcId::Num(i128::from(v))))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Lenient::Ok(RpcId::Num(i128::from(v))))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                // Fractional ids are discouraged but legal JSON; keep them distinct by text.
                Ok(Lenient::Ok(RpcId::Str(format!("\u{0}f{v}"))))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Lenient::Ok(RpcId::Str(v.to_string())))
            }
            ignore_rest!();
        }
        d.deserialize_any(V)
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
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Lenient::Wrong)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Lenient::Wrong)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Lenient::Wrong)
            }
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
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Lenient::Wrong)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Lenient::Wrong)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Lenient::Wrong)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Lenient::Wrong)
            }
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
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Lenient::Wrong)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Lenient::Wrong)
            }
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

impl<'de: 'a, 'a> Deserialize<'de> for ArgValue<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = ArgValue<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(ArgValue::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(ArgValue::Str(Cow::Owned(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(ArgValue::Str(Cow::Owned(v)))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(ArgValue::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(ArgValue::I64(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(ArgValue::U64(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(ArgValue::F64(v))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(ArgValue::NotScalar)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(ArgValue::NotScalar)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(ArgValue::NotScalar)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// Most top-level argument keys kept per call; the rest are skipped (only allow-listed keys are
/// ever captured, and there are far fewer of those).
pub const MAX_ARGS_PEEKED: usize = 256;

/// Top-level `params.arguments`: keys with scalar values (or [`Lenient::Wrong`] if not an object).
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
                let mut out = Vec::new();
                while let Some(k) = map.next_key::<Lenient<Cow<'a, str>>>()? {
                    if out.len() >= MAX_ARGS_PEEKED {
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    }
                    let v: ArgValue<'a> = map.next_value()?;
                    if let Lenient::Ok(k) = k {
                        out.push((k, v));
                    }
                }
                Ok(Lenient::Ok(Args(out)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Lenient::Wrong)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Lenient::Wrong)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Lenient::Wrong)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Lenient::Wrong)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Lenient::Wrong)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Lenient::Wrong)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                // `"arguments": null` is as good as absent.
                Ok(Lenient::Absent)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// Generates a lenient wrapper for a derived struct: an object parses into `Ok`, anything else
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
                        $t::deserialize(de::value::MapAccessDeserializer::new(map))
                            .map(|v| Lenient::Ok(($wrap)(v)))
                    }
                    fn visit_seq<A: SeqAccess<'de>>(
                        self,
                        mut seq: A,
                    ) -> Result<Self::Value, A::Error> {
                        while seq.next_element::<IgnoredAny>()?.is_some() {}
                        Ok(Lenient::Wrong)
                    }
                    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                        Ok(Lenient::Wrong)
                    }
                    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                        Ok(Lenient::Wrong)
                    }
                    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                        Ok(Lenient::Wrong)
                    }
                    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                        Ok(Lenient::Wrong)
                    }
                    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                        Ok(Lenient::Wrong)
                    }
                    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                        Ok(Lenient::Absent)
                    }
                }
                d.deserialize_any(V(std::marker::PhantomData))
            }
        }
    };
}

/// `{ name }` of `clientInfo` / `serverInfo`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct Info<'a> {
    #[serde(borrow, default)]
    pub name: Lenient<Cow<'a, str>>,
}
lenient_struct!(Info);

/// The `_meta` entries the observer reads.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct Meta<'a> {
    /// Opaque end-customer id (DESIGN §4).
    #[serde(borrow, default, rename = "bounded/onBehalfOf")]
    pub on_behalf_of: Lenient<Cow<'a, str>>,
    /// 2026-07-28: per-request protocol version.
    #[serde(borrow, default, rename = "io.modelcontextprotocol/protocolVersion")]
    pub protocol_version: Lenient<Cow<'a, str>>,
    /// 2026-07-28: per-request client identity.
    #[serde(borrow, default, rename = "io.modelcontextprotocol/clientInfo")]
    pub client_info: Lenient<Info<'a>>,
    /// 2026-07-28 (SDK form): the echoed `requestState` of a retry.
    #[serde(borrow, default, rename = "io.modelcontextprotocol/requestState")]
    pub request_state: Lenient<Cow<'a, str>>,
}
lenient_struct!(Meta);

/// `params`, a superset of the shapes the observer reads (which one applies depends on the
/// method, which may come after `params` in the object).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct Params<'a> {
    /// `tools/call`: the tool.
    #[serde(borrow, default)]
    pub name: Lenient<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub arguments: Lenient<Args<'a>>,
    #[serde(borrow, default, rename = "_meta")]
    pub meta: Lenient<Meta<'a>>,
    /// `notifications/cancelled`.
    #[serde(default, rename = "requestId")]
    pub request_id: Lenient<RpcId>,
    /// `initialize`: the version the client asks for.
    #[serde(borrow, default, rename = "protocolVersion")]
    pub protocol_version: Lenient<Cow<'a, str>>,
    #[serde(borrow, default, rename = "clientInfo")]
    pub client_info: Lenient<Info<'a>>,
    /// `tools/list`: present on every page but the first.
    #[serde(borrow, default)]
    pub cursor: Lenient<Cow<'a, str>>,
    /// 2026-07-28 retry: the state echoed from the `input_required` result.
    #[serde(borrow, default, rename = "requestState")]
    pub request_state: Lenient<Cow<'a, str>>,
    /// 2026-07-28 retry: the client's answers (only presence matters).
    #[serde(default, rename = "inputResponses")]
    pub input_responses: Option<IgnoredAny>,
}
lenient_struct!(Params, boxed);

/// `result._meta` entries the observer reads.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct ResultMeta<'a> {
    /// 2026-07-28 SDKs (e.g. rmcp) put the server identity of `server/discover` here.
    #[serde(borrow, default, rename = "io.modelcontextprotocol/serverInfo")]
    pub server_info: Lenient<Info<'a>>,
}
lenient_struct!(ResultMeta);

/// `result`, the fields the observer reads.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct ResultPeek<'a> {
    #[serde(default, rename = "isError")]
    pub is_error: Lenient<bool>,
    /// `"input_required"` / `"incomplete"` (2026-07-28 multi round-trip), `"complete"`.
    #[serde(borrow, default, rename = "resultType")]
    pub result_type: Lenient<Cow<'a, str>>,
    #[serde(borrow, default, rename = "requestState")]
    pub request_state: Lenient<Cow<'a, str>>,
    #[serde(borrow, default, rename = "serverInfo")]
    pub server_info: Lenient<Info<'a>>,
    /// `initialize`: the negotiated version.
    #[serde(borrow, default, rename = "protocolVersion")]
    pub protocol_version: Lenient<Cow<'a, str>>,
    #[serde(borrow, default, rename = "_meta")]
    pub meta: Lenient<ResultMeta<'a>>,
    /// `tools/list`: a further page exists.
    #[serde(borrow, default, rename = "nextCursor")]
    pub next_cursor: Lenient<Cow<'a, str>>,
}
lenient_struct!(ResultPeek, boxed);

/// `error`, the field the observer reads.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct ErrorPeek<'a> {
    #[serde(default)]
    pub code: Lenient<i64>,
    #[serde(skip)]
    _borrow: std::marker::PhantomData<&'a ()>,
}
lenient_struct!(ErrorPeek);

/// One JSON-RPC message, as far as the observer cares.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct Peek<'a> {
    #[serde(default)]
    pub id: Lenient<RpcId>,
    #[serde(borrow, default)]
    pub method: Lenient<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub params: Lenient<Box<Params<'a>>>,
    #[serde(borrow, default)]
    pub result: Lenient<Box<ResultPeek<'a>>>,
    #[serde(borrow, default)]
    pub error: Lenient<ErrorPeek<'a>>,
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
    serde_json::from_slice::<Peek<'_>>(msg).map_err(|_| PeekError::NotJson)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

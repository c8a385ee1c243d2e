//! The peek's fast path: a small message, valid UTF-8, written plainly (no string escapes, no
//! number a float cannot hold where serde would read one, shallow nesting), read by one pass over
//! its text instead of serde's generic visitors. An ordinary `tools/call` and its answer are such
//! messages, and for them serde's visitors were a third of the observer's instructions per call.
//!
//! It never decides alone: on anything outside that plain subset, malformed JSON included, it
//! gives up (`None`) and serde reads the message. So a message this path accepts is one serde
//! accepts, read into the same [`Peek`]; the differential tests below and the
//! `peek_plain` fuzz target check exactly that. Every rule of the serde reading (a repeated key
//! keeps its last value, `null` is absent where an object is wanted, ids and argument values read
//! from their text) holds here because this path builds the same types through the same
//! classifiers ([`number_id`], [`arg_value`]).

use std::borrow::Cow;

use super::{
    arg_value, number_id, ArgValue, Args, ErrorPeek, Info, Lenient, Meta, Params, Peek, RawContent,
    ResultMeta, ResultPeek, RpcId, ARGS_SCANNED,
};

/// Deepest nesting read here; serde's own limit is 128, a real message nests a few levels.
const MAX_DEPTH: usize = 32;

/// Reads `text` (one whole message, starting with `{` after whitespace), or gives up.
pub(super) fn peek(text: &str) -> Option<Peek<'_>> {
    let mut c = Cursor { s: text, i: 0 };
    let p = c.fields(0, |c, p: &mut Peek<'_>, key, d| {
        match key {
            "id" => p.id = c.id(d)?,
            "method" => p.method = c.string_field(d)?,
            "params" => p.params = c.object_field(d, Cursor::params)?,
            "result" => p.result = c.object_field(d, Cursor::result)?,
            "error" => p.error = c.object_field(d, Cursor::error)?,
            _ => return Some(false),
        }
        Some(true)
    })?;
    c.ws();
    (c.i == c.s.len()).then_some(p)
}

/// The bytes a plain string ends at: its closing quote, or what this path leaves to serde (an
/// escape, a control character). A table: one load per byte where three comparisons took 12 %
/// more instructions for the whole peek (bench/README.md).
static ENDS_PLAIN_STRING: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = true;
        b += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// What a value is, by its first byte.
enum Kind {
    Object,
    Array,
    String,
    Number,
    Literal,
}

struct Cursor<'a> {
    s: &'a str,
    i: usize,
}

impl<'a> Cursor<'a> {
    fn byte(&self) -> Option<u8> {
        self.s.as_bytes().get(self.i).copied()
    }

    /// JSON whitespace, as serde reads it (no form feed).
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.byte() {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        self.ws();
        (self.byte()? == b).then(|| self.i += 1)
    }

    /// The kind of the value at the cursor (whitespace skipped).
    fn kind(&mut self) -> Option<Kind> {
        self.ws();
        Some(match self.byte()? {
            b'{' => Kind::Object,
            b'[' => Kind::Array,
            b'"' => Kind::String,
            b'-' | b'0'..=b'9' => Kind::Number,
            b't' | b'f' | b'n' => Kind::Literal,
            _ => return None,
        })
    }

    /// A string with no escape and no control character, without its quotes.
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let b = self.s.as_bytes();
        let start = self.i;
        let mut end = start;
        while !ENDS_PLAIN_STRING[usize::from(*b.get(end)?)] {
            end += 1;
        }
        if b[end] != b'"' {
            return None;
        }
        self.i = end + 1;
        // Both ends sit next to an ASCII quote, so they are character boundaries.
        self.s.get(start..end)
    }

    /// A number's text, by JSON's grammar (`-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?`).
    fn number(&mut self) -> Option<&'a str> {
        self.ws();
        let b = self.s.as_bytes();
        let start = self.i;
        let mut i = start;
        let digits = |i: &mut usize| {
            let from = *i;
            while b.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i > from
        };
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        if b.get(i) == Some(&b'0') {
            i += 1;
        } else if !digits(&mut i) {
            return None;
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            if !digits(&mut i) {
                return None;
            }
        }
        if let Some(b'e' | b'E') = b.get(i) {
            i += 1;
            if let Some(b'+' | b'-') = b.get(i) {
                i += 1;
            }
            if !digits(&mut i) {
                return None;
            }
        }
        // `01`, `1x`: serde fails here or at the next token; let it say so.
        if b.get(i)
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'.')
        {
            return None;
        }
        self.i = i;
        self.s.get(start..i)
    }

    /// A number that serde reads into an integer exactly: at most 18 digits, no fraction, no
    /// exponent, not `-0` (serde reads that one as a float). Anything else: give up, serde may
    /// fail the message on it (`1e400` is out of a float's range).
    fn small_int(&mut self) -> Option<i64> {
        let text = self.number()?;
        let digits = text.strip_prefix('-').unwrap_or(text);
        if digits.len() > 18 || !digits.bytes().all(|b| b.is_ascii_digit()) || text == "-0" {
            return None;
        }
        text.parse().ok()
    }

    fn literal(&mut self) -> Option<Option<bool>> {
        self.ws();
        let rest = &self.s.as_bytes()[self.i..];
        let (value, len) = if rest.starts_with(b"true") {
            (Some(true), 4)
        } else if rest.starts_with(b"false") {
            (Some(false), 5)
        } else if rest.starts_with(b"null") {
            (None, 4)
        } else {
            return None;
        };
        self.i += len;
        Some(value)
    }

    /// Calls `f` with the cursor at each member's value; `f` reads the value whole.
    fn object(
        &mut self,
        depth: usize,
        mut f: impl FnMut(&mut Self, &'a str, usize) -> Option<()>,
    ) -> Option<()> {
        self.items(b'{', b'}', depth, |c, d| {
            let key = c.string()?;
            c.eat(b':')?;
            f(c, key, d)
        })
    }

    fn array(&mut self, depth: usize) -> Option<()> {
        self.items(b'[', b']', depth, Cursor::skip)
    }

    /// The comma-separated items between `open` and `close`; `item` reads one whole.
    fn items(
        &mut self,
        open: u8,
        close: u8,
        depth: usize,
        mut item: impl FnMut(&mut Self, usize) -> Option<()>,
    ) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.eat(open)?;
        self.ws();
        if self.byte()? == close {
            self.i += 1;
            return Some(());
        }
        loop {
            item(self, depth + 1)?;
            self.ws();
            match self.byte()? {
                b',' => self.i += 1,
                b if b == close => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Reads past one value, checking its syntax (serde's `IgnoredAny`: numbers by grammar only).
    fn skip(&mut self, depth: usize) -> Option<()> {
        match self.kind()? {
            Kind::Object => self.object(depth, |c, _, d| c.skip(d)),
            Kind::Array => self.array(depth),
            Kind::String => self.string().map(drop),
            Kind::Number => self.number().map(drop),
            Kind::Literal => self.literal().map(drop),
        }
    }

    /// One value's text, unparsed (serde's `RawValue`).
    fn raw(&mut self, depth: usize) -> Option<&'a str> {
        self.ws();
        let start = self.i;
        self.skip(depth)?;
        self.s.get(start..self.i)
    }

    /// A value of the wrong type for a lenient field, read past. Numbers: see [`Self::small_int`].
    fn wrong<T>(&mut self, depth: usize) -> Option<Lenient<T>> {
        match self.kind()? {
            Kind::Number => self.small_int().map(drop),
            _ => self.skip(depth),
        }
        .map(|()| Lenient::Wrong)
    }

    fn string_field(&mut self, depth: usize) -> Option<Lenient<Cow<'a, str>>> {
        match self.kind()? {
            Kind::String => self.string().map(|s| Lenient::Ok(Cow::Borrowed(s))),
            _ => self.wrong(depth),
        }
    }

    fn bool_field(&mut self, depth: usize) -> Option<Lenient<bool>> {
        match self.kind()? {
            Kind::Literal => Some(self.literal()?.map_or(Lenient::Wrong, Lenient::Ok)),
            _ => self.wrong(depth),
        }
    }

    fn int_field(&mut self, depth: usize) -> Option<Lenient<i64>> {
        match self.kind()? {
            Kind::Number => self.small_int().map(Lenient::Ok),
            _ => self.wrong(depth),
        }
    }

    /// An id, read from its text as serde's reading does.
    fn id(&mut self, depth: usize) -> Option<Lenient<RpcId>> {
        Some(match self.kind()? {
            Kind::String => Lenient::Ok(RpcId::Str(self.string()?.to_string())),
            Kind::Number => Lenient::Ok(match self.counted_id() {
                Some(n) => RpcId::Num(n),
                None => number_id(self.number()?),
            }),
            _ => self.wrong(depth)?,
        })
    }

    /// The usual numeric id, a plain integer of at most 18 digits (every SDK counts its ids up
    /// from 0 or 1), summed as its digits are scanned: reading its text first and its digits
    /// again ([`number_id`]) took about 250 instructions an id (bench/README.md). `None`, the
    /// cursor unmoved, for anything else (a leading zero, a fraction, an exponent, more digits,
    /// or anything but `,` `}` `]` or whitespace after the digits), which the general reading
    /// then takes: so this answers only where it would answer the same.
    fn counted_id(&mut self) -> Option<i128> {
        let b = self.s.as_bytes();
        let neg = b.get(self.i) == Some(&b'-');
        let start = self.i + usize::from(neg);
        let mut i = start;
        let mut n = 0u64;
        while let Some(&d) = b.get(i).filter(|d| d.is_ascii_digit()) {
            if i - start == 18 {
                return None;
            }
            n = n * 10 + u64::from(d - b'0');
            i += 1;
        }
        let len = i - start;
        if len == 0 || (len > 1 && b[start] == b'0') {
            return None;
        }
        if !matches!(
            b.get(i),
            Some(b',' | b'}' | b']' | b' ' | b'\n' | b'\t' | b'\r')
        ) {
            return None;
        }
        self.i = i;
        let n = i128::from(n);
        Some(if neg { -n } else { n })
    }

    /// An object field: `read` for an object, absent for `null`, wrong for anything else.
    fn object_field<T>(
        &mut self,
        depth: usize,
        read: impl FnOnce(&mut Self, usize) -> Option<T>,
    ) -> Option<Lenient<T>> {
        match self.kind()? {
            Kind::Object => read(self, depth).map(Lenient::Ok),
            Kind::Literal => Some(match self.literal()? {
                None => Lenient::Absent,
                Some(_) => Lenient::Wrong,
            }),
            _ => self.wrong(depth),
        }
    }

    /// An object read into `T`: `set` reads the members it knows and says so; the rest are
    /// skipped.
    fn fields<T: Default>(
        &mut self,
        depth: usize,
        mut set: impl FnMut(&mut Self, &mut T, &'a str, usize) -> Option<bool>,
    ) -> Option<T> {
        let mut out = T::default();
        self.object(depth, |c, key, d| match set(c, &mut out, key, d)? {
            true => Some(()),
            false => c.skip(d),
        })?;
        Some(out)
    }

    fn info(&mut self, depth: usize) -> Option<Info<'a>> {
        self.fields(depth, |c, out: &mut Info<'a>, key, d| {
            match key {
                "name" => out.name = c.string_field(d)?,
                "version" => out.version = c.string_field(d)?,
                _ => return Some(false),
            }
            Some(true)
        })
    }

    fn meta(&mut self, depth: usize) -> Option<Meta<'a>> {
        self.fields(depth, |c, out: &mut Meta<'a>, key, d| {
            match key {
                "bounded/onBehalfOf" => out.on_behalf_of = c.string_field(d)?,
                "io.modelcontextprotocol/protocolVersion" => {
                    out.protocol_version = c.string_field(d)?
                }
                "io.modelcontextprotocol/clientInfo" => {
                    out.client_info = c.object_field(d, Cursor::info)?
                }
                "io.modelcontextprotocol/requestState" => out.request_state = c.string_field(d)?,
                "traceparent" => out.traceparent = c.string_field(d)?,
                "tracestate" => out.tracestate = c.string_field(d)?,
                _ => return Some(false),
            }
            Some(true)
        })
    }

    /// Top-level `arguments`: each key once with its last value. Past [`ARGS_SCANNED`] keys,
    /// serde's reading (which indexes them) takes over.
    fn args(&mut self, depth: usize) -> Option<Args<'a>> {
        let mut out: Vec<(Cow<'a, str>, ArgValue<'a>)> = Vec::new();
        self.object(depth, |c, key, d| {
            let value = arg_value::<serde_json::Error>(c.raw(d)?).ok()?;
            if let Some(slot) = out.iter_mut().find(|(k, _)| k == key) {
                slot.1 = value;
            } else if out.len() < ARGS_SCANNED {
                out.push((Cow::Borrowed(key), value));
            } else {
                return None;
            }
            Some(())
        })?;
        Some(Args(out))
    }

    fn params(&mut self, depth: usize) -> Option<Box<Params<'a>>> {
        self.fields(depth, |c, out: &mut Box<Params<'a>>, key, d| {
            match key {
                "name" => out.name = c.string_field(d)?,
                "arguments" => out.arguments = c.object_field(d, Cursor::args)?,
                "_meta" => out.meta = c.object_field(d, Cursor::meta)?,
                "requestId" => out.request_id = c.id(d)?,
                "protocolVersion" => out.protocol_version = c.string_field(d)?,
                "clientInfo" => out.client_info = c.object_field(d, Cursor::info)?,
                "cursor" => out.cursor = c.string_field(d)?,
                "requestState" => out.request_state = c.string_field(d)?,
                "inputResponses" => {
                    out.input_responses = match c.kind()? {
                        Kind::Literal => c.literal()?.map(|_| serde::de::IgnoredAny),
                        // A value that cannot be read past makes the message one to give up on,
                        // as everywhere: read as absent, it left the cursor inside the value.
                        _ => {
                            c.skip(d)?;
                            Some(serde::de::IgnoredAny)
                        }
                    }
                }
                _ => return Some(false),
            }
            Some(true)
        })
    }

    fn result(&mut self, depth: usize) -> Option<Box<ResultPeek<'a>>> {
        self.fields(depth, |c, out: &mut Box<ResultPeek<'a>>, key, d| {
            match key {
                "isError" => out.is_error = c.bool_field(d)?,
                "resultType" => out.result_type = c.string_field(d)?,
                "requestState" => out.request_state = c.string_field(d)?,
                "serverInfo" => out.server_info = c.object_field(d, Cursor::info)?,
                "protocolVersion" => out.protocol_version = c.string_field(d)?,
                "_meta" => out.meta = c.object_field(d, Cursor::result_meta)?,
                "nextCursor" => out.next_cursor = c.string_field(d)?,
                "content" => {
                    out.content = RawContent(Some(c.raw(d)?));
                }
                _ => return Some(false),
            }
            Some(true)
        })
    }

    fn result_meta(&mut self, depth: usize) -> Option<ResultMeta<'a>> {
        self.fields(depth, |c, out: &mut ResultMeta<'a>, key, d| {
            match key {
                "io.modelcontextprotocol/serverInfo" => {
                    out.server_info = c.object_field(d, Cursor::info)?
                }
                _ => return Some(false),
            }
            Some(true)
        })
    }

    fn error(&mut self, depth: usize) -> Option<ErrorPeek<'a>> {
        self.fields(depth, |c, out: &mut ErrorPeek<'a>, key, d| {
            match key {
                "code" => out.code = c.int_field(d)?,
                "message" => out.message = c.string_field(d)?,
                _ => return Some(false),
            }
            Some(true)
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::{both_readings, peek as peek_any, PeekError};

    /// What the SDKs send and answer in an ordinary session: each is read by this path, not
    /// handed to serde (else the fast path could give up on everything and every test pass).
    #[test]
    fn ordinary_messages_take_the_plain_path() {
        let msgs = [
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"mcp","version":"0.1.0"}}}"#,
            r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{"listChanged":true}},"serverInfo":{"name":"example-servers/everything","version":"1.0.0"}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"method":"tools/call","params":{"name":"echo","arguments":{"message":"hello 7"},"_meta":{"progressToken":7,"bounded/onBehalfOf":"cust_1"}},"jsonrpc":"2.0","id":7}"#,
            r#"{"result":{"content":[{"type":"text","text":"Echo: hello 7"}],"isError":false},"jsonrpc":"2.0","id":7}"#,
            r#"{"jsonrpc":"2.0","id":"a-1","error":{"code":-32602,"message":"Unknown tool: x","data":null}}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"cursor":"c2"}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"timeout"}}"#,
            " {\"jsonrpc\": \"2.0\", \"id\": 12, \"method\": \"tools/call\",\n \"params\": {\"name\": \"add\", \"arguments\": {\"a\": 1.5, \"b\": -2, \"c\": true, \"d\": null, \"e\": [1, {}]}}}\r\n",
        ];
        for m in msgs {
            let (serde, plain) = both_readings(m);
            assert_eq!(plain.map(Ok), Some(serde.clone()), "{m}");
            assert_eq!(peek_any(m.as_bytes()), serde, "{m}");
        }
    }

    /// Where serde must decide, this path gives up, and `peek` answers as serde does.
    #[test]
    fn gives_up_where_serde_must_decide() {
        for m in [
            r#"{"id":"a\"b","method":"tools/call"}"#,
            r#"{"id":1,"method":"tools/call","params":{"name":"a","n\u0061me":"b"}}"#,
            r#"{"id":1,"error":{"code":1e400}}"#,
            r#"{"id":1,"error":{"code":-0}}"#,
            r#"{"id":1,"method":"x","params":{"name":12345678901234567890}}"#,
            "{\"id\":1,\"method\":\"a\tb\"}",
            r#"{"id":1,}"#,
            r#"{"id":01}"#,
            r#"{"id":1} x"#,
            "\x0c{\"id\":1}",
            // Found by `an_edited_message_is_never_misread`: a tab inside the string value of
            // `inputResponses`, after which the rest read as members.
            "{\"params\":{\"inputResponses\":\",\t\"method\":1}}",
            "{\"params\":{\"inputResponses\":[1,],\"name\":\"x\"}}",
        ] {
            let (serde, plain) = both_readings(m);
            assert!(plain.is_none(), "{m}");
            assert_eq!(peek_any(m.as_bytes()), serde, "{m}");
        }
        assert_eq!(
            peek_any(br#"{"id":1,}"#),
            Err(PeekError::NotJson),
            "serde's answer"
        );
    }

    /// Every field the peek reads, given every kind of value, once or twice: this path reads it
    /// as serde does, and reads it at all when the value is plain.
    #[test]
    fn every_field_reads_every_kind_of_value_as_serde_does() {
        let object = |keys: &[&str], at: &str| -> Vec<String> {
            keys.iter()
                .map(|k| at.replace('@', &format!(r#"{{"{k}":@}}"#)))
                .collect()
        };
        let mut places = object(
            &["jsonrpc", "id", "method", "params", "result", "error", "x"],
            "@",
        );
        let params = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":@}"#;
        let result = r#"{"jsonrpc":"2.0","id":1,"result":@}"#;
        let info = ["name", "version", "x"];
        places.extend(object(
            &[
                "name",
                "arguments",
                "_meta",
                "requestId",
                "protocolVersion",
                "clientInfo",
                "cursor",
                "requestState",
                "inputResponses",
                "x",
            ],
            params,
        ));
        places.extend(object(
            &["a", "na", "é"],
            &params.replace('@', r#"{"arguments":@}"#),
        ));
        places.extend(object(
            &[
                "bounded/onBehalfOf",
                "io.modelcontextprotocol/protocolVersion",
                "io.modelcontextprotocol/clientInfo",
                "io.modelcontextprotocol/requestState",
                "traceparent",
                "tracestate",
                "progressToken",
            ],
            &params.replace('@', r#"{"_meta":@}"#),
        ));
        places.extend(object(&info, &params.replace('@', r#"{"clientInfo":@}"#)));
        places.extend(object(
            &info,
            &params.replace('@', r#"{"_meta":{"io.modelcontextprotocol/clientInfo":@}}"#),
        ));
        places.extend(object(
            &[
                "isError",
                "resultType",
                "requestState",
                "serverInfo",
                "protocolVersion",
                "_meta",
                "nextCursor",
                "content",
                "x",
            ],
            result,
        ));
        places.extend(object(&info, &result.replace('@', r#"{"serverInfo":@}"#)));
        places.extend(object(
            &["io.modelcontextprotocol/serverInfo", "x"],
            &result.replace('@', r#"{"_meta":@}"#),
        ));
        places.extend(object(
            &info,
            &result.replace('@', r#"{"_meta":{"io.modelcontextprotocol/serverInfo":@}}"#),
        ));
        places.extend(object(
            &["code", "message", "data"],
            r#"{"jsonrpc":"2.0","id":1,"error":@}"#,
        ));
        // Given twice: the last value counts.
        let twice: Vec<String> = places
            .iter()
            .map(|p| {
                let key = p.rfind("\":@").expect("a member");
                let open = p[..key].rfind('"').expect("its key");
                format!("{}:\"first\",{}", &p[..=key], &p[open..])
            })
            .collect();
        let plain_values = [
            "null",
            "true",
            "false",
            "0",
            "-32601",
            "7",
            r#""s""#,
            r#""é✓""#,
            "{}",
            "[]",
            r#"{"a":[1,{"b":null}],"c":"d"}"#,
            r#"[1,"x",{}]"#,
        ];
        let other_values = [
            "1.5",
            "1e400",
            "-0",
            "12345678901234567890",
            r#""a\"b""#,
            r#""\u0041""#,
            r#"{"a\u0041":1}"#,
        ];
        let mut read_here = 0;
        for place in places.iter().chain(&twice) {
            for v in plain_values.iter().chain(&other_values) {
                let m = place.replace('@', v);
                let (serde, plain) = both_readings(&m);
                if plain_values.contains(v) {
                    assert!(serde.is_ok(), "{m}");
                    assert!(plain.is_some(), "a plain message left to serde: {m}");
                }
                if let Some(p) = plain {
                    read_here += 1;
                    assert_eq!(Ok(p), serde, "{m}");
                }
            }
        }
        assert!(read_here >= places.len() * 2 * plain_values.len());
    }

    /// Keys the peek reads, at any level, and a few it does not.
    const KEYS: &[&str] = &[
        "jsonrpc",
        "id",
        "method",
        "params",
        "result",
        "error",
        "name",
        "arguments",
        "_meta",
        "requestId",
        "protocolVersion",
        "clientInfo",
        "cursor",
        "requestState",
        "inputResponses",
        "isError",
        "resultType",
        "serverInfo",
        "nextCursor",
        "content",
        "code",
        "message",
        "version",
        "bounded/onBehalfOf",
        "io.modelcontextprotocol/protocolVersion",
        "io.modelcontextprotocol/clientInfo",
        "io.modelcontextprotocol/requestState",
        "io.modelcontextprotocol/serverInfo",
        "traceparent",
        "tracestate",
        "type",
        "text",
        "x",
        "na\\u006de",
        "é",
    ];

    /// Number spellings: valid JSON (some of them ones this path leaves to serde where it
    /// reads a number), then invalid ones.
    const NUMBERS: &[&str] = &[
        "0",
        "7",
        "-32601",
        "1.5",
        "1.0",
        "10E-1",
        "0.000",
        "123456789012345678",
        "-123456789012345678",
        "1234567890123456789",
        "9223372036854775808",
        "18446744073709551616",
        "1e400",
        "-1E+400",
        "-0",
    ];
    const BAD_NUMBERS: &[&str] = &["01", "00", "-01", "1x", "1.", "-", "1e", "+1", ".5"];

    /// String contents without escapes, then escaped ones, a raw control character and a lone
    /// backslash.
    const STRINGS: &[&str] = &[
        "",
        "tools/call",
        "echo",
        "a b",
        "é✓",
        "complete",
        "input_required",
    ];
    const ODD_STRINGS: &[&str] = &["\\\"q", "\\u0041", "\\ud800", "\\n", "\t", "\\"];

    /// A JSON-ish value, written out with the given whitespace; keys may repeat.
    #[derive(Debug, Clone)]
    enum V {
        Lit(&'static str),
        Num(&'static str),
        Str(&'static str),
        Arr(Vec<V>),
        Obj(Vec<(&'static str, V)>),
    }

    fn write(v: &V, ws: &str, out: &mut String) {
        match v {
            V::Lit(s) | V::Num(s) => out.push_str(s),
            V::Str(s) => {
                out.push('"');
                out.push_str(s);
                out.push('"');
            }
            V::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(ws);
                    write(item, ws, out);
                }
                out.push(']');
            }
            V::Obj(members) => {
                out.push('{');
                for (i, (k, item)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(ws);
                    out.push('"');
                    out.push_str(k);
                    out.push_str("\":");
                    out.push_str(ws);
                    write(item, ws, out);
                }
                out.push_str(ws);
                out.push('}');
            }
        }
    }

    fn value() -> impl Strategy<Value = V> {
        // Odd atoms are rare, so that most messages stay plain enough to be read here.
        let leaf = prop_oneof![
            6 => prop::sample::select(vec!["true", "false", "null"]).prop_map(V::Lit),
            6 => prop::sample::select(NUMBERS).prop_map(V::Num),
            6 => prop::sample::select(STRINGS).prop_map(V::Str),
            1 => prop::sample::select(vec!["nul", "tru", "nulll"]).prop_map(V::Lit),
            1 => prop::sample::select(BAD_NUMBERS).prop_map(V::Num),
            1 => prop::sample::select(ODD_STRINGS).prop_map(V::Str),
        ];
        leaf.prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(V::Arr),
                prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(V::Obj),
            ]
        })
    }

    /// A message: an object of top-level members (keys the peek reads, mostly).
    fn message() -> impl Strategy<Value = String> {
        (
            prop::collection::vec((prop::sample::select(KEYS), value()), 0..6),
            prop::sample::select(vec!["", " ", "\n  ", "\t"]),
        )
            .prop_map(|(members, ws)| {
                let mut out = String::new();
                write(&V::Obj(members), ws, &mut out);
                out
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// A message the plain path reads, serde reads too, into the same peek.
        #[test]
        fn plain_reading_agrees_with_serde(m in message()) {
            let (serde, plain) = both_readings(&m);
            if let Some(p) = plain {
                prop_assert_eq!(Ok(p), serde, "{}", m);
            }
        }

        /// The same after an edit anywhere: a structural character inserted, or one removed.
        #[test]
        fn an_edited_message_is_never_misread(
            m in message(),
            at in any::<prop::sample::Index>(),
            insert in prop::option::of(prop::sample::select(
                vec!['{', '}', '[', ']', '"', ',', ':', '0', '-', '.', 'e', '\\', ' ', 'n'],
            )),
        ) {
            let cuts: Vec<usize> = (0..=m.len()).filter(|i| m.is_char_boundary(*i)).collect();
            let i = cuts[at.index(cuts.len())];
            let mut edited = m.clone();
            match insert {
                Some(ch) => edited.insert(i, ch),
                None if i < m.len() => {
                    edited.remove(i);
                }
                None => {}
            }
            let (serde, plain) = both_readings(&edited);
            if let Some(p) = plain {
                prop_assert_eq!(Ok(p), serde, "{}", edited);
            }
        }
    }
}

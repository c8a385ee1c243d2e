//! Privacy layers L2 (PII key denylist) and L4 (value scrubber), and the capture allow-set
//! (DESIGN §5). One module, run by the sensor when it builds an event and again by the ingest
//! (through [`crate::event::validate_and_filter_event`]) on every event it receives.
//!
//! Goes in: an argument key and a candidate value. Comes out: the value if, and only if, it is a
//! scalar (string, number, bool) of bounded length, under a key that is allowed, not shaped like
//! PII, and contains no card number, e-mail address, JWT or well-known secret. Everything else is
//! dropped, silently and without a trace of its contents (no logging of values, ever).
//!
//! Keys are compared in *normalised* form: lower case with every non-alphanumeric character
//! removed, so `customer_email`, `customerEmail` and `Customer-E-Mail` are the same key.
//! The denylist is matched as a substring of the normalised key and overrides everything,
//! including `--capture`; it is compiled in and cannot be changed at run time.

use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use serde_json::{Number, Value};

/// Argument keys captured without any `--capture` flag: business metadata that describes what a
/// call did (how much, in what unit, why, in which state) without naming anyone. Written in
/// normalised form (see [`normalize_key`]), so `amount_cents`, `amountCents` and `AMOUNT-CENTS`
/// all match `amountcents`. Free text such as `reason` is still run through the L4 scrubber.
pub const BUILTIN_CAPTURE: &[&str] = &[
    // Money
    "amount",
    "amountcents",
    "amountminor",
    "total",
    "totalcents",
    "subtotal",
    "price",
    "pricecents",
    "fee",
    "feecents",
    "currency",
    // Quantities
    "quantity",
    "qty",
    "count",
    "limit",
    "unit",
    "units",
    "pagesize",
    // What and why
    "reason",
    "status",
    "state",
    "type",
    "kind",
    "category",
    "action",
    "operation",
    "mode",
    "priority",
    "severity",
    "level",
    "format",
    "locale",
    "language",
    "region",
    "environment",
    "dryrun",
    "force",
];

/// Substrings of normalised keys that mark a key as PII or a credential (L2). A key that
/// contains any of them is never captured, whatever the allow-set or `--capture` says.
/// Deliberately broad: a false positive costs one captured field, a false negative leaks.
pub const PII_DENY_SUBSTRINGS: &[&str] = &[
    // Contact
    "email",
    "mail",
    "phone",
    "mobile",
    "fax",
    // Payment instruments and bank details
    "card",
    "cvv",
    "cvc",
    "pan",
    "iban",
    "swift",
    "bic",
    "accountnumber",
    "accountno",
    "acct",
    "routing",
    "sortcode",
    // Government ids
    "ssn",
    "socialsecurity",
    "taxid",
    "vat",
    "passport",
    "license",
    "licence",
    "nationalid",
    // Credentials
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "passphrase",
    "apikey",
    "key",
    "credential",
    "auth",
    "bearer",
    "jwt",
    "cookie",
    "session",
    "signature",
    "otp",
    // Identity and location
    "name",
    "address",
    "street",
    "city",
    "zip",
    "postal",
    "postcode",
    "birth",
    "dob",
    "gender",
    "ipaddr",
    "ipv4",
    "ipv6",
    "geo",
    "latitude",
    "longitude",
    "gps",
    "location",
    "deviceid",
    "imei",
    "user",
];

/// Normalised keys that are PII when they *end* with these (short tokens that would deny far too
/// much as substrings: `ip` is in `description`, `pin` in `shipping`).
pub const PII_DENY_SUFFIXES: &[&str] = &["ip", "pin"];

/// Normalised keys that are PII only as the whole key (`age` is inside `language` and `pagesize`).
pub const PII_DENY_EXACT: &[&str] = &["age", "sex", "dob"];

/// Longest string value that may be captured, in bytes. Enough for a currency, a status or a
/// one-line reason; too short for a document. Longer values are dropped, never truncated (a cut
/// could split an e-mail address or card number so the scrubber no longer sees it).
pub const MAX_VALUE_LEN: usize = 128;

/// Longest key that may appear in `rec.fields`. Argument names are short identifiers.
pub const MAX_KEY_LEN: usize = 64;

/// Most captured fields per event: bounds the event size whatever `--capture` lists.
pub const MAX_FIELDS: usize = 32;

/// Prefixes of well-known credentials (Stripe, GitHub, Slack, AWS, PEM, HTTP auth). A value
/// containing one is removed under any key (L4).
pub const SECRET_MARKERS: &[&str] = &[
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "pk_live_",
    "whsec_",
    "ghp_",
    "gho_",
    "ghs_",
    "github_pat_",
    "xoxb-",
    "xoxp-",
    "akia",
    "-----begin",
    "bearer ",
    "basic ",
];

/// Lower case, separators (anything not alphanumeric) removed.
pub fn normalize_key(key: &str) -> String {
    if key.is_ascii() {
        // Same result for ASCII (alphanumeric and lower case are the ASCII ones there), without
        // the per-character Unicode case tables: every key of every call comes through here.
        let mut out = String::with_capacity(key.len());
        out.extend(
            key.bytes()
                .filter(u8::is_ascii_alphanumeric)
                .map(|b| char::from(b.to_ascii_lowercase())),
        );
        return out;
    }
    key.chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

/// One automaton per substring list, built on first use: every key and value of every call is
/// checked, and one pass over the text for all patterns replaces one `contains` per pattern.
/// Only *whether* some pattern occurs is asked, which no match kind or overlap changes.
fn automaton(
    cell: &'static OnceLock<Option<AhoCorasick>>,
    patterns: &[&str],
    ascii_ci: bool,
) -> Option<&'static AhoCorasick> {
    cell.get_or_init(|| {
        AhoCorasickBuilder::new()
            .ascii_case_insensitive(ascii_ci)
            .match_kind(MatchKind::Standard)
            .build(patterns)
            .ok()
    })
    .as_ref()
}

/// Does `text` contain any of `patterns`? Falls back to plain `contains` calls should the
/// automaton ever fail to build (it cannot for these few short patterns), so the answer is the
/// same either way.
fn contains_any(
    cell: &'static OnceLock<Option<AhoCorasick>>,
    patterns: &[&str],
    text: &str,
) -> bool {
    match automaton(cell, patterns, false) {
        Some(ac) => ac.is_match(text),
        None => patterns.iter().any(|p| text.contains(p)),
    }
}

static PII_DENY_AC: OnceLock<Option<AhoCorasick>> = OnceLock::new();

/// Longest ASCII key normalised on the stack instead of into a `String` (argument keys are
/// short identifiers; anything longer takes the allocating path, with the same result).
const STACK_KEY: usize = 128;

/// Calls `f` with [`normalize_key`]`(key)`, without allocating for short ASCII keys: the L2
/// check runs on every captured key twice per event (capture, then the L3 filter).
fn with_normalized<R>(key: &str, f: impl FnOnce(&str) -> R) -> R {
    if key.is_ascii() && key.len() <= STACK_KEY {
        let mut buf = [0u8; STACK_KEY];
        let mut n = 0;
        for b in key.bytes().filter(u8::is_ascii_alphanumeric) {
            buf[n] = b.to_ascii_lowercase();
            n += 1;
        }
        // Only ASCII bytes were written, so this cannot fail; the fallback keeps it panic-free.
        if let Ok(k) = std::str::from_utf8(&buf[..n]) {
            return f(k);
        }
    }
    f(&normalize_key(key))
}

/// L2 on a key already in normalised form.
fn is_pii_normalized(k: &str) -> bool {
    contains_any(&PII_DENY_AC, PII_DENY_SUBSTRINGS, k)
        || PII_DENY_SUFFIXES.iter().any(|d| k.ends_with(d))
        || PII_DENY_EXACT.contains(&k)
}

/// L2: is this key shaped like PII or a credential?
pub fn is_pii_key(key: &str) -> bool {
    with_normalized(key, is_pii_normalized)
}

/// Bytes at least one of which (ASCII case aside) every [`SECRET_MARKERS`] entry contains: a text
/// without any of them holds no marker, and the automaton need not run (a test holds the list to
/// the markers).
const MARKER_TRIGGERS: &[u8] = b"_- kK";

/// L4: does the text contain, anywhere, a Luhn-valid card number (digits optionally separated by
/// single spaces or dashes), an e-mail address, a JWT or a well-known secret?
///
/// One pass first counts what each detector needs at the least — 13 digits for a card, an `@`
/// for an e-mail address, two dots for a JWT, a `MARKER_TRIGGERS` byte for a secret — and only
/// the detectors that could match run: most captured values and keys (`EUR`, `4900`,
/// `currency`) need none of them.
pub fn contains_sensitive(text: &str) -> bool {
    let (mut digits, mut dots, mut at, mut trigger) = (0usize, 0usize, false, false);
    for &b in text.as_bytes() {
        digits += usize::from(b.is_ascii_digit());
        dots += usize::from(b == b'.');
        at |= b == b'@';
        trigger |= MARKER_TRIGGERS.contains(&b);
    }
    (digits >= CARD_MIN_DIGITS && contains_card_number(text))
        || (at && contains_email(text))
        || (dots >= 2 && contains_jwt(text))
        || (trigger && contains_secret_marker(text))
}

static SECRET_MARKERS_AC: OnceLock<Option<AhoCorasick>> = OnceLock::new();

/// The markers are lower-case ASCII, so an ASCII-case-insensitive match over the text is exactly
/// "the ASCII-lower-cased text contains a marker", without building the lower-cased copy.
fn contains_secret_marker(text: &str) -> bool {
    match automaton(&SECRET_MARKERS_AC, SECRET_MARKERS, true) {
        Some(ac) => ac.is_match(text),
        None => {
            let lower = text.to_ascii_lowercase();
            SECRET_MARKERS.iter().any(|m| lower.contains(m))
        }
    }
}

/// Shortest and longest primary account numbers (ISO/IEC 7812).
const CARD_MIN_DIGITS: usize = 13;
const CARD_MAX_DIGITS: usize = 19;

fn luhn_valid(digits: &[u8]) -> bool {
    let mut sum = 0u32;
    for (i, d) in digits.iter().rev().enumerate() {
        let mut v = u32::from(*d);
        if i % 2 == 1 {
            v *= 2;
            if v > 9 {
                v -= 9;
            }
        }
        sum += v;
    }
    sum.is_multiple_of(10)
}

/// Runs of digits joined by at most one space or dash are one candidate; every window of 13–19
/// digits inside a run is checked, so a card glued to other digits is still found.
fn contains_card_number(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut run: Vec<u8> = Vec::new();
    let mut i = 0;
    let check = |run: &[u8]| -> bool {
        if run.len() < CARD_MIN_DIGITS {
            return false;
        }
        (CARD_MIN_DIGITS..=CARD_MAX_DIGITS).any(|w| run.windows(w).any(luhn_valid))
    };
    while i < bytes.len() {
        let b = bytes[i];
        if b.is_ascii_digit() {
            run.push(b - b'0');
        } else if (b == b' ' || b == b'-')
            && !run.is_empty()
            && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)
        {
            // A single separator inside a run keeps the run going.
        } else {
            if check(&run) {
                return true;
            }
            run.clear();
        }
        i += 1;
    }
    check(&run)
}

fn is_email_local(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._%+-!#$&'*/=?^`{|}~".contains(&b)
}

fn is_domain_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b >= 0x80
}

/// `local@label.label`: at least one local-part character before the `@`, and a domain with at
/// least one dot and a non-empty label after it. Erring on the side of removal.
fn contains_email(text: &str) -> bool {
    let bytes = text.as_bytes();
    for (at, _) in bytes.iter().enumerate().filter(|(_, b)| **b == b'@') {
        let has_local = at > 0 && (is_email_local(bytes[at - 1]) || bytes[at - 1] >= 0x80);
        if !has_local {
            continue;
        }
        let mut j = at + 1;
        let mut label_len = 0usize;
        let mut dots_with_label = 0usize;
        while j < bytes.len() {
            let b = bytes[j];
            if is_domain_char(b) {
                // A label after a dot that followed a label: an address, whatever comes next
                // (a full stop ends many a sentence that names one).
                if dots_with_label > 0 {
                    return true;
                }
                label_len += 1;
            } else if b == b'.' && label_len > 0 {
                dots_with_label += 1;
                label_len = 0;
            } else {
                break;
            }
            j += 1;
        }
    }
    false
}

fn is_b64url(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// Minimum segment length for a JWT-shaped token that does not start with the usual `eyJ`.
const JWT_SEGMENT_MIN: usize = 10;

/// Three base64url segments joined by dots: either the first starts with `eyJ` (base64 of `{"`,
/// how every JSON header begins), or all three are long.
fn contains_jwt(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if !is_b64url(bytes[i]) || (i > 0 && is_b64url(bytes[i - 1])) {
            i += 1;
            continue;
        }
        // Measure up to three dot-separated segments starting at i.
        let mut seg_lens = [0usize; 3];
        let mut seg = 0;
        let mut j = i;
        while j < bytes.len() && seg < 3 {
            if is_b64url(bytes[j]) {
                seg_lens[seg] += 1;
            } else if bytes[j] == b'.' && seg_lens[seg] > 0 && seg < 2 {
                seg += 1;
            } else {
                break;
            }
            j += 1;
        }
        if seg == 2 && seg_lens[1] > 0 {
            let starts_eyj = bytes[i..].starts_with(b"eyJ") && seg_lens[0] > 3;
            let all_long = seg_lens.iter().all(|l| *l >= JWT_SEGMENT_MIN);
            if starts_eyj || all_long {
                return true;
            }
        }
        i += 1;
    }
    false
}

/// A borrowed scalar argument value, as the observer's peek sees it: no `serde_json::Value` of
/// the message is ever built.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar<'a> {
    Str(&'a str),
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
}

impl Scalar<'_> {
    /// The JSON value, if it passes the scalar rules (length cap, L4 scrubber).
    fn admit(self) -> Option<Value> {
        match self {
            Scalar::Str(s) => text_passes(s).then(|| Value::String(s.to_string())),
            Scalar::Bool(b) => Some(Value::Bool(b)),
            Scalar::I64(n) => number_admit(Number::from(n)),
            Scalar::U64(n) => number_admit(Number::from(n)),
            Scalar::F64(f) => Number::from_f64(f).and_then(number_admit),
        }
    }
}

/// The rule for a string value: within the length cap and clear of L4.
fn text_passes(s: &str) -> bool {
    s.len() <= MAX_VALUE_LEN && !contains_sensitive(s)
}

/// A number is scrubbed through its decimal text: a 16-digit Luhn-valid integer is a card.
fn number_admit(n: Number) -> Option<Value> {
    number_passes(&n).then_some(Value::Number(n))
}

/// The text of a number, written on the stack: every captured number is scrubbed through it,
/// twice per event. A text that does not fit (none does: integers take at most 20 bytes, floats
/// about 25) falls back to an allocated one.
struct NumText {
    buf: [u8; 48],
    len: usize,
}

impl std::fmt::Write for NumText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let dst = self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

fn number_passes(n: &Number) -> bool {
    use std::fmt::Write as _;
    let mut t = NumText {
        buf: [0; 48],
        len: 0,
    };
    if write!(t, "{n}").is_ok() {
        if let Ok(s) = std::str::from_utf8(&t.buf[..t.len]) {
            return !contains_sensitive(s);
        }
    }
    !contains_sensitive(&n.to_string())
}

/// L2 + L4 + scalar and length rules on one field, without the allow-set: what the L3 filter
/// (sensor and ingest alike) re-applies to every entry of `rec.fields`.
pub fn scrub_field(key: &str, value: &Value) -> Option<Value> {
    field_passes(key, value).then(|| value.clone())
}

/// Would [`scrub_field`] keep this field? (It keeps a field exactly as it came, so the sensor's
/// L3 filter decides in place, without a copy.)
pub fn field_passes(key: &str, value: &Value) -> bool {
    if key.is_empty() || key.len() > MAX_KEY_LEN || is_pii_key(key) || contains_sensitive(key) {
        return false;
    }
    if key.chars().any(char::is_control) {
        return false;
    }
    match value {
        Value::String(s) => text_passes(s),
        Value::Bool(_) => true,
        Value::Number(n) => number_passes(n),
        Value::Null | Value::Array(_) | Value::Object(_) => false,
    }
}

/// The sensor's capture decision: the built-in allow-set plus `--capture`, under L2 and L4.
#[derive(Debug, Clone)]
pub struct CapturePolicy {
    /// Normalised allowed keys (built-in set first, then `--capture`), without those L2 denies:
    /// L2 depends on the normalised key alone, so a denied entry could never match.
    allowed: Vec<String>,
}

impl CapturePolicy {
    /// `extra` are the `--capture` keys; they are normalised like every other key. A `--capture`
    /// key on the denylist is accepted here but never matches (L2 wins).
    pub fn new(extra: &[String]) -> Self {
        let mut allowed: Vec<String> = BUILTIN_CAPTURE.iter().map(|s| s.to_string()).collect();
        for e in extra {
            let n = normalize_key(e);
            if !n.is_empty() && !allowed.contains(&n) {
                allowed.push(n);
            }
        }
        allowed.retain(|k| !is_pii_normalized(k));
        CapturePolicy { allowed }
    }

    /// Is the key on the allow-set and off the denylist? The allow-set is asked first: most keys
    /// are not on it, and it is one normalisation instead of the L2 and L4 scans.
    pub fn allows_key(&self, key: &str) -> bool {
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return false;
        }
        with_normalized(key, |n| self.allowed.iter().any(|a| a == n)) && !contains_sensitive(key)
    }

    /// The value to capture for a top-level argument, or `None`.
    pub fn capture(&self, key: &str, value: Scalar<'_>) -> Option<Value> {
        if !self.allows_key(key) {
            return None;
        }
        value.admit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The automata must answer exactly what one `contains` per pattern answered.
    fn plain_pii_substring(k: &str) -> bool {
        PII_DENY_SUBSTRINGS.iter().any(|d| k.contains(d))
    }

    fn plain_secret_marker(text: &str) -> bool {
        let lower = text.to_ascii_lowercase();
        SECRET_MARKERS.iter().any(|m| lower.contains(m))
    }

    #[test]
    fn automata_agree_with_plain_substring_search() {
        let mut samples: Vec<String> = vec![
            String::new(),
            "SK_LIVE_abc".into(),
            "Bearer x".into(),
            "-----BEGIN RSA".into(),
            "akIA123".into(),
            "xoxb".into(),
            "whsec".into(),
            "plain text".into(),
            "İstanbul ghp_x".into(),
            "ǅemail".into(),
        ];
        for p in PII_DENY_SUBSTRINGS.iter().chain(SECRET_MARKERS) {
            samples.push((*p).to_string());
            samples.push(format!("x{p}y"));
            samples.push(p.to_ascii_uppercase());
            samples.push(p[..p.len() - 1].to_string());
        }
        for s in &samples {
            let k = normalize_key(s);
            assert_eq!(
                contains_any(&PII_DENY_AC, PII_DENY_SUBSTRINGS, &k),
                plain_pii_substring(&k),
                "{k}"
            );
            assert_eq!(contains_secret_marker(s), plain_secret_marker(s), "{s}");
        }
    }

    mod generated {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn prechecked_scan_agrees_with_every_detector(s in "([0-9]{1,5}|[ .@_kK-]|eyJ|sk_live_|\\PC){0,24}") {
                let full = contains_card_number(&s) || contains_email(&s) || contains_jwt(&s)
                    || contains_secret_marker(&s);
                prop_assert_eq!(contains_sensitive(&s), full);
                prop_assert_eq!(is_pii_key(&s), is_pii_normalized(&normalize_key(&s)));
            }

            #[test]
            fn stack_number_text_agrees_with_to_string(i in any::<i64>(), u in any::<u64>(), f in any::<f64>()) {
                for n in [Number::from(i), Number::from(u)].into_iter().chain(Number::from_f64(f)) {
                    prop_assert_eq!(number_passes(&n), !contains_sensitive(&n.to_string()));
                }
            }

            #[test]
            fn allow_set_first_decides_like_the_denylist_first(k in "([a-z_]{0,6}|amount|Currency|email|sk_live_|4111111111111111|[-@. ]){0,4}") {
                let p = CapturePolicy::new(&["sku".into(), "customer_email".into(), "4111111111111111".into()]);
                let mut unfiltered: Vec<String> = BUILTIN_CAPTURE.iter().map(|s| s.to_string()).collect();
                unfiltered.extend(["sku".to_string(), "customeremail".to_string(), "4111111111111111".to_string()]);
                let old = !(k.is_empty() || k.len() > MAX_KEY_LEN || is_pii_key(&k) || contains_sensitive(&k))
                    && unfiltered.contains(&normalize_key(&k));
                prop_assert_eq!(p.allows_key(&k), old);
            }

            #[test]
            fn ascii_fast_path_normalises_like_unicode(s in "[ -~]{0,80}") {
                let slow: String = s.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect();
                prop_assert_eq!(normalize_key(&s), slow);
            }

            #[test]
            fn automata_agree_on_arbitrary_text(s in "(\\PC|sk_live_|BEARER |email|Card|token|ghp_){0,12}") {
                let k = normalize_key(&s);
                prop_assert_eq!(contains_any(&PII_DENY_AC, PII_DENY_SUBSTRINGS, &k), plain_pii_substring(&k));
                prop_assert_eq!(contains_secret_marker(&s), plain_secret_marker(&s));
            }
        }
    }

    #[test]
    fn every_secret_marker_holds_a_trigger_byte() {
        for m in SECRET_MARKERS {
            assert!(
                m.bytes().any(|b| MARKER_TRIGGERS.contains(&b)),
                "{m} has no trigger byte: contains_sensitive would skip it"
            );
        }
    }

    #[test]
    fn prechecks_do_not_hide_any_detector() {
        for s in [
            "4111111111111111",
            "4111 1111 1111 1111",
            "jane@example.com",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "AKIA1234",
            "xoxb-1",
            "Bearer x",
            "basic x",
            "-----BEGIN KEY",
            "github_pat_1",
        ] {
            assert!(contains_sensitive(s), "{s}");
        }
    }

    #[test]
    fn builtin_allow_set_survives_the_denylist() {
        for k in BUILTIN_CAPTURE {
            assert!(!is_pii_key(k), "built-in key {k} is denied by L2");
            assert_eq!(normalize_key(k), *k, "built-in key {k} must be normalised");
        }
    }

    #[test]
    fn pii_shaped_keys_are_denied_in_any_spelling() {
        for k in [
            "customer_email",
            "customerEmail",
            "E-Mail",
            "billingAddress",
            "card_number",
            "cardNumber",
            "CVV",
            "ssn",
            "api_key",
            "apiKey",
            "Authorization",
            "session_id",
            "first_name",
            "zip",
            "postalCode",
            "date_of_birth",
            "iban",
            "account_number",
            "passport_no",
            "client_ip",
            "ip",
            "password",
            "refresh_token",
            "client_secret",
            "phone",
            "cookie",
        ] {
            assert!(is_pii_key(k), "{k} must be denied");
        }
        for k in [
            "amount_cents",
            "currency",
            "reason",
            "status",
            "description",
        ] {
            assert!(!is_pii_key(k), "{k} must not be denied");
        }
    }

    #[test]
    fn denylist_overrides_capture_flag() {
        let p = CapturePolicy::new(&["customer_email".into(), "sku".into()]);
        assert!(!p.allows_key("customer_email"));
        assert!(p.allows_key("sku"));
        assert!(p.allows_key("SKU"));
        assert_eq!(p.capture("customer_email", Scalar::Str("x")), None);
    }

    #[test]
    fn amount_is_captured_and_unknown_keys_are_not() {
        let p = CapturePolicy::new(&[]);
        assert_eq!(
            p.capture("amount_cents", Scalar::U64(4900)),
            Some(json!(4900))
        );
        assert_eq!(p.capture("amountCents", Scalar::I64(-1)), Some(json!(-1)));
        assert_eq!(
            p.capture("currency", Scalar::Str("EUR")),
            Some(json!("EUR"))
        );
        assert_eq!(p.capture("dry_run", Scalar::Bool(true)), Some(json!(true)));
        assert_eq!(p.capture("note", Scalar::Str("hello")), None);
    }

    #[test]
    fn luhn_card_numbers_are_found_with_separators() {
        for s in [
            "4111111111111111",
            "4111 1111 1111 1111",
            "4111-1111-1111-1111",
            "paid with 5500 0000 0000 0004 yesterday",
            "x378282246310005y",
            "ref 94111111111111111",
        ] {
            assert!(contains_card_number(s), "{s}");
        }
        // Not Luhn-valid, or too short.
        for s in ["4111 1111 1111", "1234 5678", "order 12345", "2026-11-29"] {
            assert!(!contains_card_number(s), "{s}");
        }
    }

    #[test]
    fn emails_are_found_anywhere() {
        for s in [
            "jane@example.com",
            "refund for jane@example.com please",
            "<a.b+c@sub.example.co.uk>",
        ] {
            assert!(contains_email(s), "{s}");
        }
        for s in [
            "@handle",
            "a@b",
            "price @ 5",
            "user@localhost",
            "a@b.",
            "a@b..c",
        ] {
            assert!(!contains_email(s), "{s}");
        }
    }

    /// Found by the `privacy` fuzz target: an address followed by a dot (the end of a
    /// sentence) was not seen, so `reason: "refund for jane@example.com."` was captured.
    #[test]
    fn an_email_followed_by_a_full_stop_is_found() {
        for s in [
            "xt@5bevtbbw.c.1h..",
            "refund for jane@example.com.",
            "jane@example.com. Thanks",
            "mail jane@example.co.uk...",
        ] {
            assert!(contains_email(s), "{s}");
            assert!(contains_sensitive(s), "{s}");
            assert_eq!(scrub_field("reason", &Value::String(s.into())), None, "{s}");
        }
    }

    #[test]
    fn jwts_are_found_anywhere() {
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
        assert!(contains_jwt(jwt));
        assert!(contains_jwt(&format!("Bearer token={jwt};")));
        assert!(!contains_jwt("v1.2.3"));
        assert!(!contains_jwt("example.com"));
    }

    #[test]
    fn sensitive_values_under_allowed_keys_are_removed() {
        let p = CapturePolicy::new(&[]);
        assert_eq!(
            p.capture("reason", Scalar::Str("refund for jane@example.com")),
            None
        );
        assert_eq!(p.capture("reason", Scalar::Str("sk_live_abc123")), None);
        assert_eq!(p.capture("amount", Scalar::U64(4111111111111111)), None);
        assert_eq!(
            p.capture("reason", Scalar::Str("duplicate charge")),
            Some(json!("duplicate charge"))
        );
    }

    #[test]
    fn long_strings_are_dropped_not_truncated() {
        let p = CapturePolicy::new(&[]);
        let long = "a".repeat(MAX_VALUE_LEN + 1);
        assert_eq!(p.capture("reason", Scalar::Str(&long)), None);
        let ok = "a".repeat(MAX_VALUE_LEN);
        assert!(p.capture("reason", Scalar::Str(&ok)).is_some());
    }

    #[test]
    fn scrub_field_keeps_only_safe_scalars() {
        assert_eq!(scrub_field("amount", &json!(5)), Some(json!(5)));
        assert_eq!(scrub_field("sku", &json!("A-1")), Some(json!("A-1")));
        assert_eq!(scrub_field("sku", &json!(["A-1"])), None);
        assert_eq!(scrub_field("sku", &json!({"a": 1})), None);
        assert_eq!(scrub_field("sku", &json!(null)), None);
        assert_eq!(scrub_field("email", &json!("x")), None);
        assert_eq!(scrub_field("jane@example.com", &json!(1)), None);
        assert_eq!(scrub_field("", &json!(1)), None);
    }
}

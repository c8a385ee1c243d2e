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
//!
//! A thread recalls the verdicts of its last few scans of short strings (keys and metadata
//! repeat on every call of a session): a recalled verdict is the scan's own for the exact same
//! string, never a guess from a similar one. A [`CapturePolicy`] likewise remembers what it
//! ruled of its last keys (allowed or not, prose or codes): the rule of the exact same key,
//! while every value is still judged on its own.

use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, AhoCorasickKind, MatchKind};
use serde_json::{Number, Value};

use super::SharedStr;
use crate::token::is_b64url;

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
    build_once(cell, patterns, ascii_ci, MatchKind::Standard)
}

/// Builds an automaton into `cell` the first time it is asked for. A contiguous NFA, not the
/// DFA the builder picks by default for lists this short: every process builds its automata
/// anew, on the observer's thread while a short session's server is starting, and the DFAs'
/// construction was a third of that thread's CPU in a one-shot session (the key deny list's
/// 179 µs against 66). A search of a text never seen before costs about twice as much (215
/// against 108 ns for 49 bytes); the sensor searches keys, metadata and captured values of at
/// most 512 bytes, and the first two repeat from call to call and go through the thread's
/// `recall`. Either kind searches in time linear in the text, the ingest's longer untrusted
/// strings included (`bench/README.md`, "Automata built for every process"). `patterns` is
/// only read on that first time, so a list assembled from others costs nothing afterwards.
fn build_once<P: AsRef<[u8]>>(
    cell: &'static OnceLock<Option<AhoCorasick>>,
    patterns: impl IntoIterator<Item = P>,
    ascii_ci: bool,
    match_kind: MatchKind,
) -> Option<&'static AhoCorasick> {
    cell.get_or_init(|| {
        AhoCorasickBuilder::new()
            .ascii_case_insensitive(ascii_ci)
            .kind(Some(AhoCorasickKind::ContiguousNFA))
            .match_kind(match_kind)
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
        if let Some(k) = crate::text::utf8(&buf[..n]) {
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

/// Is this key refused whatever its value: shaped like PII (L2), holding a value L4 removes, or
/// holding a control character?
pub(crate) fn key_denied(key: &str) -> bool {
    is_pii_key(key) || contains_sensitive(key) || key.chars().any(char::is_control)
}

/// [`key_denied`] through the thread's [`recall`]: keys repeat on every call of a tool, and the
/// L3 filter asks about each captured key of every event.
pub(crate) fn key_denied_recalled(key: &str) -> bool {
    recall(Scan::DeniedKey, key, key_denied)
}

/// [`contains_sensitive`] through the thread's [`recall`], for what repeats from call to call:
/// argument keys, and an event's metadata (host, path, tool name, session id, protocol,
/// client, tool hash), where a hex id or hash runs the card, IBAN and contextual detectors
/// and a key with `_` the secret-marker automaton each time.
pub(crate) fn contains_sensitive_recalled(text: &str) -> bool {
    recall(Scan::Sensitive, text, contains_sensitive)
}

/// Which scan a recalled verdict is of.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scan {
    Sensitive,
    DeniedKey,
}

/// Verdicts a thread keeps: enough for an event's metadata and its captured keys.
pub(crate) const RECALL_SLOTS: usize = 32;
/// Longer strings are scanned every time: keys and metadata are short.
const RECALL_MAX_LEN: usize = 128;

/// The last `N` answers about short strings, each beside the exact string it is about, filled
/// and then replaced round-robin. Asked in the same order every time (an event's strings, a
/// tool's argument keys), so the slot after the last hit is looked at first, then all of them.
/// The thread's scan verdicts ([`recall`]), a policy's key rules ([`CapturePolicy`]) and the
/// observer's tool names (`observe::assemble::ToolNames`) keep one each. A hit needs the exact
/// same string, never a similar one.
#[derive(Debug, Clone)]
pub(crate) struct Memo<T, const N: usize> {
    /// Shared, so that what is kept can hand out the string without copying it (a captured
    /// key, a tool name).
    slots: Vec<(SharedStr, T)>,
    /// The slot to replace next, once all are filled.
    next: usize,
    /// Where to look first: the slot after the last one found (may be one past the end, where
    /// `get` misses and the search starts over at the first slot).
    look: usize,
}

impl<T: Clone, const N: usize> Memo<T, N> {
    const fn new() -> Self {
        Memo {
            slots: Vec::new(),
            next: 0,
            look: 0,
        }
    }

    /// The answer kept for exactly `text` that `fits` (the same question).
    pub(crate) fn get(&mut self, text: &str, fits: impl Fn(&T) -> bool) -> Option<T> {
        self.find(text, fits).map(|i| self.slots[i].1.clone())
    }

    /// The slot of [`Self::get`]'s answer.
    fn find(&mut self, text: &str, fits: impl Fn(&T) -> bool) -> Option<usize> {
        let same = |(t, a): &(SharedStr, T)| fits(a) && **t == *text;
        let i = match self.slots.get(self.look) {
            Some(s) if same(s) => self.look,
            _ => self.slots.iter().position(same)?,
        };
        self.look = i + 1;
        Some(i)
    }

    /// Keeps `answer` about `text`, in the slot it returns.
    fn put(&mut self, text: &str, answer: T) -> usize {
        self.put_shared(SharedStr::from(text), answer)
    }

    /// [`Self::put`] with the text already shared.
    pub(crate) fn put_shared(&mut self, text: SharedStr, answer: T) -> usize {
        let entry = (text, answer);
        if self.slots.len() < N {
            self.slots.push(entry);
            self.slots.len() - 1
        } else {
            let i = self.next;
            self.slots[i] = entry;
            self.next = (i + 1) % N;
            i
        }
    }

    /// The text of slot `i`, shared.
    fn text(&self, i: usize) -> &SharedStr {
        &self.slots[i].0
    }
}

impl<T: Clone, const N: usize> Default for Memo<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

thread_local! {
    /// This thread's recent scans: at most 4 KiB of strings it has just scanned, and nothing
    /// else; a hit needs the same scan and the exact same content, so it is the scan's own
    /// verdict.
    static RECALLED: std::cell::RefCell<Memo<(Scan, bool), RECALL_SLOTS>> =
        const { std::cell::RefCell::new(Memo::new()) };
}

/// `scan(text)`, or its verdict from the last [`RECALL_SLOTS`] scans of this thread.
fn recall(kind: Scan, text: &str, scan: fn(&str) -> bool) -> bool {
    if text.len() > RECALL_MAX_LEN {
        return scan(text);
    }
    RECALLED.with(|memo| {
        let memo = &mut *memo.borrow_mut();
        if let Some((_, verdict)) = memo.get(text, |(k, _)| *k == kind) {
            return verdict;
        }
        let verdict = scan(text);
        memo.put(text, (kind, verdict));
        verdict
    })
}

/// Bytes at least one of which (ASCII case aside) every [`SECRET_MARKERS`] entry contains: a text
/// without any of them holds no marker, and the automaton need not run (a test holds the list to
/// the markers).
const MARKER_TRIGGERS: &[u8] = b"_- kK";

/// L4: does the text contain, anywhere, a Luhn-valid card number (digits optionally separated by
/// single spaces or dashes), an e-mail address, a JWT, a well-known secret, a phone number, a US
/// SSN, a public IPv4 or IPv6 address, an IBAN (mod-97), a date of birth next to a birth word or
/// a passport number next to a passport word? (Each detector's rule is on its function.)
///
/// One pass first counts what each detector needs at the least — 13 digits for a card, 9 for a
/// phone or SSN, an `@` for an e-mail address, two dots for a JWT, three dots for an IPv4 and
/// two colons for an IPv6 address, 15 bytes with letters and digits for an IBAN, 4 digits and 3
/// letters for a birth or passport word, a `MARKER_TRIGGERS` byte for a secret — and only the
/// detectors that could match run: most captured values and keys (`EUR`, `4900`, `currency`)
/// need none of them. Names and free-form street addresses have no pattern and are not detected:
/// that is why prose is captured only on request (`--capture-text`).
pub fn contains_sensitive(text: &str) -> bool {
    let (mut digits, mut dots, mut colons, mut alpha) = (0usize, 0usize, 0usize, 0usize);
    let mut seen = 0u8;
    for &b in text.as_bytes() {
        let c = BYTE_CLASS[usize::from(b)];
        digits += usize::from(c & DIGIT);
        dots += usize::from((c & DOT) >> 1);
        colons += usize::from((c & COLON) >> 2);
        alpha += usize::from((c & ALPHA) >> 3);
        seen |= c;
    }
    let (at, trigger, word) = (seen & AT != 0, seen & MARKER != 0, seen & WORD != 0);
    (digits >= CARD_MIN_DIGITS && contains_card_number(text))
        || (at && contains_email(text))
        || (dots >= 2 && contains_jwt(text))
        || (trigger && contains_secret_marker(text))
        || (digits >= PHONE_MIN_DIGITS && contains_phone_or_ssn(text))
        || (dots >= 3 && digits >= 4 && contains_ipv4(text))
        || (colons >= 2 && contains_ipv6(text))
        || (text.len() >= IBAN_MIN_LEN && digits >= 2 && alpha >= 2 && contains_iban(text))
        || (word && digits >= 4 && alpha >= 3 && contains_contextual(text))
}

/// Classes of a byte for the pre-check pass of [`contains_sensitive`]: one table look-up per byte
/// instead of a comparison per class.
const DIGIT: u8 = 1;
const DOT: u8 = 2;
const COLON: u8 = 4;
const ALPHA: u8 = 8;
const AT: u8 = 16;
const MARKER: u8 = 32;
const WORD: u8 = 64;

static BYTE_CLASS: [u8; 256] = byte_classes();

const fn byte_classes() -> [u8; 256] {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        let mut c = 0;
        if b.is_ascii_digit() {
            c |= DIGIT;
        }
        if b == b'.' {
            c |= DOT;
        }
        if b == b':' {
            c |= COLON;
        }
        if b.is_ascii_alphabetic() {
            c |= ALPHA;
        }
        if b == b'@' {
            c |= AT;
        }
        let mut m = 0;
        while m < MARKER_TRIGGERS.len() {
            if MARKER_TRIGGERS[m] == b {
                c |= MARKER;
            }
            m += 1;
        }
        let mut w = 0;
        while w < CONTEXT_TRIGGERS.len() {
            if CONTEXT_TRIGGERS[w] == b.to_ascii_lowercase() {
                c |= WORD;
            }
            w += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

/// Lower-case bytes at least one of which every [`BIRTH_WORDS`] and [`PASSPORT_WORDS`] entry
/// contains (a test holds the lists to it): hex ids and hashes have none, and skip the search.
const CONTEXT_TRIGGERS: &[u8] = b"gnorst";

/// Fewest and most digits of a phone number (E.164 allows 15; national numbers without the
/// trunk prefix have at least 9 in the countries we check).
const PHONE_MIN_DIGITS: usize = 9;
const PHONE_MAX_DIGITS: usize = 15;

/// Separators allowed between the digit groups of a phone number or an SSN.
fn is_phone_sep(b: u8) -> bool {
    matches!(b, b' ' | b'-' | b'.' | b'/' | b'(' | b')')
}

/// A byte that glues a digit run to a longer token (`ord_123456789`, `v1.2.3`, a hex hash):
/// such a run is an identifier, not a phone number.
fn glues(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Is `b[i..]` a numeric date `YYYY-MM-DD`, `DD.MM.YYYY` or `DD/MM/YYYY` (same separator
/// twice)? A date followed by a time (`2026-11-29 19:13`) must not be read as a phone number.
fn starts_with_date(b: &[u8]) -> bool {
    let d = |r: std::ops::Range<usize>| b.get(r).is_some_and(|x| x.iter().all(u8::is_ascii_digit));
    let sep = |i: usize| {
        b.get(i)
            .copied()
            .filter(|c| matches!(c, b'-' | b'.' | b'/'))
    };
    (d(0..4) && d(5..7) && d(8..10) && sep(4).is_some() && sep(4) == sep(7))
        || (d(0..2) && d(3..5) && d(6..10) && sep(2).is_some() && sep(2) == sep(5))
}

/// Phone numbers and US SSNs, from one scan of digit groups.
///
/// A candidate starts at a digit, `+` or `(` that is not glued to a preceding word, and runs over
/// digits and single [`is_phone_sep`] separators (two for `) `); it must not be glued to a word
/// at its end either. It is an SSN when its groups are 3-2-4 digits with a valid area, group and
/// serial (`078-05-1120`). It is a phone number when it holds 9–15 digits, is not a date, and
/// starts with `+` (E.164), `(` or `0` (a national trunk prefix), or has at least two separators
/// (`415.555.0100`, `020 7946 0958`). A bare digit run not starting with 0 (`1764528000`,
/// an amount in cents) and `1234567.89` are not phone numbers: amounts and epoch times are
/// captured.
fn contains_phone_or_ssn(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let starts = c.is_ascii_digit() || ((c == b'+' || c == b'(') && i + 1 < b.len());
        let glued_before =
            i > 0 && (glues(b[i - 1]) || matches!(b[i - 1], b'-' | b'.' | b'+' | b'#'));
        if !starts || glued_before {
            i += 1;
            continue;
        }
        let start = i;
        let mut j = i + usize::from(!c.is_ascii_digit());
        if c == b'+' && b.get(j) == Some(&b'(') {
            j += 1;
        }
        let (mut digits, mut seps) = (0usize, 0usize);
        let mut groups: [usize; 4] = [0; 4];
        let mut group = 0usize;
        let mut end = j;
        while j < b.len() {
            if b[j].is_ascii_digit() {
                digits += 1;
                if group < groups.len() {
                    groups[group] += 1;
                }
                j += 1;
                end = j;
                continue;
            }
            // One separator, or two (`) `, `- `), but only between digits.
            let mut k = j;
            while k < b.len() && k - j < 2 && is_phone_sep(b[k]) {
                k += 1;
            }
            if k > j && digits > 0 && b.get(k).is_some_and(u8::is_ascii_digit) {
                seps += 1;
                group += 1;
                j = k;
            } else {
                break;
            }
        }
        let glued_after = b.get(end).is_some_and(|&x| glues(x))
            || (b.get(end).is_some_and(|&x| matches!(x, b'-' | b'.' | b'/'))
                && b.get(end + 1).is_some_and(|&x| glues(x)));
        if digits > 0 && !glued_after {
            let ssn = group == 2 && groups[..3] == [3, 2, 4] && ssn_valid(&b[start..end]);
            let shaped = c == b'+' || c == b'(' || c == b'0' || seps >= 2;
            let phone = (PHONE_MIN_DIGITS..=PHONE_MAX_DIGITS).contains(&digits)
                && shaped
                && !starts_with_date(&b[start..end]);
            if ssn || phone {
                return true;
            }
        }
        i = end.max(i + 1);
    }
    false
}

/// Area not 000, 666 or 9xx; group not 00; serial not 0000 (the SSA's rules).
fn ssn_valid(s: &[u8]) -> bool {
    let d: Vec<u8> = s
        .iter()
        .filter(|c| c.is_ascii_digit())
        .map(|c| c - b'0')
        .collect();
    let area = &d[..3];
    area != [0, 0, 0] && area != [6, 6, 6] && area[0] != 9 && d[3..5] != [0, 0] && d[5..] != [0; 4]
}

/// A dotted-quad IPv4 address that is public. Loopback, private (RFC 1918), link-local,
/// unspecified and broadcast addresses name no one on the Internet, and an upstream at
/// `127.0.0.1:8080` is what `dest.host` holds in HTTP mode: those are not removed.
fn contains_ipv4(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() || (i > 0 && (glues(b[i - 1]) || b[i - 1] == b'.')) {
            i += 1;
            continue;
        }
        let mut octets = [0u32; 4];
        let mut j = i;
        let mut ok = true;
        for (n, o) in octets.iter_mut().enumerate() {
            let s = j;
            while j < b.len() && b[j].is_ascii_digit() && j - s < 4 {
                *o = *o * 10 + u32::from(b[j] - b'0');
                j += 1;
            }
            if j == s || j - s > 3 || *o > 255 {
                ok = false;
                break;
            }
            if n < 3 {
                if b.get(j) != Some(&b'.') {
                    ok = false;
                    break;
                }
                j += 1;
            }
        }
        let glued_after = b.get(j).is_some_and(|&x| glues(x))
            || (b.get(j) == Some(&b'.') && b.get(j + 1).is_some_and(u8::is_ascii_digit));
        if ok && !glued_after && ipv4_public(octets) {
            return true;
        }
        i += 1;
    }
    false
}

fn ipv4_public(o: [u32; 4]) -> bool {
    !(o[0] == 0
        || o[0] == 10
        || o[0] == 127
        || (o[0] == 169 && o[1] == 254)
        || (o[0] == 172 && (16..=31).contains(&o[1]))
        || (o[0] == 192 && o[1] == 168)
        || o == [255, 255, 255, 255])
}

/// An IPv6 address (as `std` parses it) with at least three groups, standing alone, that is
/// not loopback, unspecified, link-local, unique-local or multicast (an IPv4-mapped address
/// follows the IPv4 rule). Three groups at least, so a tool named `db::add` is not an address.
fn contains_ipv6(text: &str) -> bool {
    let b = text.as_bytes();
    let is_v6 = |c: u8| c.is_ascii_hexdigit() || c == b':' || c == b'.';
    let mut i = 0;
    while i < b.len() {
        if !is_v6(b[i]) || (i > 0 && (glues(b[i - 1]) || b[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && is_v6(b[j]) {
            j += 1;
        }
        let mut cand = &text[i..j];
        // A sentence's full stop is not part of the address.
        while let Some(c) = cand.strip_suffix('.') {
            cand = c;
        }
        let glued_after = b.get(j).is_some_and(|&x| glues(x));
        let shaped = cand.contains("::") || cand.matches(':').count() == 7;
        let groups = cand.split(':').filter(|g| !g.is_empty()).count();
        if !glued_after && shaped && groups >= 3 {
            if let Ok(a) = cand.parse::<std::net::Ipv6Addr>() {
                if ipv6_public(&a) {
                    return true;
                }
            }
        }
        i = j.max(i + 1);
    }
    false
}

fn ipv6_public(a: &std::net::Ipv6Addr) -> bool {
    if let Some(v4) = a.to_ipv4_mapped() {
        return ipv4_public(v4.octets().map(u32::from));
    }
    let s0 = a.segments()[0];
    !(a.is_loopback()
        || a.is_unspecified()
        || (s0 & 0xffc0) == 0xfe80
        || (s0 & 0xfe00) == 0xfc00
        || (s0 & 0xff00) == 0xff00)
}

/// Shortest IBAN (Norway).
const IBAN_MIN_LEN: usize = 15;
const IBAN_MAX_LEN: usize = 34;

/// IBAN length per country (the SWIFT IBAN registry). A candidate from a listed country must
/// have exactly that length; one from another country may have any length from 15 to 34 that
/// ends a group.
const IBAN_LENGTHS: &[(&[u8; 2], usize)] = &[
    (b"AD", 24),
    (b"AE", 23),
    (b"AL", 28),
    (b"AT", 20),
    (b"AZ", 28),
    (b"BA", 20),
    (b"BE", 16),
    (b"BG", 22),
    (b"BH", 22),
    (b"BR", 29),
    (b"BY", 28),
    (b"CH", 21),
    (b"CR", 22),
    (b"CY", 28),
    (b"CZ", 24),
    (b"DE", 22),
    (b"DK", 18),
    (b"DO", 28),
    (b"EE", 20),
    (b"EG", 29),
    (b"ES", 24),
    (b"FI", 18),
    (b"FO", 18),
    (b"FR", 27),
    (b"GB", 22),
    (b"GE", 22),
    (b"GI", 23),
    (b"GL", 18),
    (b"GR", 27),
    (b"GT", 28),
    (b"HR", 21),
    (b"HU", 28),
    (b"IE", 22),
    (b"IL", 23),
    (b"IQ", 23),
    (b"IS", 26),
    (b"IT", 27),
    (b"JO", 30),
    (b"KW", 30),
    (b"KZ", 20),
    (b"LB", 28),
    (b"LC", 32),
    (b"LI", 21),
    (b"LT", 20),
    (b"LU", 20),
    (b"LV", 21),
    (b"MC", 27),
    (b"MD", 24),
    (b"ME", 22),
    (b"MK", 19),
    (b"MR", 27),
    (b"MT", 31),
    (b"MU", 30),
    (b"NL", 18),
    (b"NO", 15),
    (b"PK", 24),
    (b"PL", 28),
    (b"PS", 29),
    (b"PT", 25),
    (b"QA", 29),
    (b"RO", 24),
    (b"RS", 22),
    (b"SA", 24),
    (b"SC", 31),
    (b"SE", 24),
    (b"SI", 19),
    (b"SK", 24),
    (b"SM", 27),
    (b"ST", 25),
    (b"SV", 28),
    (b"TL", 23),
    (b"TN", 24),
    (b"TR", 26),
    (b"UA", 29),
    (b"VA", 22),
    (b"VG", 24),
    (b"XK", 20),
];

/// An IBAN of any country: two letters, two check digits and up to 30 letters or digits, written
/// compact or in groups separated by single spaces or dashes, standing alone, whose ISO 13616
/// mod-97 check gives 1. One test per candidate for listed countries keeps chance hits rare.
fn contains_iban(text: &str) -> bool {
    let b = text.as_bytes();
    if b.len() < 4 {
        return false;
    }
    for i in 0..b.len() - 3 {
        let head = b[i].is_ascii_alphabetic()
            && b[i + 1].is_ascii_alphabetic()
            && b[i + 2].is_ascii_digit()
            && b[i + 3].is_ascii_digit()
            && (i == 0 || !glues(b[i - 1]));
        if !head {
            continue;
        }
        let country = [b[i].to_ascii_uppercase(), b[i + 1].to_ascii_uppercase()];
        let want = IBAN_LENGTHS
            .iter()
            .find(|(c, _)| **c == country)
            .map(|(_, n)| *n);
        let mut compact = [0u8; IBAN_MAX_LEN];
        let mut n = 0usize;
        let mut j = i;
        while j < b.len() && n < IBAN_MAX_LEN {
            if b[j].is_ascii_alphanumeric() {
                compact[n] = b[j].to_ascii_uppercase();
                n += 1;
                j += 1;
            } else if matches!(b[j], b' ' | b'-')
                && n > 0
                && b.get(j + 1).is_some_and(u8::is_ascii_alphanumeric)
            {
                // A group ends here: test the candidate so far, then go on.
                if iban_candidate(&compact[..n], want) {
                    return true;
                }
                j += 1;
            } else {
                break;
            }
        }
        let at_end = b.get(j).is_none_or(|&x| !glues(x));
        if at_end && iban_candidate(&compact[..n], want) {
            return true;
        }
    }
    false
}

fn iban_candidate(c: &[u8], want: Option<usize>) -> bool {
    let len_ok = match want {
        Some(w) => c.len() == w,
        None => (IBAN_MIN_LEN..=IBAN_MAX_LEN).contains(&c.len()),
    };
    len_ok && iban_mod97(c)
}

/// ISO 13616: the first four characters moved to the end, letters as 10..35, the number mod 97.
fn iban_mod97(c: &[u8]) -> bool {
    let mut r = 0u32;
    for &x in c[4..].iter().chain(&c[..4]) {
        r = match x {
            b'0'..=b'9' => (r * 10 + u32::from(x - b'0')) % 97,
            b'A'..=b'Z' => (r * 100 + u32::from(x - b'A') + 10) % 97,
            _ => return false,
        };
    }
    r == 1
}

/// Words that make a nearby numeric date a date of birth (English, German, French, Spanish,
/// Italian; ASCII case ignored).
const BIRTH_WORDS: &[&str] = &[
    "birth",
    "born",
    "dob",
    "d.o.b",
    "geboren",
    "geb.",
    "geburt",
    "naissance",
    "née",
    "nacimiento",
    "nacido",
    "nascita",
    "nato il",
];

/// Words that make a nearby code a passport number.
const PASSPORT_WORDS: &[&str] = &[
    "passport",
    "passeport",
    "reisepass",
    "pasaporte",
    "passaporto",
    "paspoort",
];

/// How far from its word a date or code may be, in bytes, to be "next to" it.
const CONTEXT_WINDOW: usize = 32;

static CONTEXT_AC: OnceLock<Option<AhoCorasick>> = OnceLock::new();

/// A date of birth (a numeric date next to a [`BIRTH_WORDS`] word) or a passport number (a code
/// of 6–10 letters and digits with at least 4 digits next to a [`PASSPORT_WORDS`] word). A date
/// alone (`2026-11-29`) and a code alone are captured.
fn contains_contextual(text: &str) -> bool {
    // ASCII case ignored; the matches are asked for one by one, leftmost first.
    let words = BIRTH_WORDS.iter().chain(PASSPORT_WORDS);
    let Some(ac) = build_once(&CONTEXT_AC, words, true, MatchKind::LeftmostFirst) else {
        return false;
    };
    for m in ac.find_iter(text) {
        let lo = m.start().saturating_sub(CONTEXT_WINDOW);
        let hi = (m.end() + CONTEXT_WINDOW).min(text.len());
        let near = |s: usize, e: usize| e > lo && s < hi;
        let found = if m.pattern().as_usize() < BIRTH_WORDS.len() {
            numeric_dates(text).any(|(s, e)| near(s, e))
        } else {
            passport_codes(text).any(|(s, e)| near(s, e))
        };
        if found {
            return true;
        }
    }
    false
}

/// Maximal runs of ASCII letters and digits (the byte ranges), split at anything else.
fn tokens(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let b = text.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < b.len() && !b[i].is_ascii_alphanumeric() {
            i += 1;
        }
        if i >= b.len() {
            return None;
        }
        let s = i;
        while i < b.len() && b[i].is_ascii_alphanumeric() {
            i += 1;
        }
        Some((s, i))
    })
}

/// Numeric dates: `YYYY-MM-DD` (or `/`, `.`), and `D.M.YY`, `DD/MM/YYYY`, `MM-DD-YYYY` and the
/// like (day and month in either order, a 2- or 4-digit year), the same separator twice.
fn numeric_dates(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let b = text.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < b.len() {
            let s = i;
            if !b[s].is_ascii_digit() || (s > 0 && b[s - 1].is_ascii_digit()) {
                i += 1;
                continue;
            }
            let run = |from: usize| b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
            let num = |from: usize, n: usize| {
                b[from..from + n]
                    .iter()
                    .fold(0u32, |a, d| a * 10 + u32::from(d - b'0'))
            };
            let n1 = run(s);
            let sep = b.get(s + n1).copied();
            i = s + n1.max(1);
            let Some(sep) = sep.filter(|c| matches!(c, b'-' | b'/' | b'.')) else {
                continue;
            };
            let p2 = s + n1 + 1;
            let n2 = run(p2);
            if n2 == 0 || n2 > 2 || b.get(p2 + n2) != Some(&sep) {
                continue;
            }
            let p3 = p2 + n2 + 1;
            let n3 = run(p3);
            // No date part has more than 4 digits: a longer run is no date, and must not be
            // read as a number (it would overflow).
            if n1 > 4 || n3 > 4 {
                continue;
            }
            let (a, m, c) = (
                num(s, n1),
                num(p2, n2),
                if n3 > 0 { num(p3, n3) } else { 0 },
            );
            let ok = match (n1, n3) {
                (4, 1..=2) => (1..=12).contains(&m) && (1..=31).contains(&c),
                (1..=2, 2 | 4) => {
                    (1..=31).contains(&a) && (1..=31).contains(&m) && (a <= 12 || m <= 12)
                }
                _ => false,
            };
            if ok {
                i = p3 + n3;
                return Some((s, p3 + n3));
            }
        }
        None
    })
}

/// Passport-like codes: 6–10 letters and digits, at least 4 of them digits.
fn passport_codes(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let b = text.as_bytes();
    tokens(text).filter(move |&(s, e)| {
        (6..=10).contains(&(e - s)) && b[s..e].iter().filter(|c| c.is_ascii_digit()).count() >= 4
    })
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
/// A card is the only L4 kind a JSON number can hold (phone numbers and SSNs need a `+`, a
/// leading 0 or separators, IP addresses more than one dot, the others letters), and the other
/// detectors are not run on it: `1234567.89` is an amount, not a phone number, and
/// `0.27838654985369` a fraction, though its text has a leading 0 and a dot.
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
    // An integer with fewer digits than the shortest card has no card in its text, which then
    // need not be written: most captured numbers (amounts, counts, codes) are such.
    const SHORT: u64 = 10u64.pow(CARD_MIN_DIGITS as u32 - 1);
    // (Every integer below it, of either sign, is an `i64`.)
    if n.as_i64().is_some_and(|i| i.unsigned_abs() < SHORT) {
        return true;
    }
    let mut t = NumText {
        buf: [0; 48],
        len: 0,
    };
    if write!(t, "{n}").is_ok() {
        if let Some(s) = crate::text::utf8(&t.buf[..t.len]) {
            return !number_text_sensitive(s);
        }
    }
    !number_text_sensitive(&n.to_string())
}

/// L4 on a number's decimal text: the card detector (see [`number_admit`]).
fn number_text_sensitive(s: &str) -> bool {
    s.bytes().filter(u8::is_ascii_digit).count() >= CARD_MIN_DIGITS && contains_card_number(s)
}

/// L4 on a number anywhere in an event (`rec.fields`, `err.code`).
pub fn number_is_sensitive(n: &Number) -> bool {
    !number_passes(n)
}

/// L2 + L4 + scalar and length rules on one field, without the allow-set: what the L3 filter
/// (sensor and ingest alike) re-applies to every entry of `rec.fields`.
pub fn scrub_field(key: &str, value: &Value) -> Option<Value> {
    field_passes(key, value).then(|| value.clone())
}

/// Would [`scrub_field`] keep this field? (It keeps a field exactly as it came, so the sensor's
/// L3 filter decides in place, without a copy.)
pub fn field_passes(key: &str, value: &Value) -> bool {
    if key.is_empty() || key.len() > MAX_KEY_LEN || key_denied_recalled(key) {
        return false;
    }
    match value {
        Value::String(s) => text_passes(s),
        Value::Bool(_) => true,
        Value::Number(n) => number_passes(n),
        Value::Null | Value::Array(_) | Value::Object(_) => false,
    }
}

/// Longest string the sensor captures as a code without `--capture-text`.
pub const MAX_CODE_LEN: usize = 64;

/// Punctuation a code may hold besides letters and digits: enough for `requested_by_customer`,
/// `en-GB`, `v1.2`, `tier:gold`, `eu/west`; no space, so no prose.
const CODE_PUNCT: &[u8] = b"_-.:/";

/// Is this string a code (`EUR`, `requested_by_customer`, `damaged`) rather than prose? At most
/// [`MAX_CODE_LEN`] bytes of letters, digits and `_ - . : /`, so no whitespace: a name, a street
/// address or a sentence is never a code. L4 cannot recognise names and addresses, so the
/// sensor captures any other string only under a key opted in with `--capture-text`.
pub fn is_code(s: &str) -> bool {
    s.len() <= MAX_CODE_LEN
        && if s.is_ascii() {
            s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || CODE_PUNCT.contains(&b))
        } else {
            s.chars()
                .all(|c| c.is_alphanumeric() || (c.is_ascii() && CODE_PUNCT.contains(&(c as u8))))
        }
}

/// What the sensor does with one top-level argument: `Kept` holds the value
/// ([`CapturePolicy::decide`]), or the key and the value ([`CapturePolicy::decide_keyed`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Capture<K = Value> {
    /// Captured, as this value.
    Kept(K),
    /// A string under an allowed key that is not a [`is_code`] code, and the key was not opted
    /// into prose: withheld, and counted by the observer.
    Prose,
    /// Not captured: key not allowed, PII-shaped, or the value fails L4 or the scalar rules.
    Dropped,
}

/// The sensor's capture decision: the built-in allow-set plus `--capture` and `--capture-text`,
/// under L2 and L4, and the codes-only rule for strings.
#[derive(Debug, Clone)]
pub struct CapturePolicy {
    /// Normalised allowed keys (built-in set first, then `--capture`), without those L2 denies:
    /// L2 depends on the normalised key alone, so a denied entry could never match.
    allowed: Vec<String>,
    /// Normalised keys whose string values may be prose (`--capture-text`); each is also in
    /// `allowed` unless L2 denies it.
    text: Vec<String>,
    /// The rules of the keys this policy was last asked about.
    rules: Memo<KeyRule, KEY_RULE_SLOTS>,
}

/// What a [`CapturePolicy`] says of a key, whatever its value: the part of a decision that
/// depends on the key alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyRule {
    /// Not on the allow-set, or shaped like PII, or holding a value L4 removes.
    Denied,
    /// Allowed; a string value only if it is a code ([`is_code`]).
    Codes,
    /// Allowed, and a string value may be prose (`--capture-text`).
    Prose,
}

/// Keys whose rule a policy keeps ([`Memo`]): more than a tool has arguments. Every call of a
/// tool brings the same keys in the same order, and ruling on one (normalising it, searching
/// the allow-set of about 80 keys, scanning it for L4) was most of a call's capture decision.
/// At most 64 × [`MAX_KEY_LEN`] bytes of keys.
const KEY_RULE_SLOTS: usize = 64;

impl CapturePolicy {
    /// `extra` are the `--capture` keys; they are normalised like every other key. A `--capture`
    /// key on the denylist is accepted here but never matches (L2 wins).
    pub fn new(extra: &[String]) -> Self {
        Self::with_text(extra, &[])
    }

    /// As [`CapturePolicy::new`], with `text` the `--capture-text` keys: their string values are
    /// captured even when they are not codes (still under the length cap, L2 and L4), and each
    /// is allowed as if given to `--capture`.
    pub fn with_text(extra: &[String], text: &[String]) -> Self {
        let mut allowed: Vec<String> = BUILTIN_CAPTURE.iter().map(|s| s.to_string()).collect();
        let mut prose = Vec::new();
        for (e, is_text) in extra
            .iter()
            .map(|e| (e, false))
            .chain(text.iter().map(|t| (t, true)))
        {
            let n = normalize_key(e);
            if n.is_empty() || is_pii_normalized(&n) {
                continue;
            }
            if is_text && !prose.contains(&n) {
                prose.push(n.clone());
            }
            if !allowed.contains(&n) {
                allowed.push(n);
            }
        }
        allowed.retain(|k| !is_pii_normalized(k));
        CapturePolicy {
            allowed,
            text: prose,
            rules: Default::default(),
        }
    }

    /// Is the key on the allow-set and off the denylist? The allow-set is asked first: most keys
    /// are not on it, and it is one normalisation instead of the L2 and L4 scans.
    pub fn allows_key(&self, key: &str) -> bool {
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return false;
        }
        with_normalized(key, |n| self.allowed.iter().any(|a| a == n))
            && !contains_sensitive_recalled(key)
    }

    /// The value to capture for a top-level argument, or `None`.
    pub fn capture(&mut self, key: &str, value: Scalar<'_>) -> Option<Value> {
        match self.decide(key, value) {
            Capture::Kept(v) => Some(v),
            Capture::Prose | Capture::Dropped => None,
        }
    }

    /// The capture decision for a top-level argument, telling withheld prose apart.
    pub fn decide(&mut self, key: &str, value: Scalar<'_>) -> Capture {
        match self.decide_keyed(key, value) {
            Capture::Kept((_, v)) => Capture::Kept(v),
            Capture::Prose => Capture::Prose,
            Capture::Dropped => Capture::Dropped,
        }
    }

    /// [`Self::decide`], a kept value with its key as a string shared with the policy's memory
    /// of the key's rule: a call's captured keys are the same every time, and sharing them
    /// spares an allocation and a free per key per call.
    pub fn decide_keyed(&mut self, key: &str, value: Scalar<'_>) -> Capture<(SharedStr, Value)> {
        let Some(slot) = self.key_rule(key) else {
            return Capture::Dropped;
        };
        match self.rules.slots[slot].1 {
            KeyRule::Denied => return Capture::Dropped,
            KeyRule::Codes => {
                if matches!(value, Scalar::Str(s) if !is_code(s)) {
                    return Capture::Prose;
                }
            }
            KeyRule::Prose => {}
        }
        match value.admit() {
            Some(v) => Capture::Kept((self.rules.text(slot).clone(), v)),
            None => Capture::Dropped,
        }
    }

    /// The slot of [`Self::rules`] that holds the key's rule, remembered or worked out; `None`
    /// for a key denied by its length alone.
    fn key_rule(&mut self, key: &str) -> Option<usize> {
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return None;
        }
        if let Some(slot) = self.rules.find(key, |_| true) {
            return Some(slot);
        }
        let rule = self.rule_of(key);
        Some(self.rules.put(key, rule))
    }

    fn rule_of(&self, key: &str) -> KeyRule {
        if !self.allows_key(key) {
            KeyRule::Denied
        } else if with_normalized(key, |n| self.text.iter().any(|t| t == n)) {
            KeyRule::Prose
        } else {
            KeyRule::Codes
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A kept value's key is the key asked about, shared with the policy's memory of its rule
    /// while that memory holds it; a refused or withheld one has none.
    #[test]
    fn a_kept_value_comes_with_its_key_shared() {
        let mut p = CapturePolicy::with_text(&[], &[]);
        let kept = |c: Capture<(SharedStr, Value)>| match c {
            Capture::Kept(kv) => kv,
            other => panic!("not kept: {other:?}"),
        };
        let (k1, v) = kept(p.decide_keyed("amount_cents", Scalar::U64(4900)));
        assert_eq!((k1.as_str(), v), ("amount_cents", json!(4900)));
        let (k2, _) = kept(p.decide_keyed("amount_cents", Scalar::U64(1)));
        assert!(k1.same(&k2), "one allocation for the key");
        assert_eq!(
            p.decide_keyed("customer_email", Scalar::U64(1)),
            Capture::Dropped
        );
        assert_eq!(
            p.decide_keyed("reason", Scalar::Str("a sentence")),
            Capture::Prose
        );
        assert_eq!(p.decide_keyed("", Scalar::U64(1)), Capture::Dropped);
        for i in 0..(2 * KEY_RULE_SLOTS) {
            p.decide_keyed(&format!("quantity_{i}"), Scalar::U64(1));
        }
        let (k3, _) = kept(p.decide_keyed("amount_cents", Scalar::U64(2)));
        assert_eq!(k3, "amount_cents");
        assert!(!k1.same(&k3), "rebuilt after the memory moved on");
    }

    /// The automata must answer exactly what one `contains` per pattern answered.
    fn plain_pii_substring(k: &str) -> bool {
        PII_DENY_SUBSTRINGS.iter().any(|d| k.contains(d))
    }

    fn plain_secret_marker(text: &str) -> bool {
        let lower = text.to_ascii_lowercase();
        SECRET_MARKERS.iter().any(|m| lower.contains(m))
    }

    /// Keys repeat on every call, and the recalled verdicts must never let a guilty key through
    /// on an innocent one's: each canary key is refused every time, between innocent keys, and
    /// after more distinct keys than the recall holds have pushed it out.
    #[test]
    fn canary_keys_are_refused_every_time_despite_the_recall() {
        let canaries = [
            "customer_email",
            "billingAddress",
            "card_number",
            "sk_live_51Hq0CanaryCanary",
            "jane.doe@example.com",
        ];
        let v = json!(4900);
        for round in 0..3 {
            for c in canaries {
                assert!(field_passes("amount_cents", &v));
                assert!(!field_passes(c, &v), "round {round}: {c}");
            }
            for i in 0..(2 * RECALL_SLOTS) {
                assert!(field_passes(&format!("quantity_{i}"), &v));
            }
        }
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
            fn prechecked_scan_agrees_with_every_detector(s in "([0-9]{1,5}|[ .@_kK:/()+-]|eyJ|sk_live_|GB82|born|dob |passport |[A-F]{1,3}|\\PC){0,24}") {
                let full = contains_card_number(&s) || contains_email(&s) || contains_jwt(&s)
                    || contains_secret_marker(&s) || contains_phone_or_ssn(&s) || contains_ipv4(&s)
                    || contains_ipv6(&s) || contains_iban(&s) || contains_contextual(&s);
                prop_assert_eq!(contains_sensitive(&s), full);
                prop_assert_eq!(is_pii_key(&s), is_pii_normalized(&normalize_key(&s)));
            }

            #[test]
            fn stack_number_text_agrees_with_to_string(i in any::<i64>(), u in any::<u64>(), f in any::<f64>(), near in 999_999_900_000i64..1_000_000_100_000) {
                // `near`, either sign: integers on both sides of the shortest card's length,
                // where `number_passes` stops answering without the text.
                let ints = [Number::from(i), Number::from(u), Number::from(near), Number::from(-near)];
                for n in ints.into_iter().chain(Number::from_f64(f)) {
                    prop_assert_eq!(number_passes(&n), !number_text_sensitive(&n.to_string()));
                    // A number's text can only hold a card: the other detectors agree.
                    prop_assert_eq!(contains_sensitive(&n.to_string()), number_text_sensitive(&n.to_string()) || contains_contextual(&n.to_string()));
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

            /// A remembered key rule decides like a policy that has never seen the key, for
            /// every value, in any order of keys, past the number of keys it remembers.
            #[test]
            fn remembered_key_rules_decide_like_a_fresh_policy(calls in proptest::collection::vec(("(amount_cents|currency|reason|note|sku|customer_email|card_number|sk_live_x|k[0-9]{1,2})", "(EUR|4111 1111 1111 1111|jane@example.com|on hold|[a-z]{1,6}|\\PC{0,3})"), 0..200)) {
                let build = || CapturePolicy::with_text(&["sku".into(), "k7".into()], &["note".into()]);
                let mut remembering = build();
                for (k, v) in &calls {
                    prop_assert_eq!(remembering.decide(k, Scalar::Str(v)), build().decide(k, Scalar::Str(v)), "{} {}", k, v);
                }
            }

            #[test]
            fn no_string_captured_without_capture_text_holds_whitespace(k in "(reason|status|currency|sku|note)", v in "(\\PC|[ \t\n\u{a0}\u{2003}]|[a-z0-9_.:/-]{1,8}){0,20}") {
                let mut p = CapturePolicy::new(&["sku".into()]);
                if let Some(Value::String(got)) = p.capture(&k, Scalar::Str(&v)) {
                    prop_assert!(!got.chars().any(char::is_whitespace), "{got:?}");
                    prop_assert!(got.len() <= MAX_CODE_LEN);
                }
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
    fn every_context_word_holds_a_trigger_byte() {
        for w in BIRTH_WORDS.iter().chain(PASSPORT_WORDS) {
            assert!(
                w.bytes()
                    .any(|b| CONTEXT_TRIGGERS.contains(&b.to_ascii_lowercase())),
                "{w} has no trigger byte: contains_sensitive would skip it"
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
        let mut p = CapturePolicy::new(&["customer_email".into(), "sku".into()]);
        assert!(!p.allows_key("customer_email"));
        assert!(p.allows_key("sku"));
        assert!(p.allows_key("SKU"));
        assert_eq!(p.capture("customer_email", Scalar::Str("x")), None);
    }

    #[test]
    fn amount_is_captured_and_unknown_keys_are_not() {
        let mut p = CapturePolicy::new(&[]);
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
        let mut p = CapturePolicy::new(&[]);
        assert_eq!(
            p.capture("reason", Scalar::Str("refund for jane@example.com")),
            None
        );
        assert_eq!(p.capture("reason", Scalar::Str("sk_live_abc123")), None);
        assert_eq!(p.capture("amount", Scalar::U64(4111111111111111)), None);
        assert_eq!(
            p.capture("reason", Scalar::Str("duplicate_charge")),
            Some(json!("duplicate_charge"))
        );
        let mut text = CapturePolicy::with_text(&[], &["reason".into()]);
        assert_eq!(
            text.capture("reason", Scalar::Str("duplicate charge")),
            Some(json!("duplicate charge"))
        );
        assert_eq!(
            text.capture("reason", Scalar::Str("call +1 (415) 555-0100")),
            None
        );
    }

    #[test]
    fn long_strings_are_dropped_not_truncated() {
        let mut p = CapturePolicy::with_text(&[], &["reason".into()]);
        let long = "a".repeat(MAX_VALUE_LEN + 1);
        assert_eq!(p.capture("reason", Scalar::Str(&long)), None);
        let ok = "a".repeat(MAX_VALUE_LEN);
        assert!(p.capture("reason", Scalar::Str(&ok)).is_some());
    }

    #[test]
    fn only_codes_are_captured_without_capture_text() {
        let mut p = CapturePolicy::new(&["note".into()]);
        for code in [
            "requested_by_customer",
            "EUR",
            "damaged",
            "high",
            "en-GB",
            "v1.2.3",
            "tier:gold",
            "eu/west",
            "ord_12345678",
            "2026-11-29",
            "annulé",
            "",
        ] {
            assert_eq!(
                p.decide("reason", Scalar::Str(code)),
                Capture::Kept(json!(code)),
                "{code}"
            );
        }
        for prose in [
            "duplicate charge",
            "call John Smith",
            "42 Baker Street",
            "Jane\tDoe",
            "a\u{a0}b",
            "x,y",
            "it's",
            &"a".repeat(MAX_CODE_LEN + 1),
        ] {
            assert_eq!(
                p.decide("reason", Scalar::Str(prose)),
                Capture::Prose,
                "{prose}"
            );
            assert_eq!(
                p.decide("note", Scalar::Str(prose)),
                Capture::Prose,
                "{prose}"
            );
        }
        // Numbers and booleans are unchanged; a key not allowed is dropped, not counted.
        assert_eq!(
            p.decide("amount", Scalar::F64(12.5)),
            Capture::Kept(json!(12.5))
        );
        assert_eq!(
            p.decide("dry_run", Scalar::Bool(true)),
            Capture::Kept(json!(true))
        );
        assert_eq!(p.decide("other", Scalar::Str("a b")), Capture::Dropped);
    }

    /// The policy remembers what it ruled of a key, never of a value: canary values under an
    /// allowed key, canary keys and prose are refused every time, between kept fields, and after
    /// more distinct keys than it remembers have pushed them out.
    #[test]
    fn canaries_are_refused_every_time_despite_remembered_key_rules() {
        let mut p = CapturePolicy::new(&[]);
        let canary_values = [
            "4111 1111 1111 1111",
            "jane.doe@example.com",
            "sk_live_51Hq0CanaryCanary",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        ];
        let canary_keys = ["customer_email", "card_number", "sk_live_51Hq0CanaryCanary"];
        for round in 0..3 {
            for v in canary_values {
                assert_eq!(
                    p.decide("currency", Scalar::Str("EUR")),
                    Capture::Kept(json!("EUR"))
                );
                // Withheld as prose or dropped by L4: never kept.
                assert!(
                    !matches!(p.decide("reason", Scalar::Str(v)), Capture::Kept(_)),
                    "round {round}: {v}"
                );
                assert_eq!(p.decide("reason", Scalar::Str("on hold")), Capture::Prose);
            }
            for k in canary_keys {
                assert_eq!(
                    p.decide("amount_cents", Scalar::U64(4900)),
                    Capture::Kept(json!(4900))
                );
                assert_eq!(p.decide(k, Scalar::U64(4900)), Capture::Dropped, "{k}");
            }
            for i in 0..(2 * KEY_RULE_SLOTS) {
                assert_eq!(
                    p.decide(&format!("quantity_{i}"), Scalar::U64(1)),
                    Capture::Dropped
                );
            }
        }
    }

    #[test]
    fn capture_text_opts_a_key_into_prose_and_allows_it() {
        let mut p =
            CapturePolicy::with_text(&[], &["Reason".into(), "note".into(), "user_name".into()]);
        assert_eq!(
            p.decide("reason", Scalar::Str("customer asked twice")),
            Capture::Kept(json!("customer asked twice"))
        );
        assert_eq!(
            p.decide("note", Scalar::Str("left at the door")),
            Capture::Kept(json!("left at the door"))
        );
        // Other allowed keys stay codes-only; the denylist still wins.
        assert_eq!(p.decide("status", Scalar::Str("on hold")), Capture::Prose);
        assert_eq!(p.decide("user_name", Scalar::Str("jane")), Capture::Dropped);
        // L4 still runs on prose.
        assert_eq!(
            p.decide("note", Scalar::Str("SSN 078-05-1120")),
            Capture::Dropped
        );
    }

    #[test]
    fn phone_numbers_are_found_in_national_and_international_forms() {
        for s in [
            "+1 (415) 555-0100",
            "call John Smith at +1 (415) 555-0100",
            "(415) 555-0100",
            "415-555-0100",
            "415.555.0100",
            "+14155550100",
            "tel:+14155550100",
            "+44 20 7946 0958",
            "020 7946 0958",
            "07700 900123",
            "+49 30 1234567",
            "030 12345678",
            "030/12345678",
            "0171 1234567",
            "+33 1 23 45 67 89",
            "01 23 45 67 89",
            "01.23.45.67.89",
            "+353 1 234 5678",
        ] {
            assert!(contains_phone_or_ssn(s), "{s}");
            assert!(contains_sensitive(s), "{s}");
        }
        for s in [
            "ord_12345678",
            "ord_123456789012",
            "1764528000",
            "amount 1234567.89",
            "2026-11-29",
            "2026-11-29 19:13:27",
            "29.11.2026 10:15",
            "0123456789abcdef0123456789abcdef",
            "a1b2c3d4e5f60718",
            "v1.2.3",
            "12345678",
            "123e4567-e89b-12d3-a456-426614174000",
            "#123456789",
            "x-0123456789",
        ] {
            assert!(!contains_phone_or_ssn(s), "{s}");
        }
    }

    #[test]
    fn us_ssns_are_found() {
        for s in ["078-05-1120", "SSN 078-05-1120", "ssn: 219 09 9999"] {
            assert!(contains_sensitive(s), "{s}");
        }
        assert!(ssn_valid(b"078-05-1120"));
        for s in [
            &b"000-12-3456"[..],
            b"666-12-3456",
            b"912-12-3456",
            b"123-00-4567",
            b"123-45-0000",
        ] {
            assert!(!ssn_valid(s));
        }
    }

    #[test]
    fn public_ip_addresses_are_found_and_local_ones_are_not() {
        for s in [
            "81.2.69.160",
            "from 8.8.8.8.",
            "203.0.113.7:8080",
            "client ip 100.64.1.2",
            "2001:db8::8a2e:370:7334",
            "[2a00:1450:4001:82b::200e]:443",
            "2001:0db8:0000:0000:0000:ff00:0042:8329",
        ] {
            assert!(contains_sensitive(s), "{s}");
        }
        for s in [
            "127.0.0.1:8080",
            "10.0.0.5",
            "192.168.1.20",
            "172.16.0.1",
            "169.254.1.1",
            "0.0.0.0",
            "[::1]:8080",
            "fe80::1:2:3",
            "fd00::1:2:3",
            "db::add",
            "fs::read_file",
            "19:13:27.123",
            "00:1a:2b:3c:4d:5e",
            "v1.2.3",
            "10.0.19041.1234",
            "1.2.3.4.5",
            "mcp://payments",
        ] {
            assert!(!contains_ipv4(s) && !contains_ipv6(s), "{s}");
        }
    }

    #[test]
    fn ibans_of_any_country_are_found_by_mod_97() {
        for s in [
            "GB82WEST12345698765432",
            "GB82 WEST 1234 5698 7654 32",
            "FR14 2004 1010 0505 0001 3M02 606",
            "pay to FR1420041010050500013M02606 today",
            "NL91ABNA0417164300",
            "BE68 5390 0754 7034",
            "ES91 2100 0418 4502 0005 1332",
            "DE89 3704 0044 0532 0130 00",
            "ch9300762011623852957",
        ] {
            assert!(contains_iban(s), "{s}");
            assert!(contains_sensitive(s), "{s}");
        }
        for s in [
            "GB82WEST12345698765433",
            "FR14 2004 1010 0505 0001 3M02 607",
            "GB82WEST12345698765432X",
            "AB12",
            "requested_by_customer",
            "SKU AB12-3456-7890-1234",
        ] {
            assert!(!contains_iban(s), "{s}");
        }
    }

    #[test]
    fn dates_of_birth_need_a_birth_word_next_to_them() {
        for s in [
            "born 1984-03-07",
            "DOB: 07/03/1984",
            "date of birth 7.3.84",
            "dob_1984-03-07",
            "geboren am 07.03.1984",
            "né le 07/03/1984, naissance",
            "12/31/1990 birthday",
        ] {
            assert!(contains_contextual(s), "{s}");
            assert!(contains_sensitive(s), "{s}");
        }
        for s in [
            "2026-11-29",
            "shipped 2026-11-29",
            "born_ready",
            "born on a tuesday",
            "birthday_sale 2026",
            &format!("born {} 2026-11-29", "x".repeat(40)),
            "stubborn 2026-13-45",
        ] {
            assert!(!contains_contextual(s), "{s}");
        }
    }

    /// Runs of digits too long for any part of a date, on either side of its separators, next
    /// to a birth word: no date, and no arithmetic overflow reading them (a fuzzed batch hit a
    /// `u32` overflow here, which panics where overflow is checked).
    #[test]
    fn digit_runs_too_long_for_a_date_are_not_read_as_one() {
        let long = "9".repeat(40);
        for s in [
            format!("born {long}-12-31"),
            format!("born 31-12-{long}"),
            format!("dob {long}/1/{long}"),
            format!("birth {long}.{long}.{long}"),
            format!("born 1984-03-{long}"),
        ] {
            assert!(!contains_contextual(&s), "{s}");
        }
        assert!(contains_contextual(&format!("{long} born 1984-03-07")));
    }

    #[test]
    fn passport_numbers_need_a_passport_word_next_to_them() {
        for s in [
            "passport 123456789",
            "Passport no. C01X00T47",
            "passport_number:12AB34567",
            "Reisepass C01X00T47",
            "533380006 passport",
        ] {
            assert!(contains_contextual(s), "{s}");
        }
        for s in [
            "C01X00T47",
            "passport expired",
            "passport_check 2031",
            &format!("passport {} 123456789", "x".repeat(40)),
        ] {
            assert!(!contains_contextual(s), "{s}");
        }
    }

    #[test]
    fn codes_amounts_and_plain_dates_are_not_sensitive() {
        for s in [
            "EUR",
            "requested_by_customer",
            "damaged",
            "high",
            "4900",
            "1234567.89",
            "2026-11-29",
            "2026-11-29T19:13:27.123Z",
            "ord_12345678",
            "ord_1234567890",
            "inv-2026-000123",
            "1764528000",
            "mcp://payments",
            "mcp:k1",
            "issue_refund",
            "2025-06-18",
            "0.1.0",
            "claude-code",
            "0123456789abcdef0123456789abcdef",
        ] {
            assert!(!contains_sensitive(s), "{s}");
        }
        for n in [
            Number::from(1_234_567_890u64),
            Number::from(14_155_550_100u64),
            Number::from_f64(1234567.89).expect("finite"),
            Number::from(-32601),
        ] {
            assert!(number_passes(&n), "{n}");
        }
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

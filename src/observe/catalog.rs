//! The tool catalog fingerprint: `rec.registryVersion` (DESIGN §4).
//!
//! Goes in: `tools/list` results (page by page) and `notifications/tools/list_changed`. Comes
//! out: a short SHA-256 hex of the canonical catalog — every tool's name, description and input
//! schema, tools sorted by name, object keys sorted, compact JSON — or `None` until a complete
//! list was seen (and again after `list_changed` until the next complete list). This is the one
//! place the observer builds a `serde_json::Value`, and only of a `tools/list` result, which is
//! small. Never keeps anything but names, descriptions and schemas, and never emits them.
//!
//! It also keeps, per listed tool, the hash of its definition (`rec.toolDef`) and its hints
//! (`rec.hints`), and compares each complete list with the one before it (`drift` events). Each
//! definition is hashed once per `tools/list`, when the list arrives, never per call; only the
//! hash and the hints stay (no description text outlives the list it came in), for at most
//! [`MAX_TOOL_DEFS`] tools. The first complete list is the baseline. A list with a page too large
//! to read whole (see `crate::tap::large::CATALOG_FRAME_BYTES`) leaves the calls after it
//! without `toolDef`, `listed` or `hints` (unknown is not "unlisted"), and is no baseline: the
//! next complete list is compared with the last complete one.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::event::{CatalogSize, DriftChange, Hint, SharedStr};

use super::peek::{keep_last, Object};

/// Hex characters of the SHA-256 kept: 64 bits tell catalogs apart in practice and keep events
/// short.
pub const REGISTRY_VERSION_HEX: usize = 16;

/// Most tools kept while merging pages; a server listing more is still fingerprinted on the
/// first ones (bounds memory against a hostile server).
pub const MAX_TOOLS: usize = 10_000;

/// Most tool definitions remembered from one list (name, hash, hints: about 100 bytes each).
/// Agents are shown tens of tools; a server listing more still has its first 1,000 remembered,
/// and then a call to a tool past them has no `toolDef` and no `listed` (it may be listed),
/// and no `drift` is reported between such lists (the comparison would be a guess).
pub const MAX_TOOL_DEFS: usize = 1_000;

/// Longest tool name remembered: a call with a longer one makes no event anyway.
const MAX_NAME: usize = super::assemble::MAX_TOOL_NAME;

/// What the catalog knows of one listed tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolDef {
    /// 16 hex digits of SHA-256 over the canonical definition (see [`tool_def_hash`]).
    pub hash: SharedStr,
    /// The annotations set to `true`, in [`Hint`] order.
    pub hints: Vec<Hint>,
}

/// Hashes tool names: every call looks its tool up (SipHash, std's default, cost about 150
/// instructions of a call's ~24,000 with a listed catalog; bench/README.md). Seeded per map, as
/// for the open requests' ids; the names come from the server and are at most
/// [`MAX_TOOL_DEFS`] of at most [`MAX_NAME`] bytes, so colliding names can cost no more than a
/// scan of the list.
type NameHasher = foldhash::fast::RandomState;

/// The tools of one complete list.
#[derive(Debug, Default)]
struct Defs {
    by_name: HashMap<Box<str>, ToolDef, NameHasher>,
    /// More tools were listed than [`MAX_TOOL_DEFS`]: a name not in `by_name` may be listed.
    over_cap: bool,
}

/// What a call's event says of its tool: `toolDef`, `listed`, `hints`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallFacts {
    pub tool_def: Option<SharedStr>,
    pub listed: Option<bool>,
    pub hints: Vec<Hint>,
}

/// One tool that changed between two complete lists (a `drift` event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    pub name: Box<str>,
    pub change: DriftChange,
    pub tool_def: Option<SharedStr>,
    pub prev_tool_def: Option<SharedStr>,
}

#[derive(Debug, Default)]
pub struct Catalog {
    pages: Vec<Value>,
    version: Option<String>,
    /// The list being merged, page by page.
    building: Defs,
    building_tools: u64,
    building_bytes: u64,
    /// The last complete list read whole: what calls are looked up in, and the drift baseline.
    defs: Option<Defs>,
    /// The latest list was read whole (else calls get no tool facts until the next one).
    known: bool,
    size: Option<CatalogSize>,
    /// Changes found by the latest complete list, for the observer to take.
    drift: Vec<Drift>,
    /// The tool names of the last complete list (OTLP takes a tool name as a metric attribute
    /// only from here, so a client cannot make up series).
    names: std::collections::HashSet<String, NameHasher>,
}

/// Read as `JSON.parse` reads it: a key given twice keeps its last value (see
/// [`super::peek::FromObject`]); inside each tool, `Value` does the same.
#[derive(Default)]
struct ListResponse {
    result: Option<Object<ListResult>>,
}
keep_last!(impl<> ListResponse { "result" => result });

#[derive(Default)]
struct ListResult {
    tools: Vec<Value>,
    next_cursor: Option<Value>,
}
keep_last!(impl<> ListResult { "tools" => tools, "nextCursor" => next_cursor });

impl Catalog {
    /// The current fingerprint.
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// Whether `name` is a tool of the last complete list.
    pub fn listed(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    /// `notifications/tools/list_changed`: the old fingerprint no longer describes the server.
    pub fn invalidate(&mut self) {
        self.version = None;
    }

    /// The size of the latest list seen (complete or not).
    pub fn size(&self) -> Option<CatalogSize> {
        self.size
    }

    /// What a call to `name` (as the client sent it) carries of the latest list.
    pub fn call_facts(&self, name: &str) -> CallFacts {
        let Some(defs) = self.defs.as_ref().filter(|_| self.known) else {
            return CallFacts::default();
        };
        match defs.by_name.get(name) {
            Some(d) => CallFacts {
                tool_def: Some(d.hash.clone()),
                listed: None,
                hints: d.hints.clone(),
            },
            None if defs.over_cap => CallFacts::default(),
            None => CallFacts {
                listed: Some(false),
                ..CallFacts::default()
            },
        }
    }

    /// The changes the latest complete list showed against the one before (empty for the first).
    pub fn take_drift(&mut self) -> Vec<Drift> {
        std::mem::take(&mut self.drift)
    }

    /// A page of `len` bytes too large to read whole ended the list: its size is known, its
    /// tools are not.
    pub fn on_partial_page(&mut self, len: u64, first_page: bool) {
        if first_page {
            self.building_bytes = 0;
        }
        self.size = Some(CatalogSize {
            tools: None,
            bytes: self.building_bytes.saturating_add(len),
        });
        self.known = false;
        self.building = Defs::default();
        self.building_tools = 0;
        self.building_bytes = 0;
        self.pages = Vec::new();
    }

    /// One `tools/list` response message (`first_page`: its request had no cursor). Returns
    /// false if the result is not a tool list (then nothing changes).
    pub fn on_list_response(&mut self, msg: &[u8], first_page: bool) -> bool {
        let Ok(Object(ListResponse {
            result: Some(Object(r)),
        })) = serde_json::from_slice::<Object<ListResponse>>(msg)
        else {
            return false;
        };
        if first_page {
            self.pages.clear();
            self.building = Defs::default();
            self.building_tools = 0;
            self.building_bytes = 0;
        }
        self.building_bytes = self.building_bytes.saturating_add(msg.len() as u64);
        for t in &r.tools {
            self.building_tools += 1;
            self.remember(t);
            if self.pages.len() < MAX_TOOLS {
                self.pages.push(canonical_tool(t));
            }
        }
        let last = matches!(r.next_cursor, None | Some(Value::Null));
        if last {
            self.names = self
                .pages
                .iter()
                .filter_map(|t| t.get("name").and_then(Value::as_str))
                .map(str::to_string)
                .collect();
            self.version = Some(fingerprint(&mut self.pages));
            self.pages = Vec::new();
            self.size = Some(CatalogSize {
                tools: Some(self.building_tools),
                bytes: self.building_bytes,
            });
            let new = std::mem::take(&mut self.building);
            if let Some(old) = &self.defs {
                self.drift = diff(old, &new);
            }
            self.defs = Some(new);
            self.known = true;
        }
        true
    }

    /// Hashes one listed tool into the list being merged (a later tool of the same name wins,
    /// as a client's map of tools would keep it).
    fn remember(&mut self, t: &Value) {
        let Some(name) = t.get("name").and_then(Value::as_str) else {
            return;
        };
        if name.is_empty() || name.len() > MAX_NAME {
            return;
        }
        let b = &mut self.building;
        if b.by_name.len() >= MAX_TOOL_DEFS && !b.by_name.contains_key(name) {
            b.over_cap = true;
            return;
        }
        b.by_name.insert(
            name.into(),
            ToolDef {
                hash: tool_def_hash(t).into(),
                hints: hints(t),
            },
        );
    }
}

/// What changed from `old` to `new`, by name; nothing when either was over the cap.
fn diff(old: &Defs, new: &Defs) -> Vec<Drift> {
    if old.over_cap || new.over_cap {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (name, d) in &new.by_name {
        match old.by_name.get(name) {
            None => out.push(Drift {
                name: name.clone(),
                change: DriftChange::Added,
                tool_def: Some(d.hash.clone()),
                prev_tool_def: None,
            }),
            Some(o) if o.hash != d.hash => out.push(Drift {
                name: name.clone(),
                change: DriftChange::Changed,
                tool_def: Some(d.hash.clone()),
                prev_tool_def: Some(o.hash.clone()),
            }),
            Some(_) => {}
        }
    }
    for (name, o) in &old.by_name {
        if !new.by_name.contains_key(name) {
            out.push(Drift {
                name: name.clone(),
                change: DriftChange::Removed,
                tool_def: None,
                prev_tool_def: Some(o.hash.clone()),
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The keys of a tool that make its definition (MCP `Tool`): what the model is shown and what
/// the server claims of it.
const DEF_KEYS: [&str; 6] = [
    "name",
    "title",
    "description",
    "inputSchema",
    "outputSchema",
    "annotations",
];

/// 16 hex digits of SHA-256 over a tool's canonical definition: the [`DEF_KEYS`] it has, keys
/// sorted at every depth, compact JSON.
pub fn tool_def_hash(t: &Value) -> String {
    let mut m = Map::new();
    for k in DEF_KEYS {
        if let Some(v) = t.get(k) {
            m.insert(k.to_string(), sort_keys(v));
        }
    }
    let canon = Value::Object(m).to_string();
    super::fingerprint::clear_digest(&[canon.as_bytes()])
}

/// `annotations.*Hint` set to `true` (only those: the spec's defaults are not invented).
fn hints(t: &Value) -> Vec<Hint> {
    let Some(a) = t.get("annotations") else {
        return Vec::new();
    };
    [
        ("readOnlyHint", Hint::ReadOnly),
        ("destructiveHint", Hint::Destructive),
        ("idempotentHint", Hint::Idempotent),
        ("openWorldHint", Hint::OpenWorld),
    ]
    .into_iter()
    .filter(|(k, _)| a.get(*k) == Some(&Value::Bool(true)))
    .map(|(_, h)| h)
    .collect()
}

fn canonical_tool(t: &Value) -> Value {
    let mut m = Map::new();
    for k in ["name", "description", "inputSchema"] {
        m.insert(
            k.to_string(),
            t.get(k).map(sort_keys).unwrap_or(Value::Null),
        );
    }
    Value::Object(m)
}

/// Recursively sorted keys, whatever order the map type keeps.
fn sort_keys(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                out.insert(k.clone(), sort_keys(&m[k]));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(sort_keys).collect()),
        other => other.clone(),
    }
}

fn fingerprint(tools: &mut [Value]) -> String {
    tools.sort_by(|a, b| {
        let name = |v: &Value| {
            v.get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        name(a)
            .cmp(&name(b))
            .then_with(|| a.to_string().cmp(&b.to_string()))
    });
    let canon = Value::Array(tools.to_vec()).to_string();
    let digest = ring::digest::digest(&ring::digest::SHA256, canon.as_bytes());
    crate::event::hex_lower(&digest.as_ref()[..REGISTRY_VERSION_HEX / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = r#"{"name":"a","description":"A","inputSchema":{"type":"object","properties":{"x":{"type":"string"}}}}"#;
    const B: &str = r#"{"name":"b","description":"B","inputSchema":{"type":"object"}}"#;

    fn list(tools: &[&str], cursor: Option<&str>) -> Vec<u8> {
        let next = cursor
            .map(|c| format!(",\"nextCursor\":\"{c}\""))
            .unwrap_or_default();
        format!(
            "{{\"id\":1,\"result\":{{\"tools\":[{}]{next}}}}}",
            tools.join(",")
        )
        .into_bytes()
    }

    #[test]
    fn order_and_key_order_do_not_change_the_version() {
        let mut c1 = Catalog::default();
        assert!(c1.on_list_response(&list(&[A, B], None), true));
        let v1 = c1.version().expect("v").to_string();
        assert_eq!(v1.len(), REGISTRY_VERSION_HEX);
        let a_reordered = r#"{"inputSchema":{"properties":{"x":{"type":"string"}},"type":"object"},"description":"A","name":"a","title":"ignored"}"#;
        let mut c2 = Catalog::default();
        c2.on_list_response(&list(&[B, a_reordered], None), true);
        assert_eq!(c2.version(), Some(v1.as_str()));
    }

    #[test]
    fn pages_are_merged_and_changes_show() {
        let mut whole = Catalog::default();
        whole.on_list_response(&list(&[A, B], None), true);
        let mut paged = Catalog::default();
        paged.on_list_response(&list(&[A], Some("p2")), true);
        assert_eq!(paged.version(), None, "incomplete list has no version yet");
        paged.on_list_response(&list(&[B], None), false);
        assert_eq!(paged.version(), whole.version());

        paged.invalidate();
        assert_eq!(paged.version(), None);
        let b2 = r#"{"name":"b","description":"B, now different","inputSchema":{"type":"object"}}"#;
        paged.on_list_response(&list(&[A, b2], None), true);
        assert!(paged.version().is_some());
        assert_ne!(paged.version(), whole.version());
    }

    #[test]
    fn tool_defs_hints_and_drift() {
        let a_ann = r#"{"name":"a","description":"A","inputSchema":{"type":"object","properties":{"x":{"type":"string"}}},"annotations":{"readOnlyHint":true,"destructiveHint":false,"openWorldHint":true}}"#;
        let mut c = Catalog::default();
        assert_eq!(c.call_facts("a"), CallFacts::default(), "no list seen yet");
        c.on_list_response(&list(&[a_ann, B], None), true);
        assert!(c.take_drift().is_empty(), "the first list is the baseline");
        let a = c.call_facts("a");
        assert_eq!(
            a.tool_def.as_deref().map(str::len),
            Some(REGISTRY_VERSION_HEX)
        );
        assert_eq!(a.hints, vec![Hint::ReadOnly, Hint::OpenWorld]);
        assert_eq!(a.listed, None);
        assert_eq!(c.call_facts("nope").listed, Some(false));
        assert_eq!(c.size().and_then(|s| s.tools), Some(2));

        // Key order does not matter; the description does.
        let a_reordered = r#"{"annotations":{"openWorldHint":true,"destructiveHint":false,"readOnlyHint":true},"inputSchema":{"properties":{"x":{"type":"string"}},"type":"object"},"description":"A","name":"a"}"#;
        c.on_list_response(&list(&[B, a_reordered], None), true);
        assert!(c.take_drift().is_empty());
        let b2 = r#"{"name":"b","description":"B, now different","inputSchema":{"type":"object"}}"#;
        let d = r#"{"name":"d","inputSchema":{"type":"object"}}"#;
        let old_b = c.call_facts("b").tool_def;
        c.on_list_response(&list(&[b2, d], None), true);
        let drift = c.take_drift();
        let got: Vec<(&str, DriftChange)> = drift.iter().map(|x| (&*x.name, x.change)).collect();
        assert_eq!(
            got,
            vec![
                ("a", DriftChange::Removed),
                ("b", DriftChange::Changed),
                ("d", DriftChange::Added)
            ]
        );
        assert_eq!(drift[1].prev_tool_def, old_b);
        assert_eq!(drift[1].tool_def, c.call_facts("b").tool_def);
        assert_ne!(drift[1].tool_def, drift[1].prev_tool_def);

        // A page too large to read whole: nothing is known of the tools, not even "unlisted".
        c.on_partial_page(5_000_000, true);
        assert_eq!(c.call_facts("nope"), CallFacts::default());
        assert_eq!(
            c.size(),
            Some(CatalogSize {
                tools: None,
                bytes: 5_000_000
            })
        );
    }

    #[test]
    fn remembered_tools_are_capped() {
        let tools: Vec<String> = (0..MAX_TOOL_DEFS + 5)
            .map(|i| format!(r#"{{"name":"t{i}","description":"d"}}"#))
            .collect();
        let refs: Vec<&str> = tools.iter().map(String::as_str).collect();
        let mut c = Catalog::default();
        c.on_list_response(&list(&refs, None), true);
        assert!(c.call_facts("t0").tool_def.is_some());
        let past = format!("t{}", MAX_TOOL_DEFS + 2);
        assert_eq!(
            c.call_facts(&past),
            CallFacts::default(),
            "maybe listed: unknown"
        );
        assert_eq!(
            c.size().and_then(|s| s.tools),
            Some((MAX_TOOL_DEFS + 5) as u64)
        );
        c.on_list_response(&list(&[A], None), true);
        assert!(c.take_drift().is_empty(), "no drift against a capped list");
    }

    #[test]
    fn non_list_results_change_nothing() {
        let mut c = Catalog::default();
        assert!(!c.on_list_response(br#"{"id":1,"result":{"tools":"x"}}"#, true));
        assert!(!c.on_list_response(b"garbage", true));
        assert_eq!(c.version(), None);
    }

    /// The catalog a client sees is the one `JSON.parse` gives: a duplicated key's last value.
    #[test]
    fn duplicate_keys_in_a_tools_list_keep_the_last_value() {
        let mut only_b = Catalog::default();
        only_b.on_list_response(&list(&[B], None), true);
        let twice = format!(
            r#"{{"id":1,"result":{{"tools":[{A}],"nextCursor":"p2","tools":[{B}],"nextCursor":null}},"result":{{"tools":[{B}]}}}}"#
        );
        let mut c = Catalog::default();
        assert!(c.on_list_response(twice.as_bytes(), true));
        assert_eq!(c.version(), only_b.version());
    }
}

//! The tool catalog fingerprint: `rec.registryVersion` (DESIGN §4).
//!
//! Goes in: `tools/list` results (page by page) and `notifications/tools/list_changed`. Comes
//! out: a short SHA-256 hex of the canonical catalog — every tool's name, description and input
//! schema, tools sorted by name, object keys sorted, compact JSON — or `None` until a complete
//! list was seen (and again after `list_changed` until the next complete list). This is the one
//! place the observer builds a `serde_json::Value`, and only of a `tools/list` result, which is
//! small. Never keeps anything but names, descriptions and schemas, and never emits them.

use serde_json::{Map, Value};

use super::peek::{keep_last, Object};

/// Hex characters of the SHA-256 kept: 64 bits tell catalogs apart in practice and keep events
/// short.
pub const REGISTRY_VERSION_HEX: usize = 16;

/// Most tools kept while merging pages; a server listing more is still fingerprinted on the
/// first ones (bounds memory against a hostile server).
pub const MAX_TOOLS: usize = 10_000;

#[derive(Debug, Default)]
pub struct Catalog {
    pages: Vec<Value>,
    version: Option<String>,
    /// The tool names of the last complete list (OTLP takes a tool name as a metric attribute
    /// only from here, so a client cannot make up series).
    names: std::collections::HashSet<String>,
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
        }
        for t in r.tools {
            if self.pages.len() >= MAX_TOOLS {
                break;
            }
            self.pages.push(canonical_tool(&t));
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
        }
        true
    }
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

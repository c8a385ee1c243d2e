//! Per-tool figures of the last hour for the live view's tools page, computed from stored
//! envelopes: calls and errors per minute, error rate, `dur_ms` percentiles, the largest
//! responses and error groups by `err.fp`.
//!
//! Pure: envelopes in, JSON out; it never reads the store or the clock itself (the caller
//! passes both), so it is tested without either. It only copies out metadata fields the
//! envelope already carries; nothing here widens what the API shows.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The window the figures cover.
pub const WINDOW: Duration = Duration::from_secs(60 * 60);
/// Most events read for one answer; past it the figures cover the newest ones only (the
/// answer says so with `truncated`).
pub const MAX_EVENTS: u32 = 50_000;
/// Minutes in [`WINDOW`]: one chart bucket each.
const MINUTES: usize = 60;
/// Largest responses listed per tool.
const LARGEST: usize = 5;

#[derive(Default)]
struct Tool {
    calls: Vec<u64>,
    errors: Vec<u64>,
    durations: Vec<f64>,
    /// (response bytes, ts, event id)
    largest: Vec<(u64, String, String)>,
    /// fp → (count, first seen, last seen)
    groups: BTreeMap<String, (u64, String, String)>,
    errors_with_fp: u64,
}

fn minute_index(received: &str, now: SystemTime) -> Option<usize> {
    let t = OffsetDateTime::parse(received, &Rfc3339).ok()?;
    let now = OffsetDateTime::from(now);
    let ago = (now - t).whole_seconds();
    if !(0..WINDOW.as_secs() as i64).contains(&ago) {
        return None;
    }
    // Oldest minute first, the current one last.
    Some(MINUTES - 1 - (ago / 60) as usize)
}

/// The nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// The figures for `events` (stored envelopes, any order) as of `now`.
pub fn per_tool(events: &[Value], now: SystemTime) -> Value {
    let mut tools: BTreeMap<String, Tool> = BTreeMap::new();
    for ev in events {
        let Some(minute) = ev
            .get("receivedAt")
            .and_then(Value::as_str)
            .and_then(|r| minute_index(r, now))
        else {
            continue;
        };
        let name = ev
            .pointer("/rec/action")
            .and_then(Value::as_str)
            .unwrap_or("(no tool)")
            .to_owned();
        let t = tools.entry(name).or_insert_with(|| Tool {
            calls: vec![0; MINUTES],
            errors: vec![0; MINUTES],
            ..Tool::default()
        });
        t.calls[minute] += 1;
        let ts = ev
            .get("ts")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if ev.get("class").and_then(Value::as_str) == Some("error") {
            t.errors[minute] += 1;
            if let Some(fp) = ev.pointer("/err/fp").and_then(Value::as_str) {
                t.errors_with_fp += 1;
                let g = t
                    .groups
                    .entry(fp.to_owned())
                    .or_insert_with(|| (0, ts.clone(), ts.clone()));
                g.0 += 1;
                if ts < g.1 {
                    g.1 = ts.clone();
                }
                if ts > g.2 {
                    g.2 = ts.clone();
                }
            }
        }
        if let Some(d) = ev.get("dur_ms").and_then(Value::as_f64) {
            t.durations.push(d);
        }
        if let Some(resp) = ev.pointer("/bytes/resp").and_then(Value::as_u64) {
            let id = ev
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            t.largest.push((resp, ts, id));
            t.largest.sort_by_key(|l| std::cmp::Reverse(l.0));
            t.largest.truncate(LARGEST);
        }
    }
    let out: Vec<Value> = tools
        .into_iter()
        .map(|(name, mut t)| {
            t.durations.sort_by(f64::total_cmp);
            let calls: u64 = t.calls.iter().sum();
            let errors: u64 = t.errors.iter().sum();
            let groups = (t.errors_with_fp > 0).then(|| {
                let mut g: Vec<Value> = t
                    .groups
                    .into_iter()
                    .map(|(fp, (count, first, last))| {
                        json!({ "fp": fp, "count": count, "firstSeen": first, "lastSeen": last })
                    })
                    .collect();
                g.sort_by_key(|v| std::cmp::Reverse(v["count"].as_u64().unwrap_or(0)));
                g
            });
            json!({
                "tool": name,
                "calls": calls,
                "errors": errors,
                "errorRate": if calls == 0 { 0.0 } else { errors as f64 / calls as f64 },
                "durMs": {
                    "p50": percentile(&t.durations, 50.0),
                    "p95": percentile(&t.durations, 95.0),
                    "p99": percentile(&t.durations, 99.0),
                },
                "perMinute": { "calls": t.calls, "errors": t.errors },
                "largest": t.largest.into_iter()
                    .map(|(resp, ts, id)| json!({ "resp": resp, "ts": ts, "id": id }))
                    .collect::<Vec<_>>(),
                "errorGroups": groups,
            })
        })
        .collect();
    json!({
        "windowMinutes": MINUTES,
        "truncated": events.len() >= MAX_EVENTS as usize,
        "tools": out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(now: SystemTime, secs_ago: u64) -> String {
        crate::event::rfc3339_ms(now - Duration::from_secs(secs_ago))
    }

    #[test]
    fn figures_per_tool_and_minute() {
        let now = SystemTime::now();
        let mut events = Vec::new();
        for i in 0..100u64 {
            events.push(json!({
                "id": format!("e{i}"), "ts": at(now, 5), "receivedAt": at(now, 5),
                "class": "action", "rec": { "action": "search" },
                "dur_ms": (i + 1) as f64, "bytes": { "req": 10, "resp": i * 10 },
            }));
        }
        for (i, fp) in ["aaaa", "aaaa", "bbbb"].iter().enumerate() {
            events.push(json!({
                "id": format!("x{i}"), "ts": at(now, 125), "receivedAt": at(now, 125),
                "class": "error", "rec": { "action": "refund" }, "err": { "kind": "tool", "fp": fp },
            }));
        }
        // Outside the hour: not counted.
        events.push(json!({ "receivedAt": at(now, 3700), "class": "action", "rec": { "action": "search" } }));
        let v = per_tool(&events, now);
        let tools = v["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 2);
        let refund = &tools[0];
        assert_eq!(refund["tool"], "refund");
        assert_eq!(refund["errors"], 3);
        assert_eq!(refund["errorRate"], 1.0);
        assert_eq!(refund["perMinute"]["errors"][57], 3);
        assert_eq!(refund["errorGroups"][0]["fp"], "aaaa");
        assert_eq!(refund["errorGroups"][0]["count"], 2);
        assert_eq!(refund["durMs"]["p50"], Value::Null);
        let search = &tools[1];
        assert_eq!(search["calls"], 100);
        assert_eq!(search["perMinute"]["calls"][59], 100);
        assert_eq!(search["durMs"]["p50"], 50.0);
        assert_eq!(search["durMs"]["p95"], 95.0);
        assert_eq!(search["durMs"]["p99"], 99.0);
        assert_eq!(search["largest"][0]["resp"], 990);
        assert_eq!(search["largest"].as_array().unwrap().len(), LARGEST);
        assert_eq!(
            search["errorGroups"],
            Value::Null,
            "no fingerprints: not reported"
        );
    }
}

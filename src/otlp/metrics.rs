//! The OTLP metrics: explicit-bucket histograms with a bounded number of series, and the
//! sensor's own counters.
//!
//! Owns the aggregation between exports ([`Histograms`]), cumulative or delta, and the cap
//! that keeps a client from making up series: at most [`MAX_SERIES`] attribute sets per
//! instrument; what comes after lands in one overflow series marked
//! `otel.metric.overflow=true` (the OpenTelemetry SDKs' convention). Tool names reach an
//! attribute only through [`tool_attribute`].

use std::collections::HashMap;

use opentelemetry_proto::tonic::metrics::v1::{
    metric, AggregationTemporality, Histogram, HistogramDataPoint, Metric, NumberDataPoint, Sum,
};

use super::config::Temporality;
use super::span::kv_str;

/// Bucket boundaries of both MCP duration histograms, in seconds (the conventions'
/// `ExplicitBucketBoundaries` advice).
pub const BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Most attribute sets per instrument per process (the bound; the OTel SDKs' default
/// cardinality limit was 2,000).
pub const MAX_SERIES: usize = 1_000;

/// Longest tool name used as a metric attribute.
pub const MAX_TOOL_ATTRIBUTE: usize = 128;

/// The attribute value for a tool name, the conventions' `_OTHER` unless the tool is in the
/// observed catalog and short: a client cannot make up series by calling made-up tools.
pub fn tool_attribute(name: &str, listed: bool) -> &str {
    if listed && name.len() <= MAX_TOOL_ATTRIBUTE {
        name
    } else {
        "_OTHER"
    }
}

type Attrs = Vec<(&'static str, String)>;

/// An attribute set (sorted) as one unambiguous byte string: each key and value preceded by
/// its length, so no two sets share a key whatever their values hold.
fn series_key(attrs: &[(&str, &str)], out: &mut Vec<u8>) {
    out.clear();
    for part in attrs.iter().flat_map(|(k, v)| [k, v]) {
        out.extend_from_slice(&(part.len() as u64).to_le_bytes());
        out.extend_from_slice(part.as_bytes());
    }
}

#[derive(Debug, Clone)]
struct Series {
    counts: [u64; BUCKETS.len() + 1],
    sum: f64,
    count: u64,
    min: f64,
    max: f64,
    start: u64,
}

impl Series {
    fn new(start: u64) -> Series {
        Series {
            counts: [0; BUCKETS.len() + 1],
            sum: 0.0,
            count: 0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            start,
        }
    }

    fn record(&mut self, v: f64) {
        // Upper bounds are inclusive (OTLP: bucket i holds values <= bound i).
        let i = BUCKETS
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(BUCKETS.len());
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
}

/// One histogram instrument's series.
#[derive(Debug)]
pub struct Histograms {
    name: &'static str,
    description: &'static str,
    /// By [`series_key`] of the attribute set: a call's set is looked up without allocating.
    series: HashMap<Vec<u8>, (Attrs, Series)>,
    overflow: Option<Series>,
    /// The key being looked up (kept for its capacity).
    key: Vec<u8>,
    /// Something was recorded since the last export.
    dirty: bool,
}

impl Histograms {
    pub fn new(name: &'static str, description: &'static str) -> Histograms {
        Histograms {
            name,
            description,
            series: HashMap::new(),
            overflow: None,
            key: Vec::new(),
            dirty: false,
        }
    }

    /// Records one duration under an attribute set (sorted here, so any order names the same
    /// series). Allocates only for a set not seen before.
    pub fn record(&mut self, attrs: &mut [(&'static str, &str)], seconds: f64, now: u64) {
        attrs.sort_unstable();
        series_key(attrs, &mut self.key);
        self.dirty = true;
        if let Some((_, s)) = self.series.get_mut(self.key.as_slice()) {
            s.record(seconds);
        } else if self.series.len() < MAX_SERIES {
            let mut s = Series::new(now);
            s.record(seconds);
            let owned = attrs.iter().map(|(k, v)| (*k, v.to_string())).collect();
            self.series.insert(self.key.clone(), (owned, s));
        } else {
            self.overflow
                .get_or_insert_with(|| Series::new(now))
                .record(seconds);
        }
    }

    /// Series (the overflow one included).
    pub fn series_count(&self) -> usize {
        self.series.len() + usize::from(self.overflow.is_some())
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// The metric as exported now. Delta: the series are reset once the export is delivered
    /// ([`Histograms::delivered`]); the cardinality cap holds per process either way.
    pub fn export(&self, now: u64, temporality: Temporality) -> Option<Metric> {
        if self.series.is_empty() && self.overflow.is_none() {
            return None;
        }
        let point = |attrs: Vec<opentelemetry_proto::tonic::common::v1::KeyValue>, s: &Series| {
            HistogramDataPoint {
                attributes: attrs,
                start_time_unix_nano: s.start,
                time_unix_nano: now,
                count: s.count,
                sum: Some(s.sum),
                bucket_counts: s.counts.to_vec(),
                explicit_bounds: BUCKETS.to_vec(),
                min: (s.count > 0).then_some(s.min),
                max: (s.count > 0).then_some(s.max),
                ..Default::default()
            }
        };
        let mut points: Vec<HistogramDataPoint> = self
            .series
            .values()
            .filter(|(_, s)| s.count > 0 || temporality == Temporality::Cumulative)
            .map(|(a, s)| point(a.iter().map(|(k, v)| kv_str(k, v)).collect(), s))
            .collect();
        if let Some(s) = &self.overflow {
            points.push(point(
                vec![super::span::kv(
                    "otel.metric.overflow",
                    opentelemetry_proto::tonic::common::v1::any_value::Value::BoolValue(true),
                )],
                s,
            ));
        }
        Some(Metric {
            name: self.name.to_string(),
            description: self.description.to_string(),
            unit: "s".to_string(),
            data: Some(metric::Data::Histogram(Histogram {
                data_points: points,
                aggregation_temporality: temporality_code(temporality),
            })),
            ..Default::default()
        })
    }

    /// An export was delivered at `now`: delta series start again from zero (kept, so the
    /// series cap still counts them).
    pub fn delivered(&mut self, now: u64, temporality: Temporality) {
        self.dirty = false;
        if temporality == Temporality::Delta {
            for (_, s) in self.series.values_mut() {
                *s = Series::new(now);
            }
            if let Some(o) = &mut self.overflow {
                *o = Series::new(now);
            }
        }
    }
}

pub fn temporality_code(t: Temporality) -> i32 {
    match t {
        Temporality::Cumulative => AggregationTemporality::Cumulative as i32,
        Temporality::Delta => AggregationTemporality::Delta as i32,
    }
}

/// The sensor's own totals, read when metrics are exported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SensorCounts {
    /// Events the ingest path dropped (queue full, failed batches, deadline).
    pub ingest_dropped: u64,
    /// Calls with no event because their answer may have been lost on the way to the observer
    /// (`None` where it is only known at the end: HTTP mode).
    pub calls_unobserved: Option<u64>,
    /// Bytes the relay could not hand to the observer.
    pub tap_bytes_dropped: u64,
}

/// Where the sensor's totals come from (the wiring in `run` knows the tap and the reporter).
pub type CounterSource = std::sync::Arc<dyn Fn() -> SensorCounts + Send + Sync>;

/// One point of a counter: its attributes, the total now, the total at the last delivered
/// export.
pub type CounterPoint = (Vec<(&'static str, &'static str)>, u64, u64);

/// The time window of an export: process start, last delivered export, now (Unix ns).
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub start: u64,
    pub last_export: u64,
    pub now: u64,
    pub temporality: Temporality,
}

/// A monotonic sum of one or more points.
pub fn counter(
    name: &str,
    unit: &str,
    description: &str,
    points: &[CounterPoint],
    w: Window,
) -> Metric {
    let (start, last_export, now, temporality) = (w.start, w.last_export, w.now, w.temporality);
    let data_points = points
        .iter()
        .map(|(attrs, total, before)| {
            let (value, from) = match temporality {
                Temporality::Cumulative => (*total, start),
                Temporality::Delta => (total.saturating_sub(*before), last_export),
            };
            NumberDataPoint {
                attributes: attrs.iter().map(|(k, v)| kv_str(k, v)).collect(),
                start_time_unix_nano: from,
                time_unix_nano: now,
                value: Some(
                    opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(
                        i64::try_from(value).unwrap_or(i64::MAX),
                    ),
                ),
                ..Default::default()
            }
        })
        .collect();
    Metric {
        name: name.to_string(),
        description: description.to_string(),
        unit: unit.to_string(),
        data: Some(metric::Data::Sum(Sum {
            data_points,
            aggregation_temporality: temporality_code(temporality),
            is_monotonic: true,
        })),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlisted_or_long_tool_names_are_other() {
        assert_eq!(tool_attribute("refund", true), "refund");
        assert_eq!(tool_attribute("refund", false), "_OTHER");
        assert_eq!(tool_attribute(&"x".repeat(129), true), "_OTHER");
    }

    #[test]
    fn series_are_capped_and_the_rest_overflows() {
        let mut h = Histograms::new("m", "d");
        for i in 0..MAX_SERIES + 500 {
            h.record(&mut [("k", &format!("v{i}"))], 0.5, 1);
        }
        assert_eq!(h.series_count(), MAX_SERIES + 1);
        let m = h.export(2, Temporality::Cumulative).expect("metric");
        let Some(metric::Data::Histogram(hist)) = m.data else {
            panic!("a histogram")
        };
        assert_eq!(hist.data_points.len(), MAX_SERIES + 1);
        let overflow = hist
            .data_points
            .iter()
            .find(|p| p.attributes.iter().any(|a| a.key == "otel.metric.overflow"))
            .expect("overflow point");
        assert_eq!(overflow.count, 500);
    }

    #[test]
    fn values_land_in_inclusive_buckets_and_delta_resets() {
        let mut h = Histograms::new("m", "d");
        for v in [0.005, 0.01, 0.011, 400.0] {
            h.record(&mut [], v, 1);
        }
        let m = h.export(2, Temporality::Delta).expect("metric");
        let Some(metric::Data::Histogram(hist)) = m.data else {
            panic!("a histogram")
        };
        let p = &hist.data_points[0];
        assert_eq!(p.bucket_counts[0], 2);
        assert_eq!(p.bucket_counts[1], 1);
        assert_eq!(p.bucket_counts[BUCKETS.len()], 1);
        assert_eq!(p.count, 4);
        h.delivered(3, Temporality::Delta);
        let m = h.export(4, Temporality::Delta).expect("metric");
        let Some(metric::Data::Histogram(hist)) = m.data else {
            panic!("a histogram")
        };
        assert!(
            hist.data_points.is_empty(),
            "nothing since the delivered export"
        );
    }
}

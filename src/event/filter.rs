//! L3: `validate_and_filter_event`, the one filter both the sensor and the ingest run (DESIGN §4).
//!
//! NOT YET BUILT (issue 3): currently passes nothing through.

use serde_json::Value;

pub const EVENT_SCHEMA_VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FilterError {
    #[error("event is not valid: {0}")]
    Invalid(String),
}

pub fn validate_and_filter_event(_event: &Value) -> Result<Value, FilterError> {
    Err(FilterError::Invalid("filter not built yet".into()))
}

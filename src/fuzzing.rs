//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`, off by default): the parsers
//! of untrusted bytes that are not public API. Thin wrappers with no behaviour of their own.

use crate::ingest::store::{BatchWrite, KeyRecord};

/// The ingest's `POST /v1/events` body parser: the rows it would store and how many events it
/// rejected, or why it refuses the batch as a whole (400 or 413).
pub fn prepare_batch(
    body: &[u8],
    key: &KeyRecord,
    max_events: usize,
) -> Result<(BatchWrite, u64), String> {
    crate::ingest::server::prepare_batch(body, key, max_events).map_err(|e| format!("{e:?}"))
}

//! The reference ingest (DESIGN §6, §7): its own binary, `bounded-ingest`.
//!
//! NOT YET BUILT (issue 5).

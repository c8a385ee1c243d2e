//! L2 (PII denylist) and L4 (value scrubber), and the capture allow-set (DESIGN §5).
//!
//! NOT YET BUILT (issue 3).

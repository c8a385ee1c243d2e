//! The two transports. Each forwards bytes unchanged and hands copies to the observer.

pub mod http;
pub mod stdio;

//! The two transports' relays. Each forwards bytes unchanged and hands copies on without
//! waiting: stdio to the tap ([`crate::tap`]), HTTP to its hand-off ([`crate::tap::http`]).
//! What they are given (server command, upstream, taps) comes from the wiring (`crate::run`);
//! they never import the observer, events or the reporter, so the relay cannot come to depend
//! on what observation does.

pub mod http;
pub mod stdio;

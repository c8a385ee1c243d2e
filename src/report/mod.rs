//! The reporter: batches filtered events and delivers them without ever blocking the relay.
//!
//! NOT YET BUILT (issue 4). Interface contract below.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::config::IngestTarget;
use crate::event::{Event, EventSink};
use crate::token::SensorToken;

/// Events queued between observer and batcher; when full the newest is dropped and counted.
pub const QUEUE_CAPACITY: usize = 10_000;

#[derive(Debug, Clone)]
pub struct ReportConfig {
    pub target: IngestTarget,
    pub token: Option<SensorToken>,
    pub flush: Duration,
    pub shutdown_flush: Duration,
    /// `"stdio"` or `"http"`.
    pub transport: &'static str,
    pub debug: bool,
}

/// The observer's handle on the queue.
#[derive(Clone)]
pub struct EventQueue {
    tx: mpsc::Sender<Event>,
    dropped: Arc<AtomicU64>,
}

impl EventSink for EventQueue {
    fn emit(&mut self, event: Event) {
        if self.tx.try_send(event).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ReportStats {
    pub delivered: u64,
    pub dropped: u64,
    pub batches: u64,
}

pub struct ReporterHandle {
    rx: mpsc::Receiver<Event>,
    dropped: Arc<AtomicU64>,
}

/// Starts the reporter on the current tokio runtime.
pub fn start(_cfg: ReportConfig) -> (EventQueue, ReporterHandle) {
    let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
    let dropped = Arc::new(AtomicU64::new(0));
    (
        EventQueue {
            tx,
            dropped: dropped.clone(),
        },
        ReporterHandle { rx, dropped },
    )
}

impl ReporterHandle {
    /// Flushes what is queued within the shutdown deadline and stops.
    pub async fn shutdown(mut self) -> ReportStats {
        self.rx.close();
        ReportStats {
            dropped: self.dropped.load(Ordering::Relaxed),
            ..Default::default()
        }
    }
}

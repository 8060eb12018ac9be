//! Priority classes at the LLM: interactive work goes first, batch work waits its turn. A batch line
//! ([`BatchLine`], set by the Batch API's runner as a request extension; a client cannot set it) takes one turn
//! at a time, only while no interactive job is in flight, and yields (is preempted) when one arrives.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tiergate_queue::Client;

pub(crate) use crate::model::request::BatchLine;

/// A batch line's turn at the LLM (released on drop).
pub(crate) struct Turn {
    _permit: tokio::sync::OwnedSemaphorePermit,
    line: BatchLine,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.line.holds_llm.store(false, Ordering::Release);
    }
}

/// The gate between the classes.
pub struct Gate {
    /// One batch LLM job at a time.
    batch_turn: std::sync::Arc<tokio::sync::Semaphore>,
    /// Notified when an interactive job wants the LLM.
    preempt: tokio::sync::Notify,
    /// How long a batch line waits for the interactive channel to go idle (`batch.max_llm_wait_ms`).
    max_wait: Duration,
}

impl Gate {
    /// A gate where a batch line waits at most `max_wait` for interactive work to end.
    pub(crate) fn new(max_wait: Duration) -> Self {
        Self {
            batch_turn: std::sync::Arc::new(tokio::sync::Semaphore::new(1)),
            preempt: tokio::sync::Notify::new(),
            max_wait,
        }
    }

    /// Before an LLM job. An interactive job passes at once (`None`) and asks a running batch job to yield.
    /// A batch line waits until a worker is live and the LLM is free of interactive work (at most
    /// `max_wait`); the returned turn is held until the LLM answered.
    pub(crate) async fn turn(&self, client: &Client, line: Option<&BatchLine>) -> Option<Turn> {
        let Some(line) = line else {
            self.preempt.notify_waiters();
            return None;
        };
        let permit = self.batch_turn.clone().acquire_owned().await.ok()?;
        let waited = Instant::now();
        while (client.in_flight() > 0 || client.live_workers() == 0)
            && waited.elapsed() < self.max_wait
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        line.holds_llm.store(true, Ordering::Release);
        Some(Turn {
            _permit: permit,
            line: line.clone(),
        })
    }

    /// Resolves at the next interactive job (a running batch job then checks whether to yield); it counts
    /// from its creation, not from its first poll.
    pub fn preempted(&self) -> tokio::sync::futures::Notified<'_> {
        self.preempt.notified()
    }
}

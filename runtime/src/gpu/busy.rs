//! How much work a shared GPU has queued: batches submitted and not yet finished, and the recent
//! GPU time per batch, so that a session about to plan can tell how long other sessions' work
//! will keep the GPU busy.
//!
//! Sits between the GPU layer (`gpu.rs`, which opens a `Ticket` per submitted batch and
//! reports each finished batch's GPU time) and the session, which asks
//! `Busy::expected_wait` before a run and plans around it (README, "Re-planning").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use web_time::Instant;

/// Weight of the newest batch in the running mean of GPU time per batch.
const MEAN_WEIGHT: f64 = 0.3;

/// In-flight batches of one GPU and the running mean of their GPU time.
#[derive(Debug, Default)]
pub struct Busy {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    inflight: HashMap<u64, Instant>,
    mean: Option<f64>,
}

/// One submitted batch; dropping it (when its `Submitted` is dropped) takes it out of flight.
#[derive(Debug)]
pub struct Ticket {
    busy: Arc<Busy>,
    id: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Ok(mut i) = self.busy.inner.lock() {
            i.inflight.remove(&self.id);
        }
    }
}

impl Busy {
    /// A batch was submitted now.
    pub fn start(self: &Arc<Self>) -> Ticket {
        let mut i = self.inner.lock().unwrap();
        let id = i.next;
        i.next += 1;
        i.inflight.insert(id, Instant::now());
        Ticket {
            busy: self.clone(),
            id,
        }
    }

    /// A batch finished after `gpu_time` of GPU work (timestamps, else its wall time).
    pub fn finished(&self, gpu_time: Duration) {
        let s = gpu_time.as_secs_f64();
        let mut i = self.inner.lock().unwrap();
        i.mean = Some(match i.mean {
            Some(m) => m + MEAN_WEIGHT * (s - m),
            None => s,
        });
    }

    /// Batches submitted and not yet waited for.
    pub fn in_flight(&self) -> usize {
        self.inner.lock().unwrap().inflight.len()
    }

    /// How long the batches in flight are expected to keep the GPU busy from now: the queue
    /// runs them in submission order, each for the mean GPU time per batch, from when it was
    /// submitted or when the one before it ended, whichever is later. Zero with nothing in
    /// flight or no batch finished yet.
    pub fn expected_wait(&self) -> Duration {
        let i = self.inner.lock().unwrap();
        let Some(mean) = i.mean else {
            return Duration::ZERO;
        };
        // Seconds since submission, oldest first.
        let mut ages: Vec<f64> = i
            .inflight
            .values()
            .map(|t| t.elapsed().as_secs_f64())
            .collect();
        ages.sort_by(|a, b| b.total_cmp(a));
        // Times relative to now.
        let end = ages
            .iter()
            .fold(f64::NEG_INFINITY, |end, &age| end.max(-age) + mean);
        Duration::from_secs_f64(end.max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_count_in_flight_and_the_wait_adds_up() {
        let b = Arc::new(Busy::default());
        assert_eq!(b.expected_wait(), Duration::ZERO);
        b.finished(Duration::from_millis(100));
        assert_eq!(b.expected_wait(), Duration::ZERO, "nothing in flight");
        let t1 = b.start();
        let t2 = b.start();
        assert_eq!(b.in_flight(), 2);
        let w = b.expected_wait().as_secs_f64();
        // Two fresh 100 ms batches: about 200 ms.
        assert!((0.15..=0.2).contains(&w), "{w}");
        drop(t1);
        let w = b.expected_wait().as_secs_f64();
        assert!((0.05..=0.1).contains(&w), "{w}");
        drop(t2);
        assert_eq!(b.in_flight(), 0);
        assert_eq!(b.expected_wait(), Duration::ZERO);
    }
}

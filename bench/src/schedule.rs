//! Open-loop request schedule, so measured latency includes queueing.
//!
//! Request `i` is due at `start + i / rate` whether or not earlier requests
//! have finished. A worker that takes a ticket already overdue (every
//! connection was busy) counts latency from the due time, so a slow server
//! cannot hide its backlog ("coordinated omission"). A worker that was idle
//! and woke late only because of its own timer counts from the real send.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Hands out request tickets to workers, for a fixed duration and/or count.
#[derive(Debug)]
pub struct Schedule {
    start: Instant,
    /// Nanoseconds between two due times; `None` = closed loop (as fast as possible).
    interval_ns: Option<f64>,
    end: Option<Instant>,
    limit: Option<u64>,
    next: AtomicU64,
}

/// One request to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    pub seq: u64,
    /// When the request should go out (open loop); `None` in closed loop.
    pub due: Option<Instant>,
}

impl Schedule {
    /// `rate` in requests per second (`None` = closed loop).
    pub fn new(
        start: Instant,
        rate: Option<f64>,
        duration: Option<Duration>,
        limit: Option<u64>,
    ) -> Schedule {
        Schedule {
            start,
            interval_ns: rate.filter(|r| *r > 0.0).map(|r| 1e9 / r),
            end: duration.map(|d| start + d),
            limit,
            next: AtomicU64::new(0),
        }
    }

    pub fn start(&self) -> Instant {
        self.start
    }

    pub fn is_open_loop(&self) -> bool {
        self.interval_ns.is_some()
    }

    /// When request `seq` is due in open loop.
    pub fn due(&self, seq: u64) -> Option<Instant> {
        self.interval_ns
            .map(|ns| self.start + Duration::from_nanos((seq as f64 * ns) as u64))
    }

    /// The next ticket, or `None` when the run is over at time `now`.
    pub fn take(&self, now: Instant) -> Option<Ticket> {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        if self.limit.is_some_and(|l| seq >= l) {
            return None;
        }
        let due = self.due(seq);
        // Open loop ends when the due time passes the end; closed loop when the clock does.
        let at = due.unwrap_or(now);
        if self.end.is_some_and(|end| at >= end) {
            return None;
        }
        Some(Ticket { seq, due })
    }
}

/// Where a request's latency starts: the due time if the ticket was already
/// overdue when taken (queueing behind busy connections counts), otherwise
/// the actual send (the load generator's own timer slack does not count).
pub fn latency_origin(due: Option<Instant>, taken: Instant, sent: Instant) -> Instant {
    match due {
        Some(due) if taken > due => due,
        _ => sent,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn open_loop_spaces_due_times_evenly() {
        let t0 = Instant::now();
        let s = Schedule::new(t0, Some(1000.0), Some(Duration::from_millis(10)), None);
        assert!(s.is_open_loop());
        let tickets: Vec<_> = std::iter::from_fn(|| s.take(t0)).collect();
        // 10 ms at 1000/s: due at 0,1,..,9 ms; the one due at 10 ms is past the end.
        assert_eq!(tickets.len(), 10);
        for (i, t) in tickets.iter().enumerate() {
            assert_eq!(t.seq, i as u64);
            assert_eq!(t.due, Some(t0 + Duration::from_millis(i as u64)));
        }
    }

    #[test]
    fn open_loop_ends_by_due_time_not_by_clock() {
        let t0 = Instant::now();
        let s = Schedule::new(t0, Some(100.0), Some(Duration::from_secs(1)), None);
        // Even when the worker runs late, every due request is still handed out.
        let late = t0 + Duration::from_secs(5);
        assert_eq!(std::iter::from_fn(|| s.take(late)).count(), 100);
    }

    #[test]
    fn closed_loop_stops_at_the_clock_or_count() {
        let t0 = Instant::now();
        let s = Schedule::new(t0, None, Some(Duration::from_secs(1)), None);
        assert!(!s.is_open_loop());
        assert_eq!(s.take(t0).unwrap().due, None);
        assert!(s.take(t0 + Duration::from_millis(999)).is_some());
        assert!(s.take(t0 + Duration::from_secs(1)).is_none());

        let s = Schedule::new(t0, None, None, Some(3));
        assert_eq!(std::iter::from_fn(|| s.take(t0)).count(), 3);
        let s = Schedule::new(t0, Some(1e6), None, Some(5));
        assert_eq!(std::iter::from_fn(|| s.take(t0)).count(), 5);
    }

    #[test]
    fn overdue_tickets_count_queueing() {
        let t0 = Instant::now();
        let due = t0 + Duration::from_millis(10);
        // Taken early, timer woke 1 ms late: latency from the real send.
        let sent = due + Duration::from_millis(1);
        assert_eq!(latency_origin(Some(due), t0, sent), sent);
        // Taken 5 ms after it was due (all connections busy): from the due time.
        let taken = due + Duration::from_millis(5);
        assert_eq!(latency_origin(Some(due), taken, taken), due);
        // Closed loop: always the send.
        assert_eq!(latency_origin(None, taken, sent), sent);
    }
}

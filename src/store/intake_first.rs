//! Intake first at SQLite's one write lock. Intake's commits and the
//! attempt writer's group commits take turns at the same lock; a group of
//! a few hundred attempt rows holds it for milliseconds, and a writer that
//! commits group after group wins the lock again before a waiting intake
//! batch (which retries in short steps, `sqlite_lock`) gets its turn: with
//! routing busy, intake's latency tail grew several times over. So intake
//! marks its write transactions, and the attempt writer, before it begins
//! a group, waits until no intake write is under way, for a bounded time
//! (a steady intake only makes routing's groups larger, never stops them).
//! PostgreSQL has no such lock: there the writer never waits.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// Longest the attempt writer waits for intake before it writes anyway.
pub(super) const LONGEST_YIELD: Duration = Duration::from_millis(10);

/// Intake's write transactions under way, and a bell when there are none.
#[derive(Debug, Default)]
pub(super) struct IntakeFirst {
    writing: AtomicUsize,
    idle: Notify,
}

/// Held while an intake write transaction runs.
pub(super) struct IntakeWriting<'a>(&'a IntakeFirst);

impl IntakeFirst {
    /// Marks an intake write under way until the guard is dropped.
    pub(super) fn writing(&self) -> IntakeWriting<'_> {
        self.writing.fetch_add(1, Ordering::SeqCst);
        IntakeWriting(self)
    }

    /// Returns once no intake write is under way, or after `at_most`.
    pub(super) async fn yield_to_intake(&self, at_most: Duration) {
        let deadline = tokio::time::Instant::now() + at_most;
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            // Registered before the count is read: a last writer ending in
            // between still wakes us.
            idle.as_mut().enable();
            if self.writing.load(Ordering::SeqCst) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return;
            }
        }
    }
}

impl Drop for IntakeWriting<'_> {
    fn drop(&mut self) {
        if self.0.writing.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn no_intake_write_means_no_wait() {
        let turns = IntakeFirst::default();
        let started = tokio::time::Instant::now();
        turns.yield_to_intake(Duration::from_secs(60)).await;
        assert!(started.elapsed() < Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn the_writer_goes_once_the_last_intake_write_ends() {
        let turns = Arc::new(IntakeFirst::default());
        let first = turns.writing();
        let second = turns.writing();
        let waiting = {
            let turns = turns.clone();
            tokio::spawn(async move {
                let started = tokio::time::Instant::now();
                turns.yield_to_intake(Duration::from_secs(60)).await;
                started.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(first);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !waiting.is_finished(),
            "one intake write is still under way"
        );
        drop(second);
        let waited = waiting.await.unwrap();
        assert!(waited >= Duration::from_secs(2) && waited < Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_intake_delays_the_writer_only_so_long() {
        let turns = IntakeFirst::default();
        let _never_ends = turns.writing();
        let started = tokio::time::Instant::now();
        turns.yield_to_intake(LONGEST_YIELD).await;
        assert_eq!(started.elapsed(), LONGEST_YIELD);
    }
}

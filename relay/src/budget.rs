//! How many rows a relay keeps in flight (in calls to Users): adaptive, up to
//! `--concurrency`.
//!
//! Users sheds calls beyond its `--max-concurrent-requests` (RESOURCE_EXHAUSTED, unjudged).
//! Several relays, each at its own `--concurrency`, can together exceed that limit; instead
//! of overrunning Users, each relay halves its rows in flight when a call is shed and grows
//! them back by one for every `limit` calls answered (a CreateUsers call of many rows counts
//! once, so with many rows to a call the limit grows back more slowly): additive increase,
//! multiplicative decrease, as TCP does with its window. One overrun sheds many calls at once, so the limit is cut at
//! most once per [`COOLDOWN`].

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

/// The least time between two cuts: about one round of calls.
const COOLDOWN: Duration = Duration::from_millis(100);

/// The adaptive limit on rows in flight.
#[derive(Debug)]
pub struct CallBudget {
    max: usize,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    limit: usize,
    /// Calls answered since the limit last grew.
    answered: usize,
    last_cut: Option<Instant>,
}

impl CallBudget {
    /// Starts at `max`, the most rows ever in flight.
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        Self {
            max,
            state: Mutex::new(State {
                limit: max,
                answered: 0,
                last_cut: None,
            }),
        }
    }

    /// How many rows may be in flight now.
    pub fn limit(&self) -> usize {
        self.lock().limit
    }

    /// Users judged a call (whatever its answer): one step towards one more call in flight.
    pub fn answered(&self) {
        let mut state = self.lock();
        state.answered += 1;
        if state.answered >= state.limit && state.limit < self.max {
            state.limit += 1;
            state.answered = 0;
        }
    }

    /// Users shed a call: halve the rows in flight, unless they were just cut. Returns the
    /// new limit when it was cut.
    pub fn shed(&self) -> Option<usize> {
        self.shed_at(Instant::now())
    }

    /// [`CallBudget::shed`] at `now`.
    fn shed_at(&self, now: Instant) -> Option<usize> {
        let mut state = self.lock();
        if state
            .last_cut
            .is_some_and(|last| now.duration_since(last) < COOLDOWN)
        {
            return None;
        }
        state.limit = (state.limit / 2).max(1);
        state.answered = 0;
        state.last_cut = Some(now);
        Some(state.limit)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent whatever panicked while holding it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shed_halves_the_limit_once_per_cooldown_and_answers_grow_it_back() {
        let budget = CallBudget::new(64);
        assert_eq!(budget.limit(), 64);
        assert_eq!(budget.shed(), Some(32));
        // The rest of the same overrun changes nothing.
        assert_eq!(budget.shed(), None);
        assert_eq!(budget.limit(), 32);
        // One more call in flight per `limit` calls answered.
        for _ in 0..31 {
            budget.answered();
        }
        assert_eq!(budget.limit(), 32);
        budget.answered();
        assert_eq!(budget.limit(), 33);
        // The count starts again at each step: 33 more answers for the next one, not one.
        for _ in 0..32 {
            budget.answered();
        }
        assert_eq!(budget.limit(), 33);
        budget.answered();
        assert_eq!(budget.limit(), 34);
        // Never above the configured maximum, never below one.
        for _ in 0..100_000 {
            budget.answered();
        }
        assert_eq!(budget.limit(), 64);
        let tiny = CallBudget::new(1);
        assert_eq!(tiny.shed(), Some(1));
    }

    /// Under a lasting overload the limit keeps halving, once per cooldown: several relays
    /// shed by one Users get below its limit within a second or so.
    #[test]
    fn a_lasting_overload_cuts_again_after_each_cooldown() {
        let budget = CallBudget::new(64);
        let start = Instant::now();
        assert_eq!(budget.shed_at(start), Some(32));
        assert_eq!(budget.shed_at(start + COOLDOWN / 2), None);
        assert_eq!(budget.shed_at(start + COOLDOWN), Some(16));
        assert_eq!(budget.shed_at(start + COOLDOWN * 2), Some(8));
        assert_eq!(COOLDOWN, Duration::from_millis(100), "README says 100 ms");
    }

    #[test]
    fn answers_counted_before_a_cut_do_not_count_after_it() {
        // At its maximum the relay counts answers without growing; then Users sheds.
        let budget = CallBudget::new(32);
        for _ in 0..31 {
            budget.answered();
        }
        assert_eq!(budget.shed(), Some(16));
        for _ in 0..15 {
            budget.answered();
        }
        assert_eq!(
            budget.limit(),
            16,
            "the 31 answers before the cut were forgotten"
        );
        budget.answered();
        assert_eq!(budget.limit(), 17);
    }
}

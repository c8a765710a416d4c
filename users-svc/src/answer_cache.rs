//! The answers this process saved or read from the inbox lately, kept in memory, so that a
//! repeated key is answered without a database round trip.
//!
//! It can only say what the inbox table says: an inbox row never changes once committed,
//! and an answer is remembered only after the transaction that wrote it committed, or
//! after it was read from the table. It never outlives the table either: an answer is
//! forgotten once it is older than `--inbox-retention`, the age at which the table may
//! purge its row, counted from a moment no later than the row's own `created_at`. So the
//! cache changes how fast Users answers a repeat, never what it answers; each replica
//! keeps its own, and a miss asks the table.

use std::{sync::Mutex, time::Duration};

use chrono::{DateTime, Utc};
use hashlink::LruCache;

use crate::{entity::inbox::SavedOutcome, inbox::Request};

/// The most recently used answers, up to a number of keys (`--inbox-cache-entries`).
#[derive(Debug)]
pub struct AnswerCache {
    /// `None` when the cache is off (capacity 0).
    entries: Option<Mutex<LruCache<String, Remembered>>>,
    /// The inbox's retention: older answers are forgotten.
    retention: Duration,
}

#[derive(Debug, Clone)]
struct Remembered {
    request_hash: String,
    outcome: SavedOutcome,
    /// No later than the inbox row's `created_at`.
    saved_at: DateTime<Utc>,
}

/// What the cache knows of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recalled {
    pub request_hash: String,
    pub outcome: SavedOutcome,
}

impl AnswerCache {
    /// A cache of at most `capacity` keys (0: off) for an inbox keeping keys `retention`.
    pub fn new(capacity: usize, retention: Duration) -> Self {
        Self {
            entries: (capacity > 0).then(|| Mutex::new(LruCache::new(capacity))),
            retention,
        }
    }

    /// No cache: every question goes to the table.
    pub fn off() -> Self {
        Self::new(0, Duration::ZERO)
    }

    /// The answer saved under `key`, if it was remembered and is not older than the
    /// retention at `now`.
    pub fn recall(&self, key: &str, now: DateTime<Utc>) -> Option<Recalled> {
        let mut entries = lock(self.entries.as_ref()?);
        let remembered = entries.get(key)?;
        if now
            .signed_duration_since(remembered.saved_at)
            .to_std()
            .ok()?
            >= self.retention
        {
            entries.remove(key);
            return None;
        }
        Some(Recalled {
            request_hash: remembered.request_hash.clone(),
            outcome: remembered.outcome.clone(),
        })
    }

    /// Remembers what the inbox holds for `request`: call only once its row is committed,
    /// with a `saved_at` no later than the row's `created_at`.
    pub fn remember(&self, request: Request<'_>, outcome: &SavedOutcome, saved_at: DateTime<Utc>) {
        if let Some(entries) = &self.entries {
            lock(entries).insert(
                request.key.to_owned(),
                Remembered {
                    request_hash: request.request_hash.to_owned(),
                    outcome: outcome.clone(),
                    saved_at,
                },
            );
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A cache entry is written whole under the lock; whatever panicked left it usable.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn request<'a>(key: &'a str) -> Request<'a> {
        Request {
            key,
            request_hash: "hash",
        }
    }

    fn created() -> SavedOutcome {
        SavedOutcome::Created {
            user_id: Uuid::nil(),
        }
    }

    #[test]
    fn an_answer_is_recalled_until_it_is_as_old_as_the_retention() {
        let cache = AnswerCache::new(10, HOUR);
        let saved_at = Utc::now();
        cache.remember(request("k"), &created(), saved_at);
        let recalled = cache.recall("k", saved_at + chrono::Duration::minutes(59));
        assert_eq!(
            recalled,
            Some(Recalled {
                request_hash: "hash".into(),
                outcome: created()
            })
        );
        assert_eq!(
            cache.recall("k", saved_at + chrono::Duration::hours(1)),
            None
        );
        // Forgotten, not just hidden: even an earlier clock no longer finds it.
        assert_eq!(cache.recall("k", saved_at), None);
        assert_eq!(cache.recall("unknown", saved_at), None);
    }

    #[test]
    fn the_least_recently_used_key_goes_first_and_capacity_zero_is_off() {
        let cache = AnswerCache::new(2, HOUR);
        let now = Utc::now();
        cache.remember(request("a"), &created(), now);
        cache.remember(request("b"), &created(), now);
        assert!(cache.recall("a", now).is_some());
        cache.remember(request("c"), &created(), now);
        assert!(
            cache.recall("b", now).is_none(),
            "b was used least recently"
        );
        assert!(cache.recall("a", now).is_some());
        assert!(cache.recall("c", now).is_some());

        let off = AnswerCache::off();
        off.remember(request("a"), &created(), now);
        assert_eq!(off.recall("a", now), None);
    }

    /// Only capacity 0 turns the cache off: a cache of one key remembers that key.
    #[test]
    fn a_cache_of_one_key_recalls_it() {
        let cache = AnswerCache::new(1, HOUR);
        let now = Utc::now();
        cache.remember(request("k"), &created(), now);
        assert_eq!(
            cache.recall("k", now),
            Some(Recalled {
                request_hash: "hash".into(),
                outcome: created()
            })
        );
    }
}

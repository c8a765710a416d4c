//! When to try a row again after a transient failure: capped exponential backoff with full
//! jitter, so many rows failing together (Users down) do not come back together.

use std::time::Duration;

/// The delay before attempt `attempts + 1`, after `attempts` (≥ 1) failed attempts: a
/// random duration in `[0, min(max, base · 2^(attempts-1))]`.
pub fn retry_delay(attempts: u32, base: Duration, max: Duration) -> Duration {
    let ceiling = exponential_ceiling(attempts, base, max);
    ceiling.mul_f64(fastrand::f64())
}

/// The upper bound of [`retry_delay`] for a number of failed attempts.
pub fn exponential_ceiling(attempts: u32, base: Duration, max: Duration) -> Duration {
    // Past 31 doublings the product saturates anyway; the cap keeps the shift in range.
    let doublings = attempts.saturating_sub(1).min(31);
    base.saturating_mul(1u32 << doublings).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(60);

    #[test]
    fn the_ceiling_doubles_then_stays_at_the_cap() {
        let ceilings: Vec<_> = (1..=9)
            .map(|attempt| exponential_ceiling(attempt, BASE, MAX).as_millis())
            .collect();
        assert_eq!(
            ceilings,
            [
                500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000
            ]
        );
        assert_eq!(exponential_ceiling(u32::MAX, BASE, MAX), MAX);
    }

    #[test]
    fn delays_are_jittered_within_the_ceiling() {
        let delays: Vec<_> = (0..200).map(|_| retry_delay(4, BASE, MAX)).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(4)));
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 100, "jitter spreads the delays");
    }
}

//! Latency percentiles, rates, and how processes used the machine.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Percentiles of a set of durations, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Latency {
    pub count: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    /// Summarises `samples` (any order).
    pub fn of(mut samples: Vec<Duration>) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort();
        let at = |p: f64| {
            let index = ((samples.len() - 1) as f64 * p).round() as usize;
            samples[index].as_secs_f64() * 1e3
        };
        Self {
            count: samples.len(),
            p50_ms: at(0.50),
            p90_ms: at(0.90),
            p99_ms: at(0.99),
            max_ms: at(1.0),
        }
    }
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            self.p50_ms, self.p90_ms, self.p99_ms, self.max_ms
        )
    }
}

/// What one process cost: CPU seconds (user + system) and its peak resident memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessCost {
    pub name: String,
    pub cpu_seconds: f64,
    pub peak_rss_mb: f64,
}

impl ProcessCost {
    /// Reads `/proc/<pid>` of a running process (Linux).
    pub fn read(name: &str, pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name (which is in parentheses): utime is the 14th field
        // of the line, stime the 15th, i.e. the 12th and 13th after the name.
        let after_name = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let ticks: f64 =
            fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
        let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100) as f64;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let peak_kb: f64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some(Self {
            name: name.to_owned(),
            cpu_seconds: ticks / per_second,
            peak_rss_mb: peak_kb / 1024.0,
        })
    }
}

/// `numerator / denominator`, or 0 when there is no denominator.
pub fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator > 0.0 {
        numerator / denominator
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each percentile is the sample at that rank (nearest rank), whatever the order.
    #[test]
    fn percentiles_are_read_at_their_rank() {
        let mut samples: Vec<Duration> = (1..=101).map(Duration::from_millis).collect();
        samples.reverse();
        samples.swap(3, 70);
        let latency = Latency::of(samples);
        assert_eq!(latency.count, 101);
        assert_eq!(
            (
                latency.p50_ms,
                latency.p90_ms,
                latency.p99_ms,
                latency.max_ms
            ),
            (51.0, 91.0, 100.0, 101.0)
        );
        let none = Latency::of(Vec::new());
        assert_eq!((none.count, none.max_ms), (0, 0.0));
    }

    /// The peak, not what is resident when it is read: costs are read after the load.
    #[test]
    fn a_processs_cost_shows_its_peak_memory() {
        let mut held = vec![0_u8; 256 << 20];
        for page in held.chunks_mut(4096) {
            page[0] = 1;
        }
        drop(std::hint::black_box(held));
        let cost = ProcessCost::read("self", std::process::id()).expect("/proc of this process");
        assert!(cost.peak_rss_mb >= 256.0, "{cost:?}");
    }
}

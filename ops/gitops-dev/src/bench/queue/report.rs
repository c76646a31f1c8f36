//! The figures `bench queue` prints, and the arithmetic behind them: rates,
//! medians of repeated runs, latency percentiles.

use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::stats::TableTuples;
use crate::bench::cpu::HostShare;

/// The one JSON object on stdout. Field order is the output order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueBenchReport {
    pub operations: u64,
    pub agents: usize,
    pub producers: usize,
    pub rate: Option<f64>,
    /// Median over the runs: one-row autocommit inserts into an unindexed table.
    pub baseline_commit_per_s: f64,
    /// Median: the writer's enqueue transaction with `signal_raise` switched off.
    pub no_notify_enqueue_per_s: f64,
    /// Median: the writer's enqueue transaction, no agent running (None with a rate).
    pub enqueue_per_s: Option<f64>,
    /// A backlog of `operations` drained by the agents (None with a rate).
    pub drain_per_s: Option<f64>,
    /// Operations over the time from the first enqueue until all completed.
    pub overlap_per_s: f64,
    /// `claimed_at − created_at` in the overlap phase.
    pub latency_ms: LatencyMs,
    /// Δ`xact_commit` of the database ÷ operations in the overlap phase, enqueue
    /// transactions included.
    pub commits_per_op: f64,
    /// The overlap at half the enqueue rate (None with a rate).
    pub half_load: Option<HalfLoad>,
    /// In which of its agent's claim batches a quiet tenant's operation went while
    /// 5,000 of another tenant's waited (1 = the agent's first; None with a rate or
    /// one producer).
    pub quiet_claim_batches: Option<u64>,
    /// The figures again with a snapshot held (`--hold-snapshot`).
    pub held: Option<HeldReport>,
    /// The machine's steal and I/O wait over each measured phase: a phase that lost
    /// a large share to either measured the host, not the queue.
    pub host: Vec<PhaseHost>,
    /// Operations the handler was given more than once.
    pub double_completions: u64,
    /// Operations not where they should be at the end of a phase, over all phases.
    pub lost: u64,
}

/// The overlap phase with producers at half the enqueue rate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HalfLoad {
    /// Operations per second the producers were scheduled at.
    pub rate: f64,
    pub overlap_per_s: f64,
    pub latency_ms: LatencyMs,
    pub commits_per_op: f64,
}

/// What was measured while a REPEATABLE READ transaction was held, and after.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeldReport {
    /// Operations pushed through before measuring.
    pub preloaded: u64,
    /// Median: the enqueue runs that made the drains' backlogs (agents stopped).
    pub enqueue_per_s: f64,
    /// Median of as many drains as the clean figure's.
    pub drain_per_s: f64,
    pub overlap_per_s: f64,
    pub latency_ms: LatencyMs,
    pub commits_per_op: f64,
    pub half_load: HalfLoad,
    /// The queue's tables at the end of the held runs.
    pub dead_tuples: Vec<TableTuples>,
    /// Held ÷ clean, same sitting.
    pub drain_ratio: f64,
    pub overlap_ratio: f64,
    pub claim_p99_ratio: f64,
    /// Seconds after the release when the drain was back to 0.95× clean (None: not
    /// within the time the benchmark waits).
    pub recovery_s: Option<f64>,
    pub recovery: Vec<RecoveryRun>,
}

/// One drain after the snapshot was released.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecoveryRun {
    pub after_s: f64,
    pub drain_per_s: f64,
    pub operation_n_dead_tup: i64,
}

/// The machine's steal and I/O wait (percent of its CPU time, `/proc/stat`) over one
/// measured phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseHost {
    /// `clean`, `held` (snapshot held) or `recovery` (after its release).
    pub stage: &'static str,
    /// `baseline`, `no-notify enqueue`, `enqueue`, `held enqueue`, `recovery
    /// enqueue`, `drain`, `overlap` or `half load`.
    pub phase: &'static str,
    /// The phase's run within its stage, from 1.
    pub run: usize,
    #[serde(flatten)]
    pub share: HostShare,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencyMs {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl QueueBenchReport {
    pub fn to_json(&self) -> String {
        // A struct of numbers always serializes.
        serde_json::to_string(self).unwrap_or_else(|error| format!("{{\"error\":\"{error}\"}}"))
    }
}

/// Operations per second, to one decimal.
pub fn per_second(operations: u64, elapsed: Duration) -> f64 {
    round(operations as f64 / elapsed.as_secs_f64().max(1e-9), 1)
}

/// The median (the mean of the middle two for an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Nearest-rank percentile `p` (0 < p ≤ 100) of ascending `sorted`; 0 for none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Latency percentiles of samples in milliseconds, to a hundredth.
pub fn latency(mut samples_ms: Vec<f64>) -> LatencyMs {
    samples_ms.sort_by(f64::total_cmp);
    LatencyMs {
        p50: round(percentile(&samples_ms, 50.0), 2),
        p95: round(percentile(&samples_ms, 95.0), 2),
        p99: round(percentile(&samples_ms, 99.0), 2),
        max: round(samples_ms.last().copied().unwrap_or(0.0), 2),
    }
}

/// Milliseconds from `from` to `to`, negative when `to` is earlier.
pub fn millis(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(later) => later.as_secs_f64() * 1000.0,
        Err(earlier) => -earlier.duration().as_secs_f64() * 1000.0,
    }
}

/// `part / whole` to a hundredth; 0 when `whole` is 0.
pub fn ratio(part: f64, whole: f64) -> f64 {
    if whole == 0.0 { 0.0 } else { round(part / whole, 2) }
}

pub fn round(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&samples, 50.0), 50.0);
        assert_eq!(percentile(&samples, 99.0), 99.0);
        assert_eq!(percentile(&samples, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 1.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
        let l = latency(vec![3.0, 1.0, 2.0, 10.0]);
        assert_eq!((l.p50, l.p95, l.p99, l.max), (2.0, 10.0, 10.0, 10.0));
    }

    #[test]
    fn intervals_are_signed_milliseconds() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        assert_eq!(millis(t, t + Duration::from_micros(2500)), 2.5);
        assert_eq!(millis(t + Duration::from_millis(3), t), -3.0);
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn rates_are_rounded_to_a_tenth() {
        assert_eq!(per_second(1000, Duration::from_millis(300)), 3333.3);
    }

    #[test]
    fn the_report_keeps_its_field_order_and_nulls() {
        let report = QueueBenchReport {
            operations: 10,
            agents: 2,
            producers: 8,
            rate: None,
            baseline_commit_per_s: 1.5,
            no_notify_enqueue_per_s: 2.0,
            enqueue_per_s: None,
            drain_per_s: Some(3.0),
            overlap_per_s: 4.0,
            latency_ms: LatencyMs { p50: 1.0, p95: 2.0, p99: 3.0, max: 4.0 },
            commits_per_op: 1.25,
            half_load: None,
            quiet_claim_batches: Some(1),
            held: None,
            host: vec![PhaseHost {
                stage: "clean",
                phase: "drain",
                run: 1,
                share: HostShare { steal_pct: 12.5, iowait_pct: 0.0 },
            }],
            double_completions: 0,
            lost: 0,
        };
        assert_eq!(
            report.to_json(),
            "{\"operations\":10,\"agents\":2,\"producers\":8,\"rate\":null,\"baseline_commit_per_s\":1.5,\
             \"no_notify_enqueue_per_s\":2.0,\"enqueue_per_s\":null,\"drain_per_s\":3.0,\"overlap_per_s\":4.0,\
             \"latency_ms\":{\"p50\":1.0,\"p95\":2.0,\"p99\":3.0,\"max\":4.0},\"commits_per_op\":1.25,\
             \"half_load\":null,\"quiet_claim_batches\":1,\"held\":null,\"host\":[{\"stage\":\"clean\",\"phase\":\"drain\",\
             \"run\":1,\"steal_pct\":12.5,\"iowait_pct\":0.0}],\"double_completions\":0,\"lost\":0}"
        );
    }
}

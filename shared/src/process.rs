//! The process's own resources, for every binary's metrics and for the benchmarks:
//! resident memory now and at its peak, heap in use (the allocator's statistics),
//! threads and open files. Read from `/proc` (Linux); what cannot be read is None.

use std::sync::atomic::{AtomicBool, Ordering};

/// One reading of a process's resources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProcessStats {
    pub resident_bytes: Option<u64>,
    pub peak_resident_bytes: Option<u64>,
    pub threads: Option<u64>,
    pub open_fds: Option<u64>,
    /// Bytes the allocator has handed out and not had back (jemalloc's
    /// `stats.allocated`); None when this process does not run on jemalloc.
    pub heap_allocated_bytes: Option<u64>,
}

impl ProcessStats {
    /// This process now.
    pub fn current() -> ProcessStats {
        let mut stats = ProcessStats::of_pid("self");
        stats.heap_allocated_bytes = heap_allocated();
        stats
    }

    /// Process `pid` ("self" for this one) as `/proc` shows it; no heap figure.
    pub fn of_pid(pid: &str) -> ProcessStats {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let open_fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok().map(|dir| dir.count() as u64);
        ProcessStats {
            resident_bytes: status_kb(&status, "VmRSS:").map(|kb| kb * 1024),
            peak_resident_bytes: status_kb(&status, "VmHWM:").map(|kb| kb * 1024),
            threads: status_kb(&status, "Threads:"),
            open_fds,
            heap_allocated_bytes: None,
        }
    }

    /// The Prometheus text exposition of the figures read.
    pub fn render(&self, out: &mut String) {
        let series = [
            ("process_resident_memory_bytes", "Resident memory of the process.", self.resident_bytes),
            ("process_peak_resident_memory_bytes", "Peak resident memory of the process.", self.peak_resident_bytes),
            ("process_heap_allocated_bytes", "Heap in use, by the allocator's statistics.", self.heap_allocated_bytes),
            ("process_threads", "Threads of the process.", self.threads),
            ("process_open_fds", "Open file descriptors of the process.", self.open_fds),
        ];
        for (name, help, value) in series {
            if let Some(value) = value {
                crate::exposition::gauge(out, name, help, value);
            }
        }
    }
}

/// Starts process `pid`'s ("self" for this one) peak resident memory afresh from
/// its resident memory now (`/proc/PID/clear_refs`, Linux 4.0 on), so that the next
/// reading's peak is the largest since this call: a process whose memory rises and
/// falls between readings is judged by its real maximum, not by where the readings
/// happened to fall.
pub fn reset_peak_resident(pid: &str) -> std::io::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
}

/// The number of a `/proc/*/status` line (kB for memory lines).
fn status_kb(status: &str, key: &str) -> Option<u64> {
    let rest = status.lines().find_map(|line| line.strip_prefix(key))?;
    rest.trim().trim_end_matches("kB").trim().parse().ok()
}

/// Whether this process runs on jemalloc (its binary says so at start).
static ON_JEMALLOC: AtomicBool = AtomicBool::new(false);

/// Called first thing by a binary whose global allocator is jemalloc: its heap
/// figure is then read from jemalloc's statistics, and one background thread
/// returns freed pages to the system once they have been unused for jemalloc's
/// decay time (10 s). Without it, pages are purged only when the process happens
/// to allocate again, so a burst (a sweep's page of objects) followed by a quiet
/// spell leaves the resident size at the burst's height.
pub fn heap_statistics_from_jemalloc() {
    ON_JEMALLOC.store(true, Ordering::Relaxed);
    let purging = tikv_jemalloc_ctl::max_background_threads::write(1)
        .and_then(|()| tikv_jemalloc_ctl::background_thread::write(true));
    if let Err(error) = purging {
        tracing::debug!(%error, "jemalloc's background purging is unavailable");
    }
}

/// jemalloc's `stats.allocated`, refreshed first (its statistics are cached per
/// epoch); None when the process runs on another allocator.
fn heap_allocated() -> Option<u64> {
    if !ON_JEMALLOC.load(Ordering::Relaxed) {
        return None;
    }
    tikv_jemalloc_ctl::epoch::advance().ok()?;
    tikv_jemalloc_ctl::stats::allocated::read().ok().map(|bytes| bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_read_from_proc() {
        let stats = ProcessStats::current();
        assert!(stats.resident_bytes.is_some_and(|rss| rss > 0), "{stats:?}");
        assert!(stats.peak_resident_bytes >= stats.resident_bytes, "{stats:?}");
        assert!(stats.threads.is_some_and(|t| t >= 1), "{stats:?}");
        assert!(stats.open_fds.is_some_and(|n| n >= 3), "{stats:?}");
        let mut out = String::new();
        stats.render(&mut out);
        assert!(out.contains("# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes "), "{out}");
        assert!(out.contains("\nprocess_open_fds "), "{out}");
    }

    #[test]
    fn figures_not_read_are_left_out() {
        let stats = ProcessStats::of_pid("no-such-process");
        assert_eq!(stats, ProcessStats::default());
        let mut out = String::new();
        stats.render(&mut out);
        assert!(out.is_empty(), "{out}");
    }

    #[test]
    fn a_reset_peak_starts_again_from_the_resident_memory() {
        // Touch 64 MB, give it back, and the peak stays up until it is reset.
        let block = vec![1u8; 64 << 20];
        assert!(block.iter().step_by(4096).all(|b| *b == 1));
        drop(block);
        let before = ProcessStats::of_pid("self").peak_resident_bytes.expect("VmHWM");
        reset_peak_resident("self").expect("clear_refs");
        let after = ProcessStats::of_pid("self");
        let peak = after.peak_resident_bytes.expect("VmHWM");
        assert!(peak + (32 << 20) < before, "peak {peak} after the reset, {before} before");
        assert!(peak >= after.resident_bytes.expect("VmRSS") / 2, "{after:?}");
    }
}

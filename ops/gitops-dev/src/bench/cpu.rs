//! CPU time per component, read from `/proc/<pid>/stat`, so a benchmark can say
//! which process the time went to (and in which stage): the writer, the agent,
//! PostgreSQL (the postmaster and every backend, live or finished) and this
//! process (the emulator and the Argo CD stand-in run in it, with the benchmark's
//! own clients). Also the whole machine's share of time lost to other guests
//! (steal) and to waiting on I/O, from `/proc/stat`, so a run that was starved of
//! CPU can be told from a slow one by its JSON alone.

use std::collections::HashMap;

/// Linux reports `/proc` CPU times in USER_HZ ticks, 100 per second on every
/// architecture's ABI.
const TICKS_PER_S: f64 = 100.0;

/// CPU seconds (user + system) per component.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct CpuSeconds {
    pub writer: f64,
    pub agent: f64,
    pub postgres: f64,
    /// This process: the emulator, the Argo CD stand-in and the benchmark's clients.
    pub stack: f64,
}

impl std::ops::Sub for CpuSeconds {
    type Output = CpuSeconds;

    fn sub(self, earlier: CpuSeconds) -> CpuSeconds {
        CpuSeconds {
            writer: self.writer - earlier.writer,
            agent: self.agent - earlier.agent,
            postgres: self.postgres - earlier.postgres,
            stack: self.stack - earlier.stack,
        }
    }
}

/// (utime, stime, cutime, cstime, ppid) of a process, in ticks.
fn stat(pid: &str) -> Option<(u64, u64, u64, u64, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields start after its closing parenthesis.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    Some((field(14)?, field(15)?, field(16)?, field(17)?, u32::try_from(field(4)?).ok()?))
}

/// The machine's CPU time so far, summed over its CPUs, in ticks: `/proc/stat`'s
/// first line.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostTicks {
    total: u64,
    iowait: u64,
    steal: u64,
}

impl HostTicks {
    /// Now; zeros where `/proc/stat` cannot be read (the shares are then 0).
    pub fn now() -> HostTicks {
        std::fs::read_to_string("/proc/stat").ok().and_then(|text| HostTicks::parse(&text)).unwrap_or_default()
    }

    /// `cpu  user nice system idle iowait irq softirq steal [guest guest_nice]`;
    /// guest time is already counted in user and nice.
    fn parse(text: &str) -> Option<HostTicks> {
        let line = text.lines().next()?;
        let mut fields = line.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let ticks: Vec<u64> = fields.take(8).map(|field| field.parse().ok()).collect::<Option<_>>()?;
        let [.., iowait, _, _, steal] = ticks[..] else { return None };
        Some(HostTicks { total: ticks.iter().sum(), iowait, steal })
    }

    /// What share of the machine's time since `earlier` went to steal and to I/O wait.
    pub fn since(self, earlier: HostTicks) -> HostShare {
        let total = self.total.saturating_sub(earlier.total);
        let pct = |now: u64, then: u64| match total {
            0 => 0.0,
            _ => (now.saturating_sub(then) as f64 * 1000.0 / total as f64).round() / 10.0,
        };
        HostShare { steal_pct: pct(self.steal, earlier.steal), iowait_pct: pct(self.iowait, earlier.iowait) }
    }
}

/// Shares of the machine's CPU time over an interval, in percent to a tenth: taken
/// by the hypervisor for other guests (`steal`), and idle while I/O was pending.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct HostShare {
    pub steal_pct: f64,
    pub iowait_pct: f64,
}

/// A process's own CPU seconds (0 when it is gone).
pub fn process_s(pid: Option<u32>) -> f64 {
    pid.and_then(|pid| stat(&pid.to_string())).map_or(0.0, |(u, s, _, _, _)| (u + s) as f64 / TICKS_PER_S)
}

/// A process and its children, live (their own time) and reaped (`cutime`/`cstime`).
pub fn tree_s(pid: Option<u32>) -> f64 {
    let Some(root) = pid else { return 0.0 };
    let Some((u, s, cu, cs, _)) = stat(&root.to_string()) else { return 0.0 };
    let mut ticks = u + s + cu + cs;
    let Ok(entries) = std::fs::read_dir("/proc") else { return ticks as f64 / TICKS_PER_S };
    let mut children: HashMap<u32, u64> = HashMap::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else { continue };
        if let Some((u, s, _, _, ppid)) = stat(name)
            && ppid == root
            && let Ok(pid) = name.parse()
        {
            children.insert(pid, u + s);
        }
    }
    ticks += children.values().sum::<u64>();
    ticks as f64 / TICKS_PER_S
}

/// This process's CPU seconds.
pub fn own_s() -> f64 {
    process_s(Some(std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_cpu_time_is_read_and_grows() {
        let before = own_s();
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1, "keep the loop");
        let own = own_s();
        assert!(own > before, "{before}");
        // Read after: the process keeps running between the two reads.
        assert!(tree_s(Some(std::process::id())) >= own);
        assert_eq!(process_s(None), 0.0);
    }

    #[test]
    fn the_machines_steal_and_io_wait_are_shares_of_its_time() {
        let earlier = HostTicks::parse("cpu  100 0 50 800 30 0 10 10 0 0\ncpu0 1 2 3\n").expect("parses");
        let later = HostTicks::parse("cpu  400 0 150 1100 80 0 20 250 7 0\n").expect("parses");
        // 1,000 ticks passed: 240 stolen, 50 waiting on I/O.
        assert_eq!(later.since(earlier), HostShare { steal_pct: 24.0, iowait_pct: 5.0 });
        assert_eq!(earlier.since(earlier), HostShare::default());
        assert_eq!(HostTicks::parse("intr 1 2 3\n"), None);
        assert_eq!(HostTicks::parse("cpu  1 2 3\n"), None);
        let now = HostTicks::now();
        assert!(now.total > 0, "{now:?}");
    }
}

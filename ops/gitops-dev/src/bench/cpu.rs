//! CPU time per component, read from `/proc/<pid>/stat`, so a benchmark can say
//! which process the time went to (and in which stage): the writer, the agent,
//! PostgreSQL (the postmaster and every backend, live or finished) and this
//! process (the emulator and the Argo CD stand-in run in it, with the benchmark's
//! own clients).

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
}

//! What this machine and a process use, read from `/proc`: CPU time (the machine's and a
//! process's) and a process's resident memory. The benchmarks print these beside their
//! figures, so a reader sees how busy the shared machine was and what a figure cost.

/// This machine's CPU time so far, (busy, all), in clock ticks (`/proc/stat`'s first line).
pub fn cpu_ticks() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = text
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let all: u64 = v.iter().take(8).sum();
    // idle and iowait
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (all - idle, all)
}

/// How busy this machine's CPUs were since `from` (a [`cpu_ticks`] reading), in percent.
pub fn cpu_busy_since(from: (u64, u64)) -> f64 {
    let now = cpu_ticks();
    let all = now.1.saturating_sub(from.1).max(1);
    100.0 * now.0.saturating_sub(from.0) as f64 / all as f64
}

/// CPU seconds (user and system, every thread) a process has used so far; 0 once it is gone.
pub fn process_cpu_s(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // the fields after the command name, which may hold spaces: state is field 3, utime 14
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    // SAFETY: sysconf only reads a constant of the system
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    f.iter().sum::<u64>() as f64 / hz
}

/// A process's resident memory now (`VmRSS`) and at its peak (`VmHWM`), in bytes; None when
/// the process is gone.
pub fn rss_bytes(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |field: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(field))?;
        line[field.len()..]
            .split_whitespace()
            .next()?
            .parse::<u64>()
            .ok()
    };
    Some((kib("VmRSS:")? * 1024, kib("VmHWM:")? * 1024))
}

/// Start a process's peak resident memory (`VmHWM`) over from its current size, so the
/// peak measures a phase rather than the whole life of the process; false when the kernel
/// does not allow it (`/proc/PID/clear_refs`, value 5).
pub fn reset_peak_rss(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process uses CPU and memory, and its peak is never below its current size.
    #[test]
    fn this_process_is_measured() {
        let me = std::process::id();
        // spin until the kernel has counted a tick of CPU time (a loaded machine may give
        // this thread none for a while: no wall-clock bound but a generous one)
        let spin = std::time::Instant::now();
        while process_cpu_s(me) == 0.0 {
            assert!(
                spin.elapsed() < std::time::Duration::from_secs(60),
                "no CPU time counted after a minute of spinning"
            );
            std::hint::black_box(spin.elapsed());
        }
        let (now, peak) = rss_bytes(me).expect("this process is running");
        assert!(now > 0 && peak >= now, "rss {now}, peak {peak}");
        let (busy, all) = cpu_ticks();
        assert!(all > 0 && busy <= all);
        // a pid that cannot be running
        assert_eq!(process_cpu_s(u32::MAX), 0.0);
        assert!(rss_bytes(u32::MAX).is_none());
    }
}

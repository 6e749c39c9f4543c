//! CPU time of a process, from `/proc/PID/stat`: what the benchmarks charge
//! to the relay or broker they measure (and to themselves).

use anyhow::Context;

/// Clock ticks per second, the unit of `/proc/PID/stat`'s times.
pub fn ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// CPU time (user + system) used so far by process `pid`, in clock ticks.
pub fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    // The command name may contain spaces: fields resume after the last ')'.
    let rest = s.rsplit_once(')').context("malformed /proc stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    anyhow::ensure!(f.len() > 13, "malformed /proc stat");
    // utime and stime: fields 14 and 15 of stat, 12 and 13 after ')'.
    Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
}

/// CPU seconds (user + system) used so far by process `pid`.
pub fn process_cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    Ok(cpu_ticks(pid)? as f64 / ticks_per_sec() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_time_is_read() {
        let t = cpu_ticks(std::process::id()).unwrap();
        // Burn a little CPU: the count never goes backwards.
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(cpu_ticks(std::process::id()).unwrap() >= t);
        assert!(ticks_per_sec() > 0);
        assert!(cpu_ticks(u32::MAX).is_err());
    }
}

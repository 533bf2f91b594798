//! Peak memory of the process, from `/proc/self/status` (Linux). The figure is the
//! process's peak resident set (VmHWM), not one strategy's allocations: the
//! simulator resets the peak before each strategy's request phase (by writing `5`
//! to `/proc/self/clear_refs`, Linux 4.0 and later), so each figure is the peak
//! reached during that phase, including what earlier phases left resident.

/// Resets the process's peak resident set to its current size; false where the
/// kernel does not allow it (the next figure is then the peak since start).
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", b"5").is_ok()
}

/// The process's peak resident set in bytes (VmHWM), or `None` off Linux.
pub fn peak_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_hwm(&status)
}

fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_high_water_mark_in_bytes() {
        assert_eq!(
            parse_vm_hwm("VmPeak:\t  1000 kB\nVmHWM:\t    2048 kB\nVmRSS: 1 kB\n"),
            Some(2048 * 1024)
        );
        assert_eq!(parse_vm_hwm("VmRSS: 1 kB\n"), None);
    }
}

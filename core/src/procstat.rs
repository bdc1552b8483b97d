//! The `process_*` series Prometheus' Go client exports for every process (etcd's dashboard
//! plots `process_resident_memory_bytes`), read from /proc at scrape time.

use std::fmt::Write;

use crate::shared::Shared;

/// What /proc says about this process; None where a file could not be read (not Linux, or
/// a hardened /proc), so a scrape never fails over it.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: Option<f64>,
    pub resident_memory_bytes: Option<u64>,
    pub virtual_memory_bytes: Option<u64>,
    pub start_time_seconds: Option<f64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
}

impl ProcessStats {
    pub fn read() -> ProcessStats {
        // SAFETY: sysconf has no preconditions; it only reads a system constant.
        let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        // SAFETY: as above.
        let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let fields = stat.as_deref().and_then(stat_fields);
        let field = |i: usize| -> Option<u64> { fields.as_ref()?.get(i)?.parse().ok() };
        let boot_time_s = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        });
        ProcessStats {
            // Fields counted from 1 in proc(5): utime 14, stime 15, starttime 22, vsize 23,
            // rss 24; `stat_fields` starts at field 3, so subtract 3.
            cpu_seconds: field(14 - 3)
                .zip(field(15 - 3))
                .map(|(u, s)| (u + s) as f64 / ticks_per_s),
            start_time_seconds: field(22 - 3)
                .zip(boot_time_s)
                .map(|(ticks, boot)| boot as f64 + ticks as f64 / ticks_per_s),
            virtual_memory_bytes: field(23 - 3),
            resident_memory_bytes: field(24 - 3).map(|pages| pages * page_bytes),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| d.count() as u64),
            max_fds: std::fs::read_to_string("/proc/self/limits")
                .ok()
                .and_then(|l| max_open_files(&l)),
        }
    }
}

/// The fields of /proc/self/stat after the command name (which may hold spaces and parens),
/// starting with field 3 (state).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    Some(after_name.split_whitespace().collect())
}

/// The soft limit on "Max open files" in /proc/self/limits.
fn max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

pub fn render(out: &mut String, _shared: &Shared) {
    let p = ProcessStats::read();
    let mut metric = |name: &str, help: &str, kind: &str, value: Option<String>| {
        if let Some(v) = value {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
    };
    metric(
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
        "counter",
        p.cpu_seconds.map(|v| v.to_string()),
    );
    metric(
        "process_open_fds",
        "Number of open file descriptors.",
        "gauge",
        p.open_fds.map(|v| v.to_string()),
    );
    metric(
        "process_max_fds",
        "Maximum number of open file descriptors.",
        "gauge",
        p.max_fds.map(|v| v.to_string()),
    );
    metric(
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
        "gauge",
        p.resident_memory_bytes.map(|v| v.to_string()),
    );
    metric(
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
        "gauge",
        p.virtual_memory_bytes.map(|v| v.to_string()),
    );
    metric(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        "gauge",
        p.start_time_seconds.map(|v| v.to_string()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parens_does_not_shift_fields() {
        let stat = "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 11 12";
        let f = stat_fields(stat).expect("has a name");
        assert_eq!(f[0], "S");
        assert_eq!(f[14 - 3], "11");
    }

    #[test]
    fn the_soft_open_files_limit_is_read() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024));
    }

    #[test]
    fn this_process_reads_sensible_numbers() {
        let p = ProcessStats::read();
        assert!(p.resident_memory_bytes.expect("Linux has /proc") > 0);
        assert!(p.open_fds.expect("/proc/self/fd") >= 3);
        let start = p.start_time_seconds.expect("btime and starttime");
        assert!(start > 1.5e9, "{start}");
    }
}

//! The standard `process_*` families (as the Prometheus client libraries name them), read from
//! Linux's `/proc/self` at scrape time: CPU seconds, resident and virtual memory, open and
//! maximum file descriptors, threads and start time. Elsewhere (or if `/proc` cannot be read)
//! they are left out. A few small file reads per scrape; nothing on the request path.

use std::fmt::Write as _;

/// Appends the `process_*` families to `out` (nothing off Linux).
pub(super) fn write(out: &mut String) {
    if let Some(p) = read() {
        p.write(out);
    }
}

#[derive(Debug, Default, PartialEq)]
struct Process {
    cpu_seconds: f64,
    resident_bytes: u64,
    virtual_bytes: u64,
    threads: u64,
    start_time_seconds: f64,
    open_fds: Option<u64>,
    max_fds: Option<u64>,
}

impl Process {
    fn write(&self, out: &mut String) {
        let mut family = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            );
        };
        family(
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            self.cpu_seconds.to_string(),
        );
        family(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            self.resident_bytes.to_string(),
        );
        family(
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            self.virtual_bytes.to_string(),
        );
        family(
            "process_threads",
            "gauge",
            "Number of OS threads in the process.",
            self.threads.to_string(),
        );
        family(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            self.start_time_seconds.to_string(),
        );
        if let Some(n) = self.open_fds {
            family(
                "process_open_fds",
                "gauge",
                "Number of open file descriptors.",
                n.to_string(),
            );
        }
        if let Some(n) = self.max_fds {
            family(
                "process_max_fds",
                "gauge",
                "Maximum number of open file descriptors.",
                n.to_string(),
            );
        }
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // sysconf: two constants of the running system.
fn read() -> Option<Process> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    // SAFETY: sysconf has no preconditions; it reads a constant of the running system.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as u64);
    let mut p = parse(
        &stat,
        &boot,
        &limits,
        ticks.max(1) as u64,
        page.max(1) as u64,
    )?;
    p.open_fds = open_fds;
    Some(p)
}

#[cfg(not(target_os = "linux"))]
fn read() -> Option<Process> {
    None
}

/// The process from `/proc/self/stat`, `/proc/stat` (boot time) and `/proc/self/limits`.
fn parse(stat: &str, boot: &str, limits: &str, ticks: u64, page: u64) -> Option<Process> {
    // The command name (field 2) is in parentheses and may hold spaces: fields count from ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3, so field N is f[N - 3].
    let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    let (utime, stime) = (field(14)?, field(15)?);
    let threads = field(20)?;
    let start_ticks = field(22)?;
    let vsize = field(23)?;
    let rss_pages = field(24)?;
    let btime: u64 = boot
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())?;
    let max_fds = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok());
    Some(Process {
        cpu_seconds: (utime + stime) as f64 / ticks as f64,
        resident_bytes: rss_pages * page,
        virtual_bytes: vsize,
        threads,
        start_time_seconds: btime as f64 + start_ticks as f64 / ticks as f64,
        open_fds: None,
        max_fds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat_with_a_spaced_command_name() {
        let stat = "4242 (fair gate) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 150 0 0 20 0 \
                    7 0 12345 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0";
        let boot = "cpu  1 2 3\nbtime 1700000000\nprocesses 10\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            65536                1048576              files\n";
        let p = parse(stat, boot, limits, 100, 4096).unwrap();
        assert_eq!(p.cpu_seconds, 4.0);
        assert_eq!(p.threads, 7);
        assert_eq!(p.virtual_bytes, 104_857_600);
        assert_eq!(p.resident_bytes, 2560 * 4096);
        assert!((p.start_time_seconds - 1_700_000_123.45).abs() < 1e-3);
        assert_eq!(p.max_fds, Some(65536));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_process() {
        let p = read().expect("/proc/self is readable");
        assert!(p.resident_bytes > 0 && p.threads >= 1 && p.open_fds.unwrap_or(0) > 0);
        let mut out = String::new();
        p.write(&mut out);
        assert!(out.contains("# TYPE process_cpu_seconds_total counter\n"));
    }
}

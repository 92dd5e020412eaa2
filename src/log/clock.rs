//! The timestamp of every log line: RFC 3339 in UTC with microseconds
//! (`2026-12-01T05:10:11.123456Z`, the shape of tracing-subscriber's default `SystemTime`),
//! with the date and time of day formatted once per second per thread and only the fraction
//! per line. Measured under the overhead benchmark, the default timer's formatting was a
//! quarter of the cost of the per-request log line.
//!
//! Invariants: the output is byte-for-byte the civil UTC time of `SystemTime::now()`; a clock
//! before 1970 prints the epoch.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;

/// The log lines' timer (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Clock;

thread_local! {
    /// The second last formatted on this thread, and its `YYYY-MM-DDTHH:MM:SS`.
    static LAST: Cell<(u64, [u8; 19])> = const { Cell::new((u64::MAX, [0; 19])) };
}

impl FormatTime for Clock {
    fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let secs = now.as_secs();
        let (last, mut prefix) = LAST.get();
        if last != secs {
            prefix = civil(secs);
            LAST.set((secs, prefix));
        }
        // `civil` writes ASCII digits and separators only.
        w.write_str(std::str::from_utf8(&prefix).map_err(|_| std::fmt::Error)?)?;
        write!(w, ".{:06}Z", now.subsec_micros())
    }
}

/// `YYYY-MM-DDTHH:MM:SS` of a Unix time (UTC), by Howard Hinnant's `civil_from_days`.
fn civil(secs: u64) -> [u8; 19] {
    let days = (secs / 86_400) as i64;
    let tod = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut out = [0u8; 19];
    let mut put = |at: usize, v: u64, width: usize| {
        let mut v = v;
        for i in (0..width).rev() {
            out[at + i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, year.clamp(0, 9999) as u64, 4);
    put(5, month as u64, 2);
    put(8, day as u64, 2);
    put(11, tod / 3_600, 2);
    put(14, tod / 60 % 60, 2);
    put(17, tod % 60, 2);
    for (at, sep) in [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')] {
        out[at] = sep;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_time_of_known_instants() {
        let s = |t| String::from_utf8(civil(t).to_vec()).unwrap();
        assert_eq!(s(0), "1970-01-01T00:00:00");
        assert_eq!(s(951_782_400), "2000-02-29T00:00:00");
        assert_eq!(s(1_796_094_611), "2026-12-01T03:10:11");
        assert_eq!(s(4_107_542_399), "2100-02-28T23:59:59");
        assert_eq!(s(4_107_542_400), "2100-03-01T00:00:00");
    }

    #[test]
    fn formats_like_the_default_timer() {
        let mut ours = String::new();
        Clock.format_time(&mut Writer::new(&mut ours)).unwrap();
        let mut theirs = String::new();
        tracing_subscriber::fmt::time::SystemTime
            .format_time(&mut Writer::new(&mut theirs))
            .unwrap();
        assert_eq!(ours.len(), theirs.len(), "{ours} vs {theirs}");
        // Same date and minute (the two clocks are read microseconds apart).
        assert_eq!(ours[..16], theirs[..16], "{ours} vs {theirs}");
        assert!(ours.ends_with('Z'));
    }
}

//! Budget windows: the calendar day or month a moment falls in, in the configured [`Zone`].
//!
//! Pure: the moment is an argument (seconds since the Unix epoch). A window is half-open,
//! `[start, end)`; its `end` is when the budget resets (a `Retry-After`). Days and months are
//! the zone's: a DST change makes a day 23 or 25 hours long, never a wrong date.

use jiff::civil::Date;
use jiff::{Timestamp, ToSpan};

use crate::domain::{Period, Zone};

/// One period's window around a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    /// Day or month.
    pub period: Period,
    /// Its first second (Unix seconds).
    pub start: i64,
    /// The first second of the next window (Unix seconds): when the budget resets.
    pub end: i64,
}

impl Window {
    /// Seconds from `now` until the window resets (at least 1).
    pub fn resets_in(&self, now: i64) -> u64 {
        u64::try_from(self.end.saturating_sub(now))
            .unwrap_or(0)
            .max(1)
    }

    /// Whether `now` falls in this window.
    pub fn holds(&self, now: i64) -> bool {
        (self.start..self.end).contains(&now)
    }
}

/// The calendar date of `now` (Unix seconds) in `zone`.
pub fn date_of(zone: &Zone, now: i64) -> Date {
    let ts = Timestamp::from_second(now).unwrap_or(Timestamp::UNIX_EPOCH);
    ts.to_zoned(zone.tz().clone()).date()
}

/// The first second of `date` in `zone`.
fn start_of(zone: &Zone, date: Date) -> i64 {
    date.to_zoned(zone.tz().clone())
        .map(|z| z.timestamp().as_second())
        .unwrap_or(i64::MAX)
}

/// The `period` window holding `now` (Unix seconds) in `zone`.
pub fn window(zone: &Zone, period: Period, now: i64) -> Window {
    let date = date_of(zone, now);
    let (first, next) = match period {
        Period::Day => (date, date.tomorrow().ok()),
        Period::Month => {
            let first = date.first_of_month();
            (first, first.checked_add(1.month()).ok())
        }
    };
    Window {
        period,
        start: start_of(zone, first),
        end: next.map_or(i64::MAX, |d| start_of(zone, d)),
    }
}

/// `YYYY-MM-DD` of a date (the ledger's `day`).
pub fn day_string(date: Date) -> String {
    format!("{:04}-{:02}-{:02}", date.year(), date.month(), date.day())
}

/// Parses `YYYY-MM-DD`.
pub fn parse_day(s: &str) -> Option<Date> {
    let mut it = s.splitn(3, '-');
    let (y, m, d) = (it.next()?, it.next()?, it.next()?);
    if y.len() != 4 || m.len() != 2 || d.len() != 2 {
        return None;
    }
    Date::new(y.parse().ok()?, m.parse().ok()?, d.parse().ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> i64 {
        s.parse::<Timestamp>().unwrap().as_second()
    }

    #[test]
    fn utc_days_and_months_reset_at_midnight_and_on_the_first() {
        let z = Zone::default();
        let now = at("2026-12-02T15:30:00Z");
        let d = window(&z, Period::Day, now);
        assert_eq!(
            (d.start, d.end),
            (at("2026-12-02T00:00:00Z"), at("2026-12-03T00:00:00Z"))
        );
        assert_eq!(d.resets_in(now), 8 * 3600 + 30 * 60);
        let m = window(&z, Period::Month, now);
        assert_eq!(
            (m.start, m.end),
            (at("2026-12-01T00:00:00Z"), at("2027-01-01T00:00:00Z"))
        );
        assert!(m.holds(now) && !m.holds(m.end) && m.holds(m.start));
        let feb = window(&z, Period::Month, at("2028-02-29T23:59:59Z"));
        assert_eq!(feb.end, at("2028-03-01T00:00:00Z"), "a leap February");
    }

    #[test]
    fn a_zone_moves_the_boundary_and_dst_makes_a_day_23_hours() {
        let berlin = Zone::parse("Europe/Berlin").unwrap();
        // 23:30 UTC on 1 Dec is already 2 Dec in Berlin (UTC+1).
        let now = at("2026-12-01T23:30:00Z");
        assert_eq!(day_string(date_of(&berlin, now)), "2026-12-02");
        assert_eq!(day_string(date_of(&Zone::default(), now)), "2026-12-01");
        let d = window(&berlin, Period::Day, now);
        assert_eq!(d.start, at("2026-12-01T23:00:00Z"));
        // 29 March 2026: clocks go forward, the day has 23 hours.
        let spring = window(&berlin, Period::Day, at("2026-03-29T12:00:00Z"));
        assert_eq!(spring.end - spring.start, 23 * 3600);
        let fixed = Zone::parse("+05:30").unwrap();
        let d = window(&fixed, Period::Day, now);
        assert_eq!(d.start, at("2026-12-01T18:30:00Z"));
        assert!(Zone::parse("+5:3x").is_err() && Zone::parse("Nowhere/City").is_err());
    }

    #[test]
    fn days_print_and_parse() {
        let d = parse_day("2026-01-05").unwrap();
        assert_eq!(day_string(d), "2026-01-05");
        for bad in ["2026-1-05", "2026-13-01", "x", "2026-02-30"] {
            assert!(parse_day(bad).is_none(), "{bad}");
        }
    }
}

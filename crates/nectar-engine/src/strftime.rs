//! A small `strftime` for the chat template's `strftime_now(fmt)`.
//!
//! HF exposes `datetime.now().strftime(fmt)` to templates, which use it to
//! put today's date in the system prompt (e.g. `"%d %b %Y"`). We format UTC:
//! finding the local zone would mean reading `TZ` or `/etc/localtime`, and a
//! server's prompt should not depend on the host's zone anyway.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DateTime {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Monday .. 6 = Sunday
    pub weekday: u32,
    /// 1..=366
    pub yday: u32,
}

impl DateTime {
    /// The current UTC time (the epoch if the clock is before 1970).
    pub fn now_utc() -> DateTime {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        DateTime::from_unix(secs)
    }

    /// Break down seconds since the Unix epoch (UTC).
    pub fn from_unix(secs: i64) -> DateTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        let jan1 = days_from_civil(year, 1, 1);
        DateTime {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
            // 1970-01-01 was a Thursday (3 with Monday = 0).
            weekday: (days + 3).rem_euclid(7) as u32,
            yday: (days - jan1 + 1) as u32,
        }
    }
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Format `t` with C/Python `strftime` directives. Supports the common ones
/// plus glibc's `-` flag (`%-d`: no padding), which templates do use.
/// Unknown directives are copied through, as glibc does.
/// `secs` since the Unix epoch as RFC 3339 UTC (`2026-12-01T18:00:00Z`).
pub fn rfc3339(secs: i64) -> String {
    strftime("%Y-%m-%dT%H:%M:%SZ", &DateTime::from_unix(secs))
}

pub(crate) fn strftime(fmt: &str, t: &DateTime) -> String {
    let mut out = String::new();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let no_pad = chars.peek() == Some(&'-');
        if no_pad {
            chars.next();
        }
        let num = |n: i64, width: usize| {
            if no_pad {
                n.to_string()
            } else {
                format!("{n:0width$}")
            }
        };
        let hour12 = match t.hour % 12 {
            0 => 12,
            h => h,
        };
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let piece = match d {
            'Y' => t.year.to_string(),
            'y' => num(t.year.rem_euclid(100), 2),
            'm' => num(t.month.into(), 2),
            'd' => num(t.day.into(), 2),
            'e' => format!("{:>2}", t.day),
            'H' => num(t.hour.into(), 2),
            'I' => num(hour12.into(), 2),
            'M' => num(t.minute.into(), 2),
            'S' => num(t.second.into(), 2),
            'j' => num(t.yday.into(), 3),
            'p' => (if t.hour < 12 { "AM" } else { "PM" }).to_owned(),
            'B' => MONTHS[(t.month as usize - 1) % 12].to_owned(),
            'b' | 'h' => MONTHS[(t.month as usize - 1) % 12][..3].to_owned(),
            'A' => WEEKDAYS[t.weekday as usize % 7].to_owned(),
            'a' => WEEKDAYS[t.weekday as usize % 7][..3].to_owned(),
            'u' => (t.weekday + 1).to_string(),
            'w' => ((t.weekday + 1) % 7).to_string(),
            'F' => format!("{}-{:02}-{:02}", t.year, t.month, t.day),
            'T' => format!("{:02}:{:02}:{:02}", t.hour, t.minute, t.second),
            'Z' => "UTC".to_owned(),
            'z' => "+0000".to_owned(),
            '%' => "%".to_owned(),
            other => {
                let mut s = String::from('%');
                if no_pad {
                    s.push('-');
                }
                s.push(other);
                s
            }
        };
        out.push_str(&piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // 2024-02-29 13:05:09 UTC, a Thursday, day 60 of a leap year.
    const LEAP_DAY: i64 = 1_709_211_909;

    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(LEAP_DAY), "2024-02-29T13:05:09Z");
    }

    #[test]
    fn breaks_down_known_instants() {
        let t = DateTime::from_unix(LEAP_DAY);
        assert_eq!(
            t,
            DateTime {
                year: 2024,
                month: 2,
                day: 29,
                hour: 13,
                minute: 5,
                second: 9,
                weekday: 3,
                yday: 60,
            }
        );
        let epoch = DateTime::from_unix(0);
        assert_eq!((epoch.year, epoch.month, epoch.day), (1970, 1, 1));
        let before = DateTime::from_unix(-1);
        assert_eq!((before.year, before.month, before.day), (1969, 12, 31));
        assert_eq!(before.second, 59);
    }

    #[test]
    fn formats_like_python() {
        let t = DateTime::from_unix(LEAP_DAY);
        assert_eq!(strftime("%d %b %Y", &t), "29 Feb 2024");
        assert_eq!(
            strftime("%A, %B %-d, %Y", &t),
            "Thursday, February 29, 2024"
        );
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", &t), "2024-02-29 13:05:09");
        assert_eq!(strftime("%I:%M %p | %j | %y", &t), "01:05 PM | 060 | 24");
        assert_eq!(strftime("100%% %Q %", &t), "100% %Q %");
    }

    #[test]
    fn day_of_year_round_trips() {
        for days in [-800_000i64, -1, 0, 59, 365, 10_957, 19_782, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}

//! A buyer's opening hours (`schedule = { timezone, days, hours }`):
//! whether it takes leads at a moment, in its own IANA time zone. A window
//! may cross midnight (`"20:00-02:00"`): the hours after midnight belong to
//! the day the window opened. `days = []` means every day; equal start and
//! end mean the whole day.

use chrono::{DateTime, Datelike, Timelike, Utc};
use chrono_tz::Tz;

use crate::config::{parse_hours, BuyerSettings, ScheduleSettings, WEEKDAYS};

/// Whether the buyer's schedule (if any) takes leads at `at`. A schedule
/// that cannot be read (`check-config` refuses one) is taken as open.
pub fn takes_leads(settings: &BuyerSettings, at: DateTime<Utc>) -> bool {
    settings.schedule.as_ref().is_none_or(|schedule| {
        Schedule::parse(schedule).map_or(true, |schedule| schedule.is_open(at))
    })
}

#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    timezone: Tz,
    /// Monday first.
    days: [bool; 7],
    /// Minutes after local midnight.
    opens: u32,
    closes: u32,
}

impl Schedule {
    pub fn parse(settings: &ScheduleSettings) -> Result<Self, String> {
        let timezone: Tz = settings
            .timezone
            .parse()
            .map_err(|_| format!("unknown time zone {:?}", settings.timezone))?;
        let mut days = [settings.days.is_empty(); 7];
        for day in &settings.days {
            let index = WEEKDAYS
                .iter()
                .position(|known| known == day)
                .ok_or_else(|| format!("unknown day {day:?}; use mon..sun"))?;
            days[index] = true;
        }
        let (opens, closes) = parse_hours(&settings.hours).ok_or("expected \"HH:MM-HH:MM\"")?;
        Ok(Self {
            timezone,
            days,
            opens,
            closes,
        })
    }

    /// Whether the buyer takes leads at `at`.
    pub fn is_open(&self, at: DateTime<Utc>) -> bool {
        let local = at.with_timezone(&self.timezone);
        let minute = local.hour() * 60 + local.minute();
        let today = local.weekday().num_days_from_monday() as usize;
        let yesterday = (today + 6) % 7;
        match self.opens.cmp(&self.closes) {
            std::cmp::Ordering::Equal => self.days[today],
            std::cmp::Ordering::Less => {
                self.days[today] && (self.opens..self.closes).contains(&minute)
            }
            std::cmp::Ordering::Greater => {
                (self.days[today] && minute >= self.opens)
                    || (self.days[yesterday] && minute < self.closes)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(timezone: &str, days: &[&str], hours: &str) -> Schedule {
        Schedule::parse(&ScheduleSettings {
            timezone: timezone.into(),
            days: days.iter().map(|day| day.to_string()).collect(),
            hours: hours.into(),
        })
        .unwrap()
    }

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    #[test]
    fn office_hours_on_weekdays_in_the_buyers_time_zone() {
        let office = schedule(
            "America/New_York",
            &["mon", "tue", "wed", "thu", "fri"],
            "08:00-20:00",
        );
        // Thursday 2026-12-03, 13:00 UTC = 08:00 in New York (EST, UTC-5).
        assert!(office.is_open(at("2026-12-03T13:00:00Z")));
        assert!(!office.is_open(at("2026-12-03T12:59:00Z")), "07:59 local");
        assert!(
            !office.is_open(at("2026-12-04T01:00:00Z")),
            "Thursday 20:00 local: closed"
        );
        assert!(!office.is_open(at("2026-12-05T15:00:00Z")), "Saturday");
        // Summer time: 12:00 UTC is 08:00 in New York (EDT, UTC-4).
        assert!(office.is_open(at("2026-07-01T12:00:00Z")));
    }

    #[test]
    fn a_window_across_midnight_belongs_to_the_day_it_opened() {
        let nights = schedule("UTC", &["fri"], "22:00-02:00");
        assert!(nights.is_open(at("2026-12-04T23:30:00Z")), "Friday 23:30");
        assert!(
            nights.is_open(at("2026-12-05T01:59:00Z")),
            "Saturday 01:59, Friday's night"
        );
        assert!(!nights.is_open(at("2026-12-05T02:00:00Z")));
        assert!(
            !nights.is_open(at("2026-12-05T23:30:00Z")),
            "Saturday night is not Friday's"
        );
        assert!(
            !nights.is_open(at("2026-12-04T01:00:00Z")),
            "Friday 01:00 is Thursday's night"
        );
    }

    #[test]
    fn every_day_and_the_whole_day() {
        let always = schedule("Europe/Berlin", &[], "00:00-00:00");
        assert!(always.is_open(at("2026-12-06T03:00:00Z")));
        assert!(Schedule::parse(&ScheduleSettings {
            timezone: "Mars/Olympus".into(),
            days: vec![],
            hours: "08:00-09:00".into(),
        })
        .is_err());
    }
}

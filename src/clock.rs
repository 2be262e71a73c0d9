//! The time routing decisions are made at (buyer schedules): the system
//! clock, or a fixed moment that tests set on `Settings::clock`.

use chrono::{DateTime, Utc};

#[derive(Debug, Clone, Copy, Default)]
pub enum Clock {
    #[default]
    System,
    Fixed(DateTime<Utc>),
}

impl Clock {
    pub fn now(self) -> DateTime<Utc> {
        match self {
            Self::System => Utc::now(),
            Self::Fixed(at) => at,
        }
    }
}

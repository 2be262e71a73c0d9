//! Rates written as `"N/s"`, `"N/min"` or `"N/h"` (source rate limits).

use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// `count` events per `per`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub count: u32,
    pub per: Duration,
}

impl FromStr for Rate {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || format!("invalid rate {text:?}: expected \"N/s\", \"N/min\" or \"N/h\"");
        let (count, unit) = text.trim().split_once('/').ok_or_else(invalid)?;
        let count: u32 = count.trim().parse().map_err(|_| invalid())?;
        let per = match unit.trim() {
            "s" => Duration::from_secs(1),
            "min" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return Err(invalid()),
        };
        if count == 0 {
            return Err(format!(
                "invalid rate {text:?}: the count must be at least 1"
            ));
        }
        Ok(Self { count, per })
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_in_each_unit_and_reject_the_rest() {
        assert_eq!(
            "30/min".parse::<Rate>().unwrap().per,
            Duration::from_secs(60)
        );
        assert_eq!("200/s".parse::<Rate>().unwrap().count, 200);
        assert_eq!(
            "5/h".parse::<Rate>().unwrap().per,
            Duration::from_secs(3600)
        );
        for bad in ["30", "x/s", "3/day", "0/s", "/s"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad} should be rejected");
        }
    }
}

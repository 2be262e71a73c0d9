//! Configuration: one struct per section of `leadrouter.toml` (SPEC
//! section 4) in [`settings`]. Loading, `${VAR}` interpolation and
//! environment overrides live in [`load`], the checks that need the whole
//! file in [`validate`], and the problems `check-config` prints in
//! [`problem`].

mod load;
mod problem;
mod rate;
mod settings;
mod validate;

pub use load::{buyer_from_snapshot, load, parse, DEFAULT_CONFIG_PATH};
pub use problem::{ConfigError, Problem};
pub use rate::Rate;
pub use settings::{
    summary, AcceptRule, AlertSettings, BuyerSettings, CircuitSettings, DatabaseSettings,
    DuplicateRule, EventSettings, FaultSettings, IntakeSettings, LogFormat, LogSettings,
    NotifyKind, NotifyRole, NotifySettings, PayoutRule, PingSettings, PostSettings,
    RateLimitSettings, RoutingMode, RoutingSettings, ScheduleSettings, Secret, ServerSettings,
    Settings, SharedSettings, SourceKind, SourceSettings, SupervisionSettings, EVENTS,
};
pub use validate::{parse_hours, WEEKDAYS};

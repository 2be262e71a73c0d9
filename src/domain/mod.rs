//! The lead's vocabulary: states, the acceptance contract, and turning a
//! request body into normalised fields and attribution.

mod attempt;
pub mod base64_bytes;
mod contract;
mod ids;
mod normalize;
mod payload;
mod snapshot;

pub use attempt::{AttemptKind, AttemptOutcome, CallKind, CallOutcome, SkipReason, INTERRUPTED};
pub use contract::{Acceptance, Contract, FieldError, LeadState};
pub use ids::{keyed_lead_id, new_id, ClaimToken, LeadId};
pub use normalize::{
    check_fields, normalize, normalize_parsed, Normalized, RequestMeta, ATTRIBUTION_KEYS,
};
pub use payload::{parse_body, BodyError, BodyFormat};
pub use snapshot::ConfigSnapshot;

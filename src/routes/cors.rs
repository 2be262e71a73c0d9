//! CORS for what a website's own pages call from the browser (`form.js`):
//! intake and the public status of a lead, for the origins form sources
//! list in `allowed_origins` and for nobody else. Read per request, so a
//! reload applies. A request from another origin is still served (a plain
//! HTML form post needs no CORS), only without the headers that would let
//! that page's script read the answer.

use actix_cors::Cors;
use actix_web::http::header::{self, HeaderName};

use crate::config::SharedSettings;

/// Preflight answers may be cached this long (seconds).
const PREFLIGHT_MAX_AGE: usize = 600;

pub fn for_forms(settings: SharedSettings) -> Cors {
    Cors::default()
        .allowed_origin_fn(move |origin, _| {
            origin
                .to_str()
                .is_ok_and(|origin| settings.current().allows_origin(origin))
        })
        .allowed_methods(["GET", "POST"])
        .allowed_headers([
            header::CONTENT_TYPE,
            header::ACCEPT,
            HeaderName::from_static("idempotency-key"),
            HeaderName::from_static("x-test-lead"),
        ])
        .block_on_origin_mismatch(false)
        .max_age(PREFLIGHT_MAX_AGE)
}

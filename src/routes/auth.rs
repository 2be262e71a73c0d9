//! Admin authentication: `Authorization: Bearer <server.admin_token>`,
//! compared in constant time.

use std::future::{ready, Ready};

use actix_web::{dev::Payload, http::header, web, FromRequest, HttpRequest};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::state::AppState;

/// Present in a handler's arguments: the request carried the admin token.
pub struct Admin;

impl FromRequest for Admin {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(Admin::check(request))
    }
}

impl Admin {
    /// Checks the request's bearer token against `server.admin_token`.
    pub fn check(request: &HttpRequest) -> Result<Admin, ApiError> {
        let state = request
            .app_data::<web::Data<AppState>>()
            .ok_or_else(|| ApiError::Unauthorized("admin API not configured".into()))?;
        let settings = state.settings();
        let Some(expected) = &settings.server.admin_token else {
            return Err(ApiError::Unauthorized(
                "the admin API is disabled: set server.admin_token".into(),
            ));
        };
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .unwrap_or_default();
        if secrets_equal(presented, expected.expose()) {
            Ok(Admin)
        } else {
            Err(ApiError::Unauthorized(
                "missing or wrong admin token (Authorization: Bearer ...)".into(),
            ))
        }
    }
}

/// Constant-time equality for keys and tokens.
pub fn secrets_equal(presented: &str, expected: &str) -> bool {
    !expected.is_empty() && bool::from(presented.as_bytes().ct_eq(expected.as_bytes()))
}

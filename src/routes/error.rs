//! `ApiError`: every error the HTTP API returns, mapped to a status once and
//! rendered as the contract's `{"error", "message"}` JSON.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};

/// Every error answer's body.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)] // documents `additionalProperties: false`
pub struct ErrorBody {
    /// A machine-readable code, e.g. `not_found`.
    pub error: String,
    /// What happened, in plain words.
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Unauthorized(String),
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("too many requests; retry after {retry_after_secs} s")]
    RateLimited { retry_after_secs: u64 },
    #[error("{0}")]
    BadRequest(String),
    #[error("{0} not found")]
    NotFound(String),
    /// The resource's state does not allow it (e.g. rerouting a sold lead).
    #[error("{0}")]
    Conflict(String),
    /// The database refuses what was asked (a constraint, a trigger).
    #[error("{0}")]
    Refused(String),
    /// What was asked breaks a rule of the contract; `code` names it.
    #[error("{message}")]
    Unprocessable { code: &'static str, message: String },
    #[error("{0} is unavailable")]
    Unavailable(String),
    #[error("the database is unavailable")]
    Database(#[from] sea_orm::DbErr),
}

impl ApiError {
    /// The machine-readable code in the `error` field.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unauthorized(_) => "unauthorized",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::RateLimited { .. } => "rate_limited",
            Self::BadRequest(_) => "bad_request",
            Self::NotFound(_) => "not_found",
            Self::Conflict(_) => "conflict",
            Self::Refused(_) => "refused",
            Self::Unprocessable { code, .. } => code,
            Self::Unavailable(_) => "unavailable",
            Self::Database(_) => "database_unavailable",
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::Refused(_) | Self::Unprocessable { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unavailable(_) | Self::Database(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let Self::Database(error) = self {
            tracing::error!(%error, "database error while answering a request");
        }
        let mut response = HttpResponse::build(self.status_code());
        if let Self::RateLimited { retry_after_secs } = self {
            response.insert_header((header::RETRY_AFTER, retry_after_secs.to_string()));
        }
        response.json(ErrorBody {
            error: self.code().into(),
            message: self.to_string(),
        })
    }
}

impl From<crate::store::OperationError> for ApiError {
    fn from(error: crate::store::OperationError) -> Self {
        use crate::store::OperationError;
        match error {
            OperationError::NotFound => Self::NotFound("lead".into()),
            OperationError::Conflict(message) => Self::Conflict(message),
            OperationError::Refused { rule, message } => Self::Unprocessable {
                code: rule,
                message,
            },
            OperationError::Database(error) => Self::Database(error),
        }
    }
}

//! `GET /status` (the operators' status page) and `GET /status/leads/{id}`
//! (a lead's timeline), with their script and style, embedded in the binary:
//! no build step. The status page arrives with every buyer's row, every
//! notify channel's and the lead counts rendered on the server (see
//! `status_render`), then its script keeps it live from `/v1/status`
//! (every two seconds) and, with the admin token an operator enters, reads
//! `/v1/review` and `/v1/leads/{id}`.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};

use super::error::ApiError;
use super::state::AppState;
use super::status::status_view;
use super::status_render;

const STATUS_PAGE: &str = include_str!("../status_page/status.html");
const LEAD_PAGE: &str = include_str!("../status_page/lead.html");
/// (name, content type, content)
const ASSETS: [(&str, &str, &str); 4] = [
    (
        "status.css",
        "text/css; charset=utf-8",
        include_str!("../status_page/status.css"),
    ),
    (
        "common.js",
        "text/javascript; charset=utf-8",
        include_str!("../status_page/common.js"),
    ),
    (
        "status.js",
        "text/javascript; charset=utf-8",
        include_str!("../status_page/status.js"),
    ),
    (
        "lead.js",
        "text/javascript; charset=utf-8",
        include_str!("../status_page/lead.js"),
    ),
];

/// The operators' status page (HTML; it reads `/v1/status`).
#[utoipa::path(get, path = "/status", tag = "status",
    responses((status = 200, description = "The page", body = String, content_type = "text/html")))]
pub async fn status_page(request: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let page = match status_view(&request, &state).await {
        Some(status) => status_render::fill(STATUS_PAGE, &status),
        // Not public and no token: the page asks for nothing it may not show.
        None => status_render::fill(STATUS_PAGE, &serde_json::Value::Null),
    };
    html(page)
}

/// A lead's timeline (HTML; it reads `/v1/leads/{id}` with the admin token).
#[utoipa::path(get, path = "/status/leads/{id}", tag = "status",
    params(("id" = String, Path, description = "The lead's submission_id")),
    responses((status = 200, description = "The page", body = String, content_type = "text/html")))]
pub async fn lead_page() -> HttpResponse {
    html(LEAD_PAGE.to_string())
}

/// The pages' script and style.
#[utoipa::path(get, path = "/status/assets/{name}", tag = "status",
    params(("name" = String, Path, description = "status.css, common.js, status.js or lead.js")),
    responses(
        (status = 200, description = "The file", body = String, content_type = "text/plain"),
        (status = 404, description = "No such asset", body = super::error::ErrorBody),
    ))]
pub async fn asset(name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let (_, content_type, content) = ASSETS
        .iter()
        .find(|(asset, ..)| *asset == name.as_str())
        .ok_or_else(|| ApiError::NotFound(format!("asset {:?}", name.as_str())))?;
    Ok(HttpResponse::Ok()
        .content_type(*content_type)
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(*content))
}

fn html(page: String) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("Content-Security-Policy", "default-src 'self'"))
        .body(page)
}

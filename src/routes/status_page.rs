//! `GET /status` (the operators' status page) and `GET /status/leads/{id}`
//! (a lead's timeline), with their script and style, embedded in the binary:
//! no build step. The pages hold no data themselves; their scripts read
//! `/v1/status` (every two seconds) and, with the admin token an operator
//! enters, `/v1/review` and `/v1/leads/{id}`.

use actix_web::http::header;
use actix_web::{web, HttpResponse};

use super::ApiError;

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

pub async fn status_page() -> HttpResponse {
    html(STATUS_PAGE)
}

pub async fn lead_page() -> HttpResponse {
    html(LEAD_PAGE)
}

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

fn html(page: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("Content-Security-Policy", "default-src 'self'"))
        .body(page)
}

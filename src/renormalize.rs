//! `leadrouter renormalize --source ID --since DURATION` (SPEC section 3):
//! after an operator fixed a source's field mapping, re-derives the
//! normalised fields (and validation errors) of that source's stored leads
//! from their raw payloads with the current configuration. Raw bytes and
//! attribution are never touched. Invalid leads that are now valid leave the
//! review queue for `received` (a running service's sweep routes them);
//! received leads that became invalid go to review; other states keep theirs.

use std::time::Duration;

use anyhow::Context;
use serde_json::{Map, Value};

use crate::config::Settings;
use crate::domain::{normalize_parsed, parse_body, BodyFormat, FieldError, LeadState, RequestMeta};
use crate::store::Store;

const PAGE: u64 = 500;

/// What a run changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub examined: u64,
    pub changed: u64,
    /// Invalid before, valid now: out of the review queue, to be routed.
    pub now_valid: u64,
    /// Received before, invalid now: into the review queue.
    pub now_invalid: u64,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "examined {} leads, changed {} ({} now valid and waiting to be routed, {} now invalid)",
            self.examined, self.changed, self.now_valid, self.now_invalid
        )
    }
}

pub async fn run(settings: &Settings, source_id: &str, since: Duration) -> anyhow::Result<Report> {
    let source = settings
        .sources
        .iter()
        .find(|source| source.id == source_id)
        .with_context(|| format!("no source {source_id:?} in the configuration"))?;
    let store = Store::connect(&settings.database)
        .await
        .with_context(|| format!("failed to connect to {}", settings.database.display_url()))?;
    store.migrate().await.context("failed to run migrations")?;
    let since = chrono::Utc::now() - chrono::Duration::from_std(since)?;
    let mut report = Report::default();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .leads_of_source(source_id, since, after.as_deref(), PAGE)
            .await?;
        let Some(last) = page.last() else { break };
        after = Some(last.id.clone());
        for lead in page {
            report.examined += 1;
            let (fields, errors) = derive(&lead, source, settings.intake.max_field_chars);
            let old_errors: Vec<FieldError> =
                serde_json::from_value(lead.errors.clone()).unwrap_or_default();
            if Value::Object(fields.clone()) == lead.fields && errors == old_errors {
                continue;
            }
            report.changed += 1;
            let was = LeadState::parse(&lead.state);
            if was == Some(LeadState::Invalid) {
                store
                    .fix_invalid_lead(
                        &lead.id,
                        fields,
                        &errors,
                        &settings.duplicate_rule(),
                        !settings.has_required_channel(),
                    )
                    .await?;
                report.now_valid += u64::from(errors.is_empty());
            } else {
                report.now_invalid +=
                    u64::from(was == Some(LeadState::Received) && !errors.is_empty());
                store.refresh_fields(&lead, fields, &errors).await?;
            }
        }
    }
    store.close().await;
    Ok(report)
}

/// The lead's fields and errors as the current mapping derives them.
fn derive(
    lead: &entity::lead::Model,
    source: &crate::config::SourceSettings,
    max_field_chars: usize,
) -> (Map<String, Value>, Vec<FieldError>) {
    let content_type =
        (!lead.raw_content_type.is_empty()).then_some(lead.raw_content_type.as_str());
    let parsed = BodyFormat::of(content_type).and_then(|format| parse_body(format, &lead.raw));
    let meta = RequestMeta {
        referer: None,
        user_agent: None,
        client_ip: None,
        received_at: lead.received_at,
        test_header: false,
    };
    let normalized = normalize_parsed(&parsed, source, &meta, max_field_chars);
    (normalized.fields, normalized.errors)
}

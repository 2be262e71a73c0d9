//! `leads`: the raw body exactly as it arrived beside the normalised fields,
//! attribution, state and dedupe key of every lead.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "leads")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub source_id: String,
    /// Dedupe key, kept whole and compared. A keyed lead's `id` is derived
    /// from (source, key), so the primary key is what makes it unique.
    pub idempotency_key: Option<String>,
    /// `key_digest(source_id, idempotency_key)` of a lead stored before ids
    /// were derived (its id is random), found there by a replay of its key;
    /// NULL on every lead stored since.
    pub key_digest: Option<String>,
    pub external_id: Option<String>,
    pub state: String,
    #[sea_orm(column_type = "Blob")]
    pub raw: Vec<u8>,
    pub raw_content_type: String,
    pub fields: Json,
    pub attribution: Json,
    pub is_test: bool,
    pub errors: Json,
    pub duplicate_of: Option<String>,
    pub manager_notified: bool,
    pub crm_synced: bool,
    /// Which instance routes the lead, and until when (see `routing.lease`).
    pub lease_owner: Option<String>,
    pub lease_until: Option<DateTimeUtc>,
    pub received_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    /// Set by a reroute: attempts before it no longer decide the lead.
    pub history_from: Option<DateTimeUtc>,
    /// Set by a reroute with `include_tried`: buyers posted to before
    /// `history_from` may be offered the lead again.
    pub offer_tried: bool,
    /// A fresh random value on every claim: renewals, attempt writes and
    /// the settle of a walk hold only while it is still the lead's token.
    pub claim_token: Option<String>,
    /// Routing attempts that failed on our side (not a buyer's answer).
    pub route_failures: i32,
    /// Backoff after a routing failure: not claimed before this.
    pub route_after: Option<DateTimeUtc>,
    /// Set aside for an operator after too many routing failures.
    pub set_aside_reason: Option<String>,
    /// When the acceptance contract became `accepted`: stored (or fixed)
    /// valid while no notify channel was required, or when a required
    /// channel confirmed it. Null: `pending`.
    pub accepted_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// Characters of a key that lead its digest (`key_digest`).
pub const KEY_HEAD_CHARS: usize = 48;

/// The bounded-length form of a (source, idempotency key) pair that leads
/// stored before ids were derived keep in an index, whatever the key's
/// length: the key's first `KEY_HEAD_CHARS` characters, `|`, and the SHA-256, in hex, of the
/// source's length (8 bytes, big-endian), the source and the whole key (so
/// no two pairs share an input). The head keeps the index in the keys'
/// own order: a feed's rising lead ids are appended, not scattered (a
/// digest alone put every new lead on a random index page, and SQLite's
/// intake wrote several times the pages per commit).
pub fn key_digest(source_id: &str, key: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update((source_id.len() as u64).to_be_bytes());
    hash.update(source_id.as_bytes());
    hash.update(key.as_bytes());
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let head_end = key
        .char_indices()
        .nth(KEY_HEAD_CHARS)
        .map_or(key.len(), |(at, _)| at);
    let mut text = String::with_capacity(head_end + 65);
    text.push_str(&key[..head_end]);
    text.push('|');
    for byte in hash.finalize() {
        text.push(char::from(HEX[usize::from(byte >> 4)]));
        text.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    text
}

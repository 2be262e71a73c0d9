//! Ids: new server-issued ones, and typed ids carried between actors and
//! the store, so a lead id, a claim token and any other string cannot be
//! swapped by mistake. The database keeps them as text.

use std::fmt;

/// A lead's server-issued id: its `submission_id` everywhere.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeadId(String);

impl LeadId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for LeadId {
    fn from(id: String) -> Self {
        Self(id)
    }
}

impl From<&str> for LeadId {
    fn from(id: &str) -> Self {
        Self(id.to_string())
    }
}

impl fmt::Display for LeadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A new server-issued id: UUIDv7, so ids of the same kind sort by the
/// time they were made. (A keyed lead's id is `keyed_lead_id` instead.)
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// The namespace of keyed leads' ids (a UUIDv4 picked once; never change
/// it: ids already issued are derived under it).
const KEYED_LEAD_NAMESPACE: uuid::Uuid = uuid::uuid!("6f1d3c2a-8e4b-4b7a-9c1e-2d5f7a8b9c0d");

/// The id of a lead sent with an idempotency key: a name-based UUID
/// (version 5) of (source, key) in `KEYED_LEAD_NAMESPACE`, the name being
/// the source's length (8 bytes, big-endian), the source and the key. Every
/// instance, the spool and a replay during a database cut answer the same
/// id for the same key at the first try; a keyless lead gets a random one.
pub fn keyed_lead_id(source_id: &str, key: &str) -> String {
    let mut name = Vec::with_capacity(8 + source_id.len() + key.len());
    name.extend_from_slice(&(source_id.len() as u64).to_be_bytes());
    name.extend_from_slice(source_id.as_bytes());
    name.extend_from_slice(key.as_bytes());
    uuid::Uuid::new_v5(&KEYED_LEAD_NAMESPACE, &name).to_string()
}

/// Fences the writes made for a claimed lead: a fresh random value on
/// every claim, compared in each conditional write of the walk.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimToken(String);

impl ClaimToken {
    /// A new token, never issued before.
    pub fn fresh() -> Self {
        Self(new_id())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::keyed_lead_id;

    #[test]
    fn a_keyed_id_depends_on_the_source_and_the_key_alone() {
        let id = keyed_lead_id("partner", "key-1");
        assert_eq!(id, keyed_lead_id("partner", "key-1"));
        assert_ne!(id, keyed_lead_id("partner", "key-2"));
        assert_ne!(id, keyed_lead_id("other", "key-1"));
        // The source's length is part of the name: no pair shares another's.
        assert_ne!(keyed_lead_id("ab", "c"), keyed_lead_id("a", "bc"));
        assert_eq!(uuid::Uuid::parse_str(&id).unwrap().get_version_num(), 5);
    }
}

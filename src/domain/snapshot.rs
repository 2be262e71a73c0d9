//! A frozen copy of the configuration an attempt used (a buyer's table as
//! written, `${VAR}` references unresolved, or a notify channel's settings),
//! named by its content: the SHA-256 of its JSON text. Attempt rows keep
//! the name; the copy itself is stored once, in `config_snapshots`, however
//! many attempts used it.

use std::fmt::Write;
use std::sync::Arc;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// A configuration as it was, with the id of its stored copy.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigSnapshot {
    /// Lowercase hex SHA-256 of `value`'s JSON text.
    pub id: String,
    pub value: Arc<Value>,
}

impl ConfigSnapshot {
    pub fn of(value: Value) -> Self {
        let digest = Sha256::digest(value.to_string().as_bytes());
        let id = digest
            .iter()
            .fold(String::with_capacity(64), |mut id, byte| {
                let _ = write!(id, "{byte:02x}");
                id
            });
        Self {
            id,
            value: Arc::new(value),
        }
    }
}

impl Default for ConfigSnapshot {
    fn default() -> Self {
        Self::of(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn equal_configurations_share_an_id_and_different_ones_do_not() {
        let written = json!({"id": "acme", "ping": {"url": "https://acme.test/${KEY}"}});
        let again = ConfigSnapshot::of(written.clone());
        assert_eq!(ConfigSnapshot::of(written).id, again.id);
        assert_eq!(again.id.len(), 64);
        let changed = json!({"id": "acme", "ping": {"url": "https://acme.test/v2"}});
        assert_ne!(ConfigSnapshot::of(changed).id, again.id);
    }
}

//! Lookups by owner (`LockBackend::held_by`): a scan of the locks and the
//! holds of shared/permit keys, in one statement.

use super::PostgresBackend;
use super::error::bad_reply;
use super::ops::{col, micros, server_time};
use super::statements::Statement;
use crate::backend::{HeldBy, LockStatus};
use crate::error::LockError;
use crate::key::LockKey;
use crate::metadata::LockMetadata;

impl PostgresBackend {
    /// The locks `owner` holds, at most `limit`, by key. A lock whose stored
    /// key is hashed (its encoding was longer than the column's limit)
    /// cannot name its key and is left out.
    pub(super) async fn held_by_inner(
        &self,
        owner: &str,
        limit: usize,
    ) -> Result<Vec<HeldBy>, LockError> {
        const WHAT: &str = "held by";
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let row = self
            .shared
            .conns
            .query_one(
                Statement::HeldBy,
                &[&owner, &limit],
                None,
                self.deadline(),
                self.op_timeout,
            )
            .await?;
        let keys: Vec<String> = col(&row, 0, WHAT)?;
        let fences: Vec<i64> = col(&row, 1, WHAT)?;
        let acquired: Vec<i64> = col(&row, 2, WHAT)?;
        let expires: Vec<i64> = col(&row, 3, WHAT)?;
        let metadata: Vec<Option<String>> = col(&row, 4, WHAT)?;
        let now_us: i64 = col(&row, 5, WHAT)?;
        let mut found = Vec::with_capacity(keys.len());
        for (i, stored) in keys.iter().enumerate() {
            let Some(key) = LockKey::from_encoded(stored) else {
                continue;
            };
            let (Some(&f), Some(&a), Some(&e), Some(m)) = (
                fences.get(i),
                acquired.get(i),
                expires.get(i),
                metadata.get(i),
            ) else {
                return Err(bad_reply(WHAT));
            };
            let status = LockStatus::new(
                owner.to_owned(),
                u64::try_from(f).map_err(|_| bad_reply(WHAT))?,
                server_time(a),
                server_time(e),
                micros(e.saturating_sub(now_us)),
            )
            .with_metadata(m.as_deref().and_then(|m| LockMetadata::from_json(m).ok()));
            found.push(HeldBy::new(key, status));
        }
        found.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(found)
    }
}

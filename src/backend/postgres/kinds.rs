//! Shared holds and permits on PostgreSQL: how a kind is stored, and the
//! holds a status row lists (see `functions.sql`: `_acquire_kind`,
//! `_hand_off`, `_settle` and the `<table>_holds` table).

use tokio_postgres::Row;

use super::error::bad_reply;
use super::ops::{col, micros, server_time};
use crate::backend::Hold;
use crate::error::LockError;
use crate::metadata::LockMetadata;
use crate::spec::LockKind;

/// A kind as stored: (kind, permits): 0 exclusive, 1 shared, 2 permits.
pub(super) fn stored_kind(kind: LockKind) -> (i16, Option<i32>) {
    match kind {
        LockKind::Exclusive => (0, None),
        LockKind::Shared => (1, None),
        LockKind::Permits(n) => (2, Some(i32::try_from(n).unwrap_or(i32::MAX))),
    }
}

/// The kind of a stored (kind, permits).
pub(super) fn read_kind(
    kind: i16,
    permits: Option<i32>,
    what: &str,
) -> Result<LockKind, LockError> {
    match (kind, permits) {
        (0, _) => Ok(LockKind::Exclusive),
        (1, _) => Ok(LockKind::Shared),
        (2, Some(n)) => u32::try_from(n)
            .map(LockKind::Permits)
            .map_err(|_| bad_reply(what)),
        _ => Err(bad_reply(what)),
    }
}

/// The live holds of a shared/permit key, from the status row's arrays
/// (columns 9 to 13: owners, fences, acquired µs, expires µs, metadata).
pub(super) fn holds(row: &Row, now_us: i64, what: &str) -> Result<Vec<Hold>, LockError> {
    let owners: Option<Vec<String>> = col(row, 9, what)?;
    let fences: Option<Vec<i64>> = col(row, 10, what)?;
    let acquired: Option<Vec<i64>> = col(row, 11, what)?;
    let expires: Option<Vec<i64>> = col(row, 12, what)?;
    let metadata: Option<Vec<Option<String>>> = col(row, 13, what)?;
    let (owners, fences, acquired, expires, metadata) = (
        owners.unwrap_or_default(),
        fences.unwrap_or_default(),
        acquired.unwrap_or_default(),
        expires.unwrap_or_default(),
        metadata.unwrap_or_default(),
    );
    let n = owners.len();
    if [fences.len(), acquired.len(), expires.len(), metadata.len()] != [n; 4] {
        return Err(bad_reply(what));
    }
    let mut out = Vec::with_capacity(n);
    for (i, owner) in owners.into_iter().enumerate() {
        let fence = u64::try_from(fences[i]).map_err(|_| bad_reply(what))?;
        out.push(
            Hold::new(
                owner,
                fence,
                server_time(acquired[i]),
                server_time(expires[i]),
                micros(expires[i].saturating_sub(now_us)),
            )
            .with_metadata(
                metadata[i]
                    .as_deref()
                    .and_then(|m| LockMetadata::from_json(m).ok()),
            ),
        );
    }
    Ok(out)
}

//! Deposits and balances: the locked read-then-write and its query.

use super::*;

/// The [`LockRequest`](tower_lock::LockRequest) of the deposit route: lock
/// `account:{id}` as the query asks.
///
/// A request whose query is invalid takes no lock: the handler parses the
/// same query and answers 400 before touching the balance.
pub(crate) fn deposit_lock(req: &Request<Body>) -> Option<LockSpec> {
    let id = path_params(req).get("id")?.to_owned();
    let params = DepositParams::from_uri(req.uri()).ok()?;
    Some(params.lock_spec(&id))
}

/// The query of a deposit.
#[derive(Debug)]
pub(crate) struct DepositParams {
    amount: i64,
    hold: Duration,
    wait: Duration,
    ttl: Duration,
    keep: bool,
    watchdog: bool,
    /// A pause between the deposit's own lost-lock check and its write.
    pause: Duration,
}

impl DepositParams {
    pub(crate) fn from_uri(uri: &Uri) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map_err(|_| ApiError::bad_request("the query string is malformed"))?;
        let mut amount = None;
        let mut hold_ms = None;
        let mut wait_ms = None;
        let mut ttl_ms = None;
        let mut keep = None;
        let mut watchdog = None;
        let mut pause_ms = None;
        for (name, value) in &pairs {
            match name.as_str() {
                "amount" => set_once(&mut amount, name, value)?,
                "hold_ms" => set_once(&mut hold_ms, name, value)?,
                "wait_ms" => set_once(&mut wait_ms, name, value)?,
                "ttl_ms" => set_once(&mut ttl_ms, name, value)?,
                "keep" => set_once(&mut keep, name, value)?,
                "watchdog" => set_once(&mut watchdog, name, value)?,
                "pause_ms" => set_once(&mut pause_ms, name, value)?,
                // Unknown parameters are ignored, as most HTTP APIs do.
                _ => {}
            }
        }
        // Bounded as the other routes' durations are: a client must not
        // hold an account (or a connection) for a year.
        let ms = |v: Option<u64>, name: &str, max: Duration| {
            let Some(v) = v else { return Ok(None) };
            let d = Duration::from_millis(v);
            if d > max {
                return Err(ApiError::bad_request(format!(
                    "`{name}` must be at most {} ms",
                    max.as_millis()
                )));
            }
            Ok(Some(d))
        };
        Ok(DepositParams {
            amount: amount
                .ok_or_else(|| ApiError::bad_request("missing query parameter `amount`"))?,
            hold: ms(hold_ms, "hold_ms", MAX_WORK)?.unwrap_or(Duration::ZERO),
            wait: ms(wait_ms, "wait_ms", MAX_WORK)?.unwrap_or(Duration::ZERO),
            ttl: ms(ttl_ms, "ttl_ms", MAX_LOCK_TTL)?.unwrap_or(DEFAULT_TTL),
            keep: keep.unwrap_or(false),
            watchdog: watchdog.unwrap_or(false),
            pause: ms(pause_ms, "pause_ms", MAX_WORK)?.unwrap_or(Duration::ZERO),
        })
    }

    pub(crate) fn lock_spec(&self, id: &str) -> LockSpec {
        LockSpec::global(format!("account:{id}"), self.ttl)
            .max_wait(self.wait)
            .auto_release(!self.keep)
            .watchdog(self.watchdog)
    }
}

/// Parse `value` into `slot`, refusing a second occurrence of `name`.
pub(crate) fn set_once<T: std::str::FromStr>(
    slot: &mut Option<T>,
    name: &str,
    value: &str,
) -> Result<(), ApiError> {
    if slot.is_some() {
        return Err(ApiError::bad_request(format!(
            "query parameter `{name}` is given twice"
        )));
    }
    let parsed = value.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "query parameter `{name}` has an invalid value `{value}` (integers in range; `true`/`false` for flags)"
        ))
    })?;
    *slot = Some(parsed);
    Ok(())
}

pub(crate) async fn deposit(
    State(bank): State<Arc<Bank>>,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
    uri: Uri,
    locks: Option<Locks>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Path(id) = id.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let params = DepositParams::from_uri(&uri)?;
    // Valid parameters always come with the lock (see `deposit_lock`); never
    // touch the balance without it.
    let lock = locks.and_then(|l| l.first()).ok_or_else(|| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            "the account lock is not held",
        )
    })?;

    let fence = lock.fence();
    let balance = if bank.fenced {
        bank.balances.read_fenced(&id, fence).await?
    } else {
        bank.balances.get(&id).await?
    };
    tokio::time::sleep(params.hold).await;
    let balance = balance
        .checked_add(params.amount)
        .ok_or_else(|| ApiError::bad_request("the deposit would overflow the balance"))?;
    if bank.fenced {
        // Not enough alone (the process can pause between this check and the
        // write), which is why the store checks the fence as it writes.
        if lock.is_lost() {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "LOCK_LOST",
                "the account's lock was lost before the deposit could write (its TTL passed): \
                 nothing was written",
            ));
        }
        // A pause here (GC, swap, SIGSTOP) is what no check in the handler
        // can catch; `pause_ms` makes one.
        tokio::time::sleep(params.pause).await;
        bank.write_fenced(&id, balance, fence).await?;
    } else {
        bank.balances.set(&id, balance).await?;
    }

    Ok(Json(json!({ "balance": balance, "fence": fence })))
}

pub(crate) async fn balance(
    State(bank): State<Arc<Bank>>,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Path(id) = id.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if bank.fenced {
        let (balance, fence) = bank.balances.account(&id).await?;
        return Ok(Json(json!({ "balance": balance, "fence": fence })));
    }
    let balance = bank.balances.get(&id).await?;
    Ok(Json(json!({ "balance": balance })))
}

//! Exports: at most [`EXPORTS_PER_ACCOUNT`] at once per account, across
//! every bank process sharing the store (a lock with permits), and reads
//! that run beside each other but never beside a deposit (a shared hold).

use super::*;

/// Exports of one account allowed at once, across every process.
pub(crate) const EXPORTS_PER_ACCOUNT: u32 = 2;
/// TTL of an export's permit, renewed by the watchdog while it works: a bank
/// killed mid-export frees its permit within it.
const EXPORT_TTL: Duration = Duration::from_secs(10);
/// How long a balance read waits for a deposit to finish.
const READ_MAX_WAIT: Duration = Duration::from_secs(5);

/// The lock of `GET /accounts/{id}`: [`read_lock`] where the backend holds
/// shared locks; none (reads as before kinds) where it does not, or with
/// `--fenced` (reads there show the store's own view while a holder may be
/// frozen mid-deposit).
pub(crate) fn read_locks(
    bank: &Bank,
) -> impl Fn(&Request<Body>) -> Option<LockSpec> + Clone + Send + Sync + 'static {
    let shared = bank.locks.supports(tower_lock::LockKind::Shared) && !bank.fenced;
    move |req: &Request<Body>| if shared { read_lock(req) } else { None }
}

/// `GET /accounts/{id}`: a shared hold on the deposit's lock. Reads run
/// together; a read waits (up to [`READ_MAX_WAIT`]) for a running deposit,
/// and a deposit finds the account busy while reads hold it.
fn read_lock(req: &Request<Body>) -> Option<LockSpec> {
    let id = path_params(req).get("id")?.to_owned();
    Some(
        LockSpec::global(format!("account:{id}"), DEFAULT_TTL)
            .shared()
            .max_wait(READ_MAX_WAIT),
    )
}

/// `POST /accounts/{id}/export`: one of the account's export permits. An
/// invalid query locks nothing: the handler answers 400.
pub(crate) fn export_lock(req: &Request<Body>) -> Option<LockSpec> {
    let id = path_params(req).get("id")?.to_owned();
    let params = ExportParams::from_uri(req.uri()).ok()?;
    Some(
        LockSpec::global(format!("export:{id}"), EXPORT_TTL)
            .permits(EXPORTS_PER_ACCOUNT)
            .max_wait(params.wait)
            .watchdog(true),
    )
}

/// The query of an export: `work_ms` (default 0) and `wait_ms` (default 0),
/// each at most [`MAX_WORK`].
pub(crate) struct ExportParams {
    work: Duration,
    wait: Duration,
}

impl ExportParams {
    pub(crate) fn from_uri(uri: &Uri) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map_err(|_| ApiError::bad_request("the query string is malformed"))?;
        let (mut work_ms, mut wait_ms) = (None::<u64>, None::<u64>);
        for (name, value) in &pairs {
            match name.as_str() {
                "work_ms" => set_once(&mut work_ms, name, value)?,
                "wait_ms" => set_once(&mut wait_ms, name, value)?,
                _ => {}
            }
        }
        let ms = |v: Option<u64>, name: &str| {
            let d = Duration::from_millis(v.unwrap_or(0));
            if d > MAX_WORK {
                return Err(ApiError::bad_request(format!(
                    "`{name}` must be at most {} ms",
                    MAX_WORK.as_millis()
                )));
            }
            Ok(d)
        };
        Ok(ExportParams {
            work: ms(work_ms, "work_ms")?,
            wait: ms(wait_ms, "wait_ms")?,
        })
    }
}

/// The highest number of exports of each account seen running at once (by
/// the store's count, which every process shares), as this process saw it.
#[derive(Default)]
pub(crate) struct Exports {
    max: Mutex<HashMap<String, i64>>,
}

impl Exports {
    fn saw(&self, id: &str, running: i64) {
        let mut max = self.max.lock().unwrap_or_else(|e| e.into_inner());
        let seen = max.entry(id.to_owned()).or_default();
        *seen = (*seen).max(running);
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        let max = self.max.lock().unwrap_or_else(|e| e.into_inner());
        json!(*max)
    }
}

/// Counts the export out of the store's running count: before the answer
/// (so before its permit is given back: the count never lags behind the
/// permits), or, when the client went away and the handler was dropped,
/// from a task of its own.
struct Running {
    bank: Arc<Bank>,
    id: Option<String>,
}

impl Running {
    async fn leave(mut self) -> Result<(), ApiError> {
        let id = self.id.take().unwrap_or_default();
        self.bank.balances.add_running(&id, -1).await.map(drop)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let bank = self.bank.clone();
        tokio::spawn(async move {
            if let Err(e) = bank.balances.add_running(&id, -1).await {
                tracing::warn!("an export's end was not counted: {}", e.message);
            }
        });
    }
}

/// The export itself: counts itself in, works `work_ms`, answers
/// `{"account": id, "running": n}` with the number of exports of the
/// account running (in every process) when it started, itself included.
pub(crate) async fn export(
    State(bank): State<Arc<Bank>>,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
    uri: Uri,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Path(id) = id.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let params = ExportParams::from_uri(&uri)?;
    let running = bank.balances.add_running(&id, 1).await?;
    let counted = Running {
        bank: bank.clone(),
        id: Some(id.clone()),
    };
    bank.exports.saw(&id, running);
    tokio::time::sleep(params.work).await;
    counted.leave().await?;
    Ok(Json(json!({ "account": id, "running": running })))
}

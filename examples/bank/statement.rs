//! Statements: one computation per burst through `SingleFlightLayer`.

use super::*;

/// The single-flight of the statement route: one computation per account
/// at a time. An invalid query shares nothing: the handler answers 400.
pub(crate) fn statement_flight(req: &Request<Body>) -> Option<FlightSpec> {
    let id = path_params(req).get("id")?.to_owned();
    let params = StatementParams::from_uri(req.uri()).ok()?;
    Some(FlightSpec::new(format!("statement:{id}")).result_ttl(params.result_ttl))
}

/// The query of a statement.
pub(crate) struct StatementParams {
    work: Duration,
    result_ttl: Duration,
    fail: bool,
}

impl StatementParams {
    pub(crate) fn from_uri(uri: &Uri) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map_err(|_| ApiError::bad_request("the query string is malformed"))?;
        let mut work_ms = None;
        let mut result_ttl_ms = None;
        let mut fail = None;
        for (name, value) in &pairs {
            match name.as_str() {
                "work_ms" => set_once(&mut work_ms, name, value)?,
                "result_ttl_ms" => set_once(&mut result_ttl_ms, name, value)?,
                "fail" => set_once(&mut fail, name, value)?,
                _ => {}
            }
        }
        let bounded = |ms: Option<u64>, max: Duration, name: &str| {
            let d = Duration::from_millis(ms.unwrap_or(0));
            if d > max {
                return Err(ApiError::bad_request(format!(
                    "query parameter `{name}` is over {} ms",
                    max.as_millis()
                )));
            }
            Ok(d)
        };
        Ok(StatementParams {
            work: bounded(work_ms, MAX_WORK, "work_ms")?,
            result_ttl: bounded(result_ttl_ms, MAX_RESULT_TTL, "result_ttl_ms")?,
            fail: fail.unwrap_or(false),
        })
    }
}

/// One statement computation (the single-flight layer runs it once per
/// burst): `work_ms` of work, then the balance.
pub(crate) async fn statement(
    State(bank): State<Arc<Bank>>,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
    uri: Uri,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Path(id) = id.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let params = StatementParams::from_uri(&uri)?;
    bank.statements_computed.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(params.work).await;
    if params.fail {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "STATEMENT_FAILED",
            "the statement computation failed (fail=true)",
        ));
    }
    let balance = bank.balances.get(&id).await?;
    // Names this computation: equal bodies came from one computation.
    let computation = uuid::Uuid::new_v4().as_u64_pair().0;
    Ok(Json(json!({
        "account": id,
        "balance": balance,
        "computation": computation,
    })))
}

/// `GET /stats`.
pub(crate) async fn stats(State(bank): State<Arc<Bank>>) -> Json<serde_json::Value> {
    Json(json!({
        "statements_computed": bank.statements_computed.load(Ordering::Relaxed),
        "max_concurrent_exports": bank.exports.to_json(),
    }))
}

//! `--metrics`: tower-lock's metrics in the Prometheus text format.

#[cfg(feature = "metrics")]
use super::*;

/// `--metrics`: the handle that renders what the process recorded.
#[cfg(feature = "metrics")]
pub(crate) type Metrics = metrics_exporter_prometheus::PrometheusHandle;
#[cfg(not(feature = "metrics"))]
pub(crate) type Metrics = std::convert::Infallible;

/// Install the Prometheus recorder for the whole process. Its default
/// features are off (no HTTP listener of its own: `/metrics` is a route of
/// this app), so upkeep (draining histogram samples) is ours.
#[cfg(feature = "metrics")]
pub(crate) fn install_metrics() -> Result<Metrics, String> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    /// Seconds, from a fast in-memory acquisition to a long hold.
    const BUCKETS: &[f64] = &[
        0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
        10.0, 30.0, 60.0,
    ];
    let handle = PrometheusBuilder::new()
        // Histograms, not the exporter's default summaries: they aggregate
        // over several bank processes.
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), BUCKETS)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| format!("--metrics: {e}"))?;
    tower_lock::describe_metrics();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn install_metrics() -> Result<Metrics, String> {
    Err("--metrics needs tower-lock's `metrics` feature".to_owned())
}

/// `GET /metrics`.
#[cfg(feature = "metrics")]
pub(crate) async fn render_metrics(handle: Metrics) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        handle.render(),
    )
        .into_response()
}

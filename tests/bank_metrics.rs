//! `bank --metrics` as a process: after real traffic, a scrape of
//! `GET /metrics` (Prometheus text format) shows the deposit route's
//! acquisitions by outcome. Without the flag the route does not exist.

mod common;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty};

use common::bank::{ADMIN_TOKEN, Bank, spawn_post, wait_until_locked, within_timeout};

/// `GET /metrics`: status, content type and body as text.
async fn scrape(bank: &Bank) -> (StatusCode, String, String) {
    let http = bank.http();
    let req = Request::builder()
        .method(Method::GET)
        .uri(format!("{}/metrics", http.base))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let res = http.client.request(req).await.unwrap();
    let status = res.status();
    let content_type = res
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        content_type,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

/// The value of the sample `name` whose labels include every one of
/// `labels` (`key="value"` as the text format writes them); 0 if absent.
fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            series
                .strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{'))
                && labels.iter().all(|label| series.contains(label))
        })
        .map(|(_, value)| value.parse::<f64>().unwrap())
        .sum()
}

const ROUTE: &str = r#"route="/accounts/{id}/deposit""#;

#[tokio::test]
async fn a_scrape_after_traffic_counts_acquisitions_by_outcome() {
    within_timeout(async {
        let bank = Bank::start_with(&["--metrics", "--admin-token", ADMIN_TOKEN]);
        let http = bank.http();
        // Before any traffic: the page exists, without acquisitions.
        let (status, content_type, text) = scrape(&bank).await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            content_type.starts_with("text/plain; version=0.0.4"),
            "{content_type}"
        );
        assert_eq!(sample(&text, "tower_lock_acquisitions_total", &[]), 0.0);

        // A deposit holding account 7 for a while...
        let holder = spawn_post(&http, "/accounts/7/deposit?amount=5&hold_ms=300");
        wait_until_locked(&http, "account:7").await;
        // ...so a second one without waiting is refused: busy, 429.
        let busy = http.post("/accounts/7/deposit?amount=1").await;
        busy.assert_json(StatusCode::TOO_MANY_REQUESTS);
        holder.await.unwrap().assert_json(StatusCode::OK);
        // Free again: acquired.
        http.post("/accounts/7/deposit?amount=1")
            .await
            .assert_json(StatusCode::OK);

        let (_, _, text) = scrape(&bank).await;
        let acquisitions = |outcome: &str| {
            let outcome = format!(r#"outcome="{outcome}""#);
            sample(
                &text,
                "tower_lock_acquisitions_total",
                &[r#"backend="memory""#, ROUTE, &outcome],
            )
        };
        assert_eq!(acquisitions("acquired"), 2.0, "{text}");
        assert_eq!(acquisitions("busy"), 1.0, "{text}");
        assert_eq!(acquisitions("timeout"), 0.0, "{text}");
        // Wait and held times are histograms in seconds, with help text.
        assert!(
            text.contains("# TYPE tower_lock_acquire_wait_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("# HELP tower_lock_acquisitions_total"),
            "{text}"
        );
        assert_eq!(
            sample(&text, "tower_lock_held_seconds_count", &[ROUTE]),
            2.0,
            "{text}"
        );
        // No key, account or owner in any label.
        assert!(
            !text.contains("account:7") && !text.contains("/accounts/7"),
            "{text}"
        );
    })
    .await;
}

#[tokio::test]
async fn without_the_flag_there_is_no_metrics_route() {
    within_timeout(async {
        let bank = Bank::start();
        let (status, _, text) = scrape(&bank).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
        assert!(text.contains("NOT_FOUND"), "{text}");
    })
    .await;
}

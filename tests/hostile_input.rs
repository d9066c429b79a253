//! Hostile input over HTTP, fuzzer-style (proptest): paths, percent-encoding,
//! query strings, header values, owner tokens and admin paths against the
//! layer, the `Locks` extractor and the admin router. Whatever comes in:
//! never a panic, never a 5xx other than `503`, and never a lock left held
//! once the response is done. Also `LockToken` from hostile JSON.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::{any as any_method, post};
use http::{HeaderValue, Method, Request, StatusCode};
use http_body_util::BodyExt;
use proptest::prelude::*;
use tower::ServiceExt;
use tower_lock::admin::Admin;
use tower_lock::{
    JobSpec, LockLayer, LockSpec, LockToken, Locks, MemoryBackend, OwnedLock, Scope, SharedBackend,
    path_params,
};

/// A spec from whatever the request carries: the key from the path, the
/// TTL, wait, owner and scope from headers, all unchecked.
fn hostile_locker(req: &Request<Body>) -> Vec<LockSpec> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let Some(key) = path_params(req).get("key").map(str::to_owned) else {
        return Vec::new();
    };
    let ttl_ms = header("x-ttl-ms")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(30_000);
    let mut spec = LockSpec::new(key.clone(), Duration::from_millis(ttl_ms));
    if let Some(wait) = header("x-wait-ms").and_then(|v| v.parse::<u64>().ok()) {
        // At most 20 ms: the case must not wait long on a lock it holds itself.
        spec = spec.max_wait(Duration::from_millis(wait.min(20)));
    }
    if let Some(owner) = header("x-owner") {
        spec = spec.owner(owner);
    }
    if header("x-global").is_some() {
        spec = spec.scope(Scope::Global);
    }
    let mut specs = vec![spec];
    if let Some(second) = header("x-second-key") {
        specs.push(LockSpec::global(second, Duration::from_secs(30)));
    }
    specs
}

fn app(backend: &SharedBackend) -> Router {
    let layer = LockLayer::new(backend.clone(), hostile_locker);
    let handler = any_method(|locks: Option<Locks>, req: Request<Body>| async move {
        let Some(locks) = locks else {
            return "no lock".to_owned();
        };
        // The handler pokes the registry with what the request says, too.
        let key = req
            .headers()
            .get("x-release")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        if let Some(key) = key {
            let _ = locks.release(&key).await;
            let _ = locks.extend(&key, Duration::from_secs(1)).await;
            let _ = locks.status(&key).await;
            drop(locks.cancel_auto_release(&key));
        }
        if let Some(extra) = req.headers().get("x-extra") {
            let spec = LockSpec::new(
                String::from_utf8_lossy(extra.as_bytes()),
                Duration::from_secs(5),
            );
            let _ = locks.acquire(spec).await;
        }
        format!("{}", locks.held().len())
    });
    Router::new()
        .route("/l/{*key}", handler.clone().layer(layer.clone()))
        .route("/p/{key}/x", post(handler).layer(layer))
        .nest(
            "/admin",
            Admin::new(backend.clone()).allow_force(true).router(),
        )
}

/// Any bytes a URI path may carry, including escapes that are malformed,
/// escapes of invalid UTF-8, encoded slashes and braces; plain keys most
/// often, so that many cases take locks and must give them back.
fn path_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => "[a-zA-Z0-9:_.~-]{1,12}",
        2 => "(%[0-9A-Fa-f]{2}|%[^0-9A-Fa-f]{0,2}|%|[{}:+&=;,@!$'()*a-z])*",
        2 => proptest::collection::vec(any::<u8>(), 0..12).prop_map(|bytes| {
            bytes
                .iter()
                .map(|b| format!("%{b:02X}"))
                .collect::<String>()
        }),
        1 => Just("a".repeat(600)),
        1 => Just("%E2%82%AC".repeat(200)),
    ]
}

fn query() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "(route|force|key|x)=[a-zA-Z0-9%{}/+&=]{0,20}",
        "route=%[0-9A-Za-z]{0,2}&force=(true|1|yes|%)",
        path_piece().prop_map(|p| format!("route={p}&force=true")),
    ]
}

/// Header values as HTTP carries them: visible ASCII, spaces and obs-text;
/// token-like values and numbers most often.
fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => "[!-~]{1,16}".prop_map(String::into_bytes),
        3 => (0u64..100_000).prop_map(|n| n.to_string().into_bytes()),
        2 => "[ -~]{0,40}".prop_map(String::into_bytes),
        1 => proptest::collection::vec(
            prop_oneof![0x20u8..=0x7e, 0x80u8..=0xff, Just(b'\t')],
            0..40
        ),
        1 => Just(b"18446744073709551615".to_vec()),
        1 => Just(b"99999999999999999999999".to_vec()),
        1 => Just(b"0".to_vec()),
        1 => Just("x".repeat(200).into_bytes()),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    method: Method,
    route: &'static str,
    path: String,
    query: String,
    headers: Vec<(&'static str, Vec<u8>)>,
}

fn case() -> impl Strategy<Value = Case> {
    let names = prop::sample::subsequence(
        vec![
            "x-ttl-ms",
            "x-wait-ms",
            "x-owner",
            "x-global",
            "x-second-key",
            "x-release",
            "x-extra",
            "lock-owner",
        ],
        0..=8,
    );
    (
        prop_oneof![Just(Method::GET), Just(Method::POST), Just(Method::DELETE)],
        prop_oneof![3 => Just("/l/"), 2 => Just("/p/"), 2 => Just("/admin/locks/")],
        proptest::collection::vec(path_piece(), 1..3),
        query(),
        names,
        proptest::collection::vec(header_value(), 8),
    )
        .prop_map(|(method, route, pieces, query, names, values)| Case {
            method,
            route,
            path: pieces.join("/"),
            query,
            headers: names.into_iter().zip(values).collect(),
        })
}

async fn run_case(backend: &SharedBackend, c: &Case) -> Result<(), TestCaseError> {
    let mut uri = format!("{}{}", c.route, c.path);
    if c.route == "/p/" {
        uri.push_str("/x");
    }
    if !c.query.is_empty() {
        uri.push('?');
        uri.push_str(&c.query);
    }
    // Some of these are not valid URIs at all: the server never sees them.
    let Ok(mut req) = Request::builder()
        .method(c.method.clone())
        .uri(uri.as_str())
        .body(Body::empty())
    else {
        return Ok(());
    };
    for (name, value) in &c.headers {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            req.headers_mut().insert(*name, value);
        }
    }
    let res = app(backend).oneshot(req).await.expect("infallible");
    let status = res.status();
    let body = res.into_body().collect().await.expect("body").to_bytes();
    prop_assert!(
        !status.is_server_error() || status == StatusCode::SERVICE_UNAVAILABLE,
        "{status} for {uri}: {}",
        String::from_utf8_lossy(&body)
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 768,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn hostile_requests_never_panic_never_5xx_never_leave_a_lock(c in case()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let memory = MemoryBackend::new();
            let backend = SharedBackend::new(memory.clone());
            run_case(&backend, &c).await?;
            // A release removes the entry (also of a lock whose TTL ran
            // out) and a refused acquire makes none: any entry left is a lock
            // nobody released.
            prop_assert!(memory.is_empty(), "a lock is left held after {c:?}");
            Ok(())
        })?;
    }

    #[test]
    fn lock_tokens_from_hostile_json_never_panic(json in hostile_json()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let backend = SharedBackend::new(MemoryBackend::new());
            // A lock under a known key, for tokens that name it.
            let held = OwnedLock::acquire(&backend, &JobSpec::new("k", Duration::from_secs(30)))
                .await
                .unwrap();
            if let Ok(token) = serde_json::from_str::<LockToken>(&json) {
                // Restoring is either a handle or a typed error.
                if let Ok(restored) = OwnedLock::restore(&backend, &token).await {
                    prop_assert_eq!(restored.fence(), held.fence());
                    drop(restored.keep());
                }
            }
            held.release().await.unwrap();
            Ok(())
        })?;
    }
}

/// JSON shaped like a token, with hostile values in every field.
fn hostile_json() -> impl Strategy<Value = String> {
    let s = prop_oneof![
        Just("\"k\"".to_owned()),
        Just("\"\"".to_owned()),
        Just(format!("\"{}\"", "k".repeat(600))),
        Just("\"a\\u0000b\"".to_owned()),
        Just("\"\\ud800\"".to_owned()),
        Just("\"\\n\"".to_owned()),
        "\"[ -~]{0,20}\"".prop_map(|s| s.replace('\\', "\\\\")),
        Just("null".to_owned()),
        Just("7".to_owned()),
        Just("[]".to_owned()),
    ];
    let n = prop_oneof![
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("18446744073709551615".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("1e400".to_owned()),
        Just("1.5".to_owned()),
        Just("\"9\"".to_owned()),
        Just("null".to_owned()),
        any::<u64>().prop_map(|n| n.to_string()),
    ];
    (
        s.clone(),
        s.clone(),
        s,
        n.clone(),
        n.clone(),
        n,
        any::<u8>(),
    )
        .prop_map(|(key, route, owner, fence, expires, ttl, drop_mask)| {
            let mut fields = vec![
                format!("\"key\":{key}"),
                format!("\"route\":{route}"),
                format!("\"owner\":{owner}"),
                format!("\"fence\":{fence}"),
                format!("\"expires_at_ms\":{expires}"),
                format!("\"ttl_ms\":{ttl}"),
            ];
            let mut i = 0;
            fields.retain(|_| {
                i += 1;
                drop_mask & (1 << (i - 1)) == 0
            });
            format!("{{{}}}", fields.join(","))
        })
}

/// A path parameter that is not UTF-8 once percent-decoded (`%FF`): the
/// `LockRequest` reads no parameters and names no lock (or not every lock
/// it would), and the request must not then run unlocked. It is refused
/// (400 `LOCK_INVALID_KEY`), as axum's own `Path` extractor refuses it,
/// also under a nested router (read through axum's own extractor); other
/// requests pass as before.
#[tokio::test]
async fn an_undecodable_path_parameter_never_runs_the_handler_unlocked() {
    let backend = SharedBackend::new(MemoryBackend::new());
    let app = Router::new().merge(app(&backend)).nest("/n", app(&backend));
    for (uri, status, body) in [
        ("/p/%FF/x", StatusCode::BAD_REQUEST, "LOCK_INVALID_KEY"),
        ("/p/ok/x", StatusCode::OK, ""),
        ("/n/p/%FF/x", StatusCode::BAD_REQUEST, "LOCK_INVALID_KEY"),
        ("/n/p/ok/x", StatusCode::OK, ""),
    ] {
        let res = app
            .clone()
            .oneshot(Request::post(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), status, "{uri}");
        let text = res.into_body().collect().await.unwrap().to_bytes();
        assert!(
            String::from_utf8_lossy(&text).contains(body),
            "{uri}: {text:?}"
        );
    }
}

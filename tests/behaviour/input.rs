//! Input normalised or refused before it is used (issue 21, items 15 and
//! 16): a client lock's key rule sees the key that is locked, and lock
//! metadata reads back as it was stored on every backend, or is refused
//! (`LOCK_INVALID_METADATA`) on every backend alike.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::Request;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde_json::{Map, Value, json};
use tower_lock::backend::Holder;
use tower_lock::{
    ClientLocks, JobSpec, LockError, LockKey, LockLayer, LockMetadata, LockSpec, Locks,
    MAX_METADATA_BYTES, MAX_METADATA_DEPTH, OwnedLock,
};

use super::harness::Harness;
use super::support::{areq, assert_released, gkey, post_req, send, status_of, with_header};

// ---------------------------------------------------------------------------
// Client-directed locks: the key rule runs on the key that is locked.

/// `/pay` under `locks`; the handler answers who holds `held` while it runs.
fn pay_app(h: &Harness, locks: ClientLocks, held: &LockKey) -> (Router, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let (seen, backend, held) = (runs.clone(), h.backend.clone(), held.clone());
    let handler = move || {
        let (seen, backend, held) = (seen.clone(), backend.clone(), held.clone());
        async move {
            seen.fetch_add(1, SeqCst);
            let status = backend.status(&held).await.unwrap();
            status.map_or("free".to_owned(), |s| s.owner)
        }
    };
    let layer = LockLayer::new(h.backend.clone(), locks).lock_headers(true);
    (
        Router::new().route("/pay", post(handler).layer(layer)),
        runs,
    )
}

pub async fn client_key_rules_see_the_key_that_is_locked(h: Harness) {
    // `invoicé-7` with a precomposed é (NFC: what a lock key is), and as a
    // client may send it: `e` followed by a combining acute accent.
    const COMPOSED: &str = "invoic\u{e9}-7";
    let pay = || {
        let req = with_header(post_req("/pay"), "lock-key", b"invoice%CC%81-7");
        with_header(req, "lock-ttl", b"5s")
    };
    let held = LockKey::route("/pay", COMPOSED).unwrap();

    // A rule that refuses the key refuses every spelling of it.
    let refusing = ClientLocks::new().allow_keys(|key: &str| key != COMPOSED);
    let (app, runs) = pay_app(&h, refusing, &held);
    send(&app, pay())
        .await
        .assert_rejection(400, "LOCK_NOT_ALLOWED");
    assert_eq!(runs.load(SeqCst), 0, "the handler never ran");
    assert_eq!(status_of(&h.backend, &held).await, None, "nothing locked");

    // A rule that allows only that key lets every spelling of it lock it.
    let only = ClientLocks::new().allow_keys(|key: &str| key == COMPOSED);
    let (app, runs) = pay_app(&h, only, &held);
    let reply = send(&app, pay()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_ne!(
        reply.text(),
        "free",
        "`invoicé-7` held while the handler ran"
    );
    assert_eq!(runs.load(SeqCst), 1);
    assert_eq!(
        reply.headers["lock-key"], "invoic%C3%A9-7",
        "the key that was locked"
    );
    assert_released(&h, &held).await;
}

// ---------------------------------------------------------------------------
// The `Locks` extractor finds a lock by any spelling of its key.

pub async fn a_requests_locks_are_found_by_any_spelling_of_their_key(h: Harness) {
    // What the spec was given (decomposed) and what is locked (NFC).
    const GIVEN: [&str; 2] = ["cafe\u{301}:1", "cafe\u{301}:2"];
    const LOCKED: [&str; 2] = ["caf\u{e9}:1", "caf\u{e9}:2"];
    let layer = LockLayer::new(h.backend.clone(), |_: &Request<Body>| {
        GIVEN.map(|key| LockSpec::global(key, Duration::from_secs(30)))
    });
    let handler = |locks: Locks| async move {
        let found = [GIVEN[0], LOCKED[0]].map(|key| locks.get(key).is_some());
        let status = locks.status(GIVEN[0]).await.map(|s| s.is_some());
        let extended = locks
            .extend(GIVEN[0], Duration::from_secs(20))
            .await
            .is_ok();
        let released = locks.release(GIVEN[0]).await;
        let again = locks.release(LOCKED[0]).await;
        // Handed over by the spelling the spec was given: released here.
        let handed = match locks.cancel_auto_release(GIVEN[1]) {
            Some(lock) => lock.release().await.is_ok(),
            None => false,
        };
        format!("{found:?} {status:?} {extended} {released:?} {again:?} {handed}")
    };
    let app = Router::new().route("/cafe", post(handler).layer(layer));
    let reply = send(&app, post_req("/cafe")).await;
    assert_eq!(
        reply.text(),
        "[true, true] Ok(true) true Ok(()) Err(AlreadyReleased) true"
    );
    for key in LOCKED {
        assert_released(&h, &gkey(key)).await;
    }
}

// ---------------------------------------------------------------------------
// Metadata: nesting depth and NUL, refused everywhere alike.

/// An object nested `depth` levels deep (itself level 1), objects and
/// arrays in turn: `{"n":[{"n":[…"leaf"…]}]}`.
fn nested(depth: usize) -> Value {
    let mut value = json!("leaf");
    for level in (1..=depth).rev() {
        value = if level % 2 == 1 {
            json!({ "n": value })
        } else {
            json!([value])
        };
    }
    value
}

/// `value` is refused as metadata on every way in, and nothing is locked.
async fn assert_refused(h: &Harness, name: &str, value: Value) {
    assert!(
        matches!(
            LockMetadata::new(value.clone()),
            Err(LockError::InvalidMetadata(_))
        ),
        "{name}: LockMetadata::new"
    );
    if let Ok(text) = serde_json::to_string(&value) {
        assert!(
            LockMetadata::from_json(&text).is_err(),
            "{name}: LockMetadata::from_json"
        );
    }
    let key = format!("meta:refused:{name}");
    let spec = JobSpec::new(&key, Duration::from_secs(5)).metadata(value.clone());
    assert!(
        matches!(
            OwnedLock::acquire(&h.backend, &spec).await,
            Err(LockError::InvalidMetadata(_))
        ),
        "{name}: OwnedLock::acquire"
    );
    let layer = LockLayer::new(h.backend.clone(), move |_: &Request<Body>| {
        Some(LockSpec::from(spec.clone()))
    });
    let app = Router::new().route("/run", post(|| async { "ran" }).layer(layer));
    send(&app, post_req("/run"))
        .await
        .assert_rejection(400, "LOCK_INVALID_METADATA");
    assert_eq!(status_of(&h.backend, &gkey(&key)).await, None, "{name}");
}

pub async fn metadata_deeper_than_the_limit_or_with_nul_is_refused(h: Harness) {
    // Issue 21's case: 200 levels fit in 4 KiB, and read back as no metadata
    // on Redis and PostgreSQL.
    assert!(serde_json::to_string(&nested(200)).unwrap().len() < MAX_METADATA_BYTES);
    assert_refused(&h, "depth-200", nested(200)).await;
    assert_refused(&h, "depth-limit+1", nested(MAX_METADATA_DEPTH + 1)).await;
    let mut deep_array = json!([]);
    for _ in 0..MAX_METADATA_DEPTH {
        deep_array = json!([deep_array]);
    }
    assert_refused(&h, "arrays", json!({ "a": deep_array })).await;

    // NUL: PostgreSQL's jsonb refuses it (the lock was a 503 there), so it
    // is refused everywhere, in a value, an object key, or deep inside.
    assert_refused(&h, "nul-value", json!({ "by": "a\u{0}b" })).await;
    assert_refused(&h, "nul-key", json!({ "by\u{0}": 1 })).await;
    assert_refused(&h, "nul-deep", json!({ "a": [1, { "b": ["\u{0}"] }] })).await;

    // Text no backend can keep: not read from a backend's reply either.
    for text in [
        r#"{"a":"\u0000"}"#,
        r#"{"a":"\ud800"}"#,
        r#"{"a":"\udc00x"}"#,
    ] {
        assert!(
            matches!(
                LockMetadata::from_json(text),
                Err(LockError::InvalidMetadata(_))
            ),
            "{text}"
        );
    }
}

// ---------------------------------------------------------------------------
// Metadata: what is stored reads back equal, on every backend.

/// The largest `{"<name>":[x,x,…]}` within [`MAX_METADATA_BYTES`].
fn filled(name: &str, x: f64) -> Value {
    let mut items = Vec::new();
    loop {
        items.push(json!(x));
        if serde_json::to_string(&json!({ name: items }))
            .unwrap()
            .len()
            > MAX_METADATA_BYTES
        {
            items.pop();
            return json!({ name: items });
        }
    }
}

/// Values every backend must give back as they were stored, chosen for
/// what PostgreSQL's `jsonb` does to JSON text (numbers as `numeric`,
/// written without exponent; keys re-ordered; escapes re-written) and what
/// serde_json reads back (depth, float precision).
fn awkward() -> Vec<Value> {
    vec![
        json!({}),
        nested(MAX_METADATA_DEPTH),
        json!({ "f": [
            -0.0, 0.0, 1e16, -1e16, 9_999_999_999_999_998.0, 1.8446744073709552e19,
            18_446_744_073_709_549_568.0, -9.223372036854776e18, -9.223372036854778e18,
            -1.8446744073709552e19, 1e300, -1e300, 5e-324,
            f64::MAX, f64::MIN, f64::MIN_POSITIVE, 1e-6, 1e-5, 0.1,
            0.30000000000000004, 1.0715660391465826e-75, -1.81996730402717e-179,
            123_456_789_012_345.6, 1.5,
        ] }),
        json!({ "i": [0, -1, u64::MAX, i64::MIN, i64::MAX, 10_000_000_000_000_000u64] }),
        json!({
            "s": "\u{1}\u{8}\u{c}\n\r\t\u{1f}\u{7f}\u{2028}\"\\/ caf\u{e9} \u{1f600}",
            "nfd": "cafe\u{301}",
            "cafe\u{301}": "a key that is not NFC",
            "bb": 1, "a": 2, "c": [null, true, false, {}, []], "": "",
        }),
        // The most PostgreSQL writes out longhand: ~50 times the stored size.
        filled("big", 1e308),
        filled("tiny", 5e-324),
    ]
}

/// Any JSON within a few levels, numbers from any bit pattern.
fn any_json() -> impl Strategy<Value = Value> {
    let text = || proptest::string::string_regex("(?s)[^\\x00]{0,8}").unwrap();
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<u64>()
            .prop_map(f64::from_bits)
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    let value = leaf.prop_recursive(6, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    prop::collection::btree_map(text(), value, 0..8)
        .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>()))
}

/// [`awkward`] and 64 generated objects (the same ones every run).
fn round_trip_cases() -> Vec<Value> {
    let mut runner = TestRunner::deterministic();
    let strategy = any_json();
    let mut cases = awkward();
    for _ in 0..64 {
        cases.push(strategy.new_tree(&mut runner).unwrap().current());
    }
    cases
}

pub async fn metadata_reads_back_as_it_was_stored(h: Harness) {
    let b = h.indexed();
    for (i, value) in round_trip_cases().into_iter().enumerate() {
        let Ok(stored) = LockMetadata::new(value.clone()) else {
            // Generated over 4 KiB; the hand-picked ones all fit.
            assert!(i >= awkward().len(), "case {i} is refused");
            continue;
        };
        // Numbers keep their value (-0.0 is 0.0 and a whole float from
        // 1e16 up is an integer, as jsonb keeps them; see LockMetadata).
        assert_eq!(
            LockMetadata::new(stored.to_value()).as_ref(),
            Ok(&stored),
            "case {i}"
        );
        let key = gkey(&format!("meta:rt:{i}"));
        let owner = format!("meta-owner-{i}");
        let req = areq(&key, &owner, Duration::from_secs(30), Duration::ZERO)
            .with_metadata(stored.clone());
        b.acquire(&req).await.unwrap();

        let status = status_of(&b, &key).await.expect("held");
        let back = status
            .metadata
            .unwrap_or_else(|| panic!("case {i}: no metadata read back for {}", stored.as_json()));
        assert_eq!(back.as_json(), stored.as_json(), "case {i}: status");
        assert_eq!(back.to_value(), stored.to_value(), "case {i}");
        let listed = b.held_by(&owner, 1).await.unwrap();
        assert_eq!(
            listed[0]
                .status
                .metadata
                .as_ref()
                .map(LockMetadata::as_json),
            Some(stored.as_json()),
            "case {i}: held_by"
        );
        b.release(&key, Holder::new(&owner, status.fence))
            .await
            .unwrap();
    }
}

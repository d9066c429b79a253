//! [`path_params`]: the matched route's parameters, for a `LockRequest`.

use std::borrow::Cow;

use axum::extract::{MatchedPath, OriginalUri};
use http::Request;
use smallvec::SmallVec;

/// The matched route's path parameters (`/orders/{id}` → `id`), decoded.
///
/// Empty when the request was not routed by axum: the lock layer wraps the
/// whole `Router` from outside (a `tower::ServiceBuilder` around it), which
/// runs before routing, or no route matched. Put the layer on the route, or
/// on the `Router` with `Router::layer`/`route_layer`, which run after
/// routing. A [`LockRequest`](crate::LockRequest) written as
/// `path_params(req).get("id")?` then takes **no lock at all**, and the
/// request runs unlocked: the layer logs a warning (once per layer) when its
/// `LockRequest` reads the parameters of a request that was not routed.
///
/// Also empty, as axum's `Path` has none, when a parameter is not UTF-8 once
/// percent-decoded (`/orders/%FF`): a layer whose `LockRequest` read them
/// refuses that request (`400 LOCK_INVALID_KEY`), as axum's `Path` extractor
/// would, rather than run it with fewer locks than it names (or none).
///
/// Borrows from the request where it can: reading the parameters of a
/// simple route (`/orders/{id}`) allocates nothing unless a value is
/// percent-encoded. [`into_owned`](PathParams::into_owned) detaches it.
///
/// ```
/// use axum::body::Body;
/// use http::Request;
/// use tower_lock::path_params;
///
/// fn order_key(req: &Request<Body>) -> Option<String> {
///     let params = path_params(req);
///     let id = params.get("id")?;
///     Some(format!("order:{id}"))
/// }
/// // Not routed by axum: no parameters.
/// assert_eq!(order_key(&Request::new(Body::empty())), None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathParams<'a>(SmallVec<[(Cow<'a, str>, Cow<'a, str>); 4]>);

impl PathParams<'_> {
    /// The value of parameter `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_ref())
    }

    /// All parameters, in route order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_ref(), v.as_ref()))
    }

    /// The same parameters, not borrowing from the request.
    pub fn into_owned(self) -> PathParams<'static> {
        PathParams(
            self.0
                .into_iter()
                .map(|(k, v)| (Cow::Owned(k.into_owned()), Cow::Owned(v.into_owned())))
                .collect(),
        )
    }
}

thread_local! {
    // What `path_params` met while the layer's `LockRequest` ran (it is
    // synchronous): bit 0 a request that was not routed, bit 1 a parameter
    // that is not UTF-8 once percent-decoded.
    static READ: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

const UNROUTED: u8 = 1;
const UNDECODABLE: u8 = 2;

fn met(what: u8) {
    READ.with(|r| r.set(r.get() | what));
}

/// What `path_params` found empty while `f` ran.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ParamsRead {
    /// The parameters of a request that was not routed (no `MatchedPath`).
    pub(crate) unrouted: bool,
    /// Parameters of which one is not UTF-8 once percent-decoded (axum's
    /// `Path` refuses such a request with 400).
    pub(crate) undecodable: bool,
}

/// Run `f`, and tell what it found when it read path parameters.
pub(crate) fn reading_params<T>(f: impl FnOnce() -> T) -> (T, ParamsRead) {
    READ.with(|r| r.set(0));
    let out = f();
    let read = READ.with(|r| r.replace(0));
    (
        out,
        ParamsRead {
            unrouted: read & UNROUTED != 0,
            undecodable: read & UNDECODABLE != 0,
        },
    )
}

/// Read axum's path parameters from a request (see [`PathParams`]).
pub fn path_params<B>(request: &Request<B>) -> PathParams<'_> {
    let extensions = request.extensions();
    let Some(route) = extensions.get::<MatchedPath>() else {
        met(UNROUTED);
        return PathParams::default();
    };
    let path = request.uri().path();
    // `MatchedPath` is the whole pattern, prefixes of nested routers
    // included, so it only describes `path` if nothing stripped or rewrote
    // the path after the outer router saw it (`OriginalUri`).
    let as_routed = extensions
        .get::<OriginalUri>()
        .is_some_and(|original| original.path() == path);
    as_routed
        .then(|| match_route(route.as_str(), path))
        .flatten()
        .unwrap_or_else(|| extracted_path_params(request))
}

/// The parameters of `path` under the route pattern `route`, for patterns
/// whose parameters are whole, non-empty segments (`/a/{x}/b/{*rest}`).
/// `None` (use axum's extractor) for anything else: other pattern syntax,
/// or a path that does not fit the pattern.
fn match_route<'a>(route: &'a str, path: &'a str) -> Option<PathParams<'a>> {
    let mut params = SmallVec::new();
    let mut rest = path.strip_prefix('/')?;
    let mut patterns = route.strip_prefix('/')?;
    loop {
        // This pattern segment; `more`: others follow it.
        let (pattern, more) = match split_slash(patterns) {
            Some((pattern, tail)) => {
                patterns = tail;
                (pattern, true)
            }
            None => (std::mem::take(&mut patterns), false),
        };
        match pattern.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
            // A literal segment.
            None => {
                if has_brace(pattern) {
                    return None;
                }
                let (segment, tail) = next_segment(rest, more)?;
                if segment != pattern {
                    return None;
                }
                rest = tail;
            }
            Some(name) => {
                if name.is_empty() || has_brace(name) {
                    return None;
                }
                let (name, value) = match name.strip_prefix('*') {
                    // A catch-all: the rest of the path, slashes included.
                    Some(name) if !more && !rest.is_empty() => (name, std::mem::take(&mut rest)),
                    Some(_) => return None,
                    None => {
                        let (segment, tail) = next_segment(rest, more)?;
                        if segment.is_empty() {
                            // axum never matches a parameter to nothing.
                            return None;
                        }
                        rest = tail;
                        (name, segment)
                    }
                };
                // As axum: percent-decoded, and no parameters at all if one is
                // not UTF-8 once decoded.
                let Some(value) = crate::percent::decode_lenient(value) else {
                    met(UNDECODABLE);
                    return Some(PathParams::default());
                };
                params.push((Cow::Borrowed(name), value));
            }
        }
        if !more {
            return rest.is_empty().then_some(PathParams(params));
        }
    }
}

/// `s` split at its first `/`. For segments of a few bytes a plain loop is
/// several times cheaper than `str::split_once`'s searcher.
fn split_slash(s: &str) -> Option<(&str, &str)> {
    let i = s.bytes().position(|b| b == b'/')?;
    Some((&s[..i], &s[i + 1..]))
}

fn has_brace(s: &str) -> bool {
    s.bytes().any(|b| b == b'{' || b == b'}')
}

/// The next `/`-separated segment of `path` and what follows it; `more`:
/// the pattern has more segments, so one must follow.
fn next_segment(path: &str, more: bool) -> Option<(&str, &str)> {
    match split_slash(path) {
        Some((segment, tail)) if more => Some((segment, tail)),
        None if !more => Some((path, "")),
        _ => None,
    }
}

/// Through axum's own extractor. It needs `Parts`, so this builds a
/// body-less copy carrying a clone of every extension: the slow way.
fn extracted_path_params<'a, B>(request: &Request<B>) -> PathParams<'a> {
    use axum::extract::{FromRequestParts, RawPathParams};
    use std::future::Future;
    use std::task::{Context, Poll};

    let (mut parts, ()) = {
        let mut copy = Request::new(());
        *copy.extensions_mut() = request.extensions().clone();
        copy.into_parts()
    };
    let fut = <RawPathParams as FromRequestParts<()>>::from_request_parts(&mut parts, &());
    let mut fut = std::pin::pin!(fut);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(raw)) => PathParams(
            raw.iter()
                .map(|(k, v)| (Cow::Owned(k.to_owned()), Cow::Owned(v.to_owned())))
                .collect(),
        ),
        Poll::Ready(Err(
            axum::extract::rejection::RawPathParamsRejection::InvalidUtf8InPathParam(_),
        )) => {
            met(UNDECODABLE);
            PathParams::default()
        }
        _ => PathParams::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::body::Body;
    use axum::routing::get;
    use tower::ServiceExt;

    /// Both ways, as seen by a handler of the route.
    async fn both(request: Request<Body>) -> String {
        let fast = path_params(&request);
        let slow = extracted_path_params(&request);
        assert_eq!(fast, slow, "{}", request.uri());
        let as_routed = request
            .extensions()
            .get::<OriginalUri>()
            .is_some_and(|original| original.path() == request.uri().path());
        format!("{fast:?} as routed: {as_routed}")
    }

    async fn call(app: &Router, uri: &str) -> String {
        let res = app
            .clone()
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert!(res.status().is_success(), "{uri}: {}", res.status());
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn matching_the_route_agrees_with_axums_extractor() {
        let app = Router::new()
            .route("/", get(both))
            .route("/a/{x}", get(both))
            .route("/a/{x}/b/{y}", get(both))
            .route("/f/{*rest}", get(both))
            .route("/t/", get(both))
            .nest("/n/{t}", Router::new().route("/u/{id}", get(both)))
            // Nested routers see the path without their prefix while
            // `MatchedPath` has all of it; these paths fit the whole pattern
            // anyway, with the wrong values.
            .nest("/p/{t}", Router::new().route("/{*rest}", get(both)))
            .nest("/x", Router::new().route("/{*rest}", get(both)))
            .nest_service("/s", Router::new().route("/{*rest}", get(both)))
            .nest("/e/{t}", Router::new().route("/", get(both)));
        for uri in [
            "/",
            "/a/1",
            "/a/%41b",
            "/a/caf%C3%A9",
            "/a/%zz%4",
            "/a/%FF",
            "/a/1/b/two%2Fthree",
            "/f/a/b/c",
            "/f/a%20b/c/",
            "/t/",
            "/n/7/u/9",
            "/p/a/b/c",
            "/p/p/p/z",
            "/x/x/y",
            "/s/s/y",
            "/e/acme",
        ] {
            call(&app, uri).await;
        }
        assert!(call(&app, "/a/%FF").await.contains("[]"), "not UTF-8: none");
        // Un-nested routes take the fast way, nested ones axum's extractor.
        assert!(call(&app, "/a/1/b/2").await.ends_with("as routed: true"));
        assert!(call(&app, "/x/x/y").await.ends_with("as routed: false"));
    }

    #[test]
    fn plain_values_are_borrowed_from_the_path() {
        let params = match_route("/a/{x}/{y}", "/a/1/%41").unwrap();
        assert!(matches!(
            params.0[0],
            (Cow::Borrowed("x"), Cow::Borrowed("1"))
        ));
        assert!(matches!(&params.0[1].1, Cow::Owned(v) if v == "A"));
        assert!(!params.0.spilled(), "up to four parameters stay inline");
        let owned: PathParams<'static> = params.clone().into_owned();
        assert_eq!(owned, params);
        assert_eq!(owned.iter().collect::<Vec<_>>(), [("x", "1"), ("y", "A")]);
    }

    #[test]
    fn simple_patterns_take_the_fast_way() {
        let get = |route, path| match_route(route, path).map(|p| format!("{p:?}"));
        assert_eq!(
            get("/a/{x}/b/{*r}", "/a/1/b/c/d").as_deref(),
            Some(r#"PathParams([("x", "1"), ("r", "c/d")])"#)
        );
        assert_eq!(
            get("/a/{x}", "/a/%41").as_deref(),
            Some(r#"PathParams([("x", "A")])"#)
        );
        // Not this pattern's path (a nested router's view), or other syntax:
        // axum's extractor decides.
        assert_eq!(get("/n/{t}/u/{id}", "/u/9"), None);
        assert_eq!(get("/a/{x}", "/b/1"), None);
        assert_eq!(get("/x/{{y}}/{id}", "/x/{y}/5"), None);
        assert_eq!(get("/f/{*r}", "/f/"), None);
        assert_eq!(get("/a/{x}", "/a/"), None);
    }
}

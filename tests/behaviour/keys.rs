//! (13, encoding part) `LockKey::encoded` is injective over (scope/route,
//! key), and over-long encodings become a fixed-length hash within the limit.
//! Backend-independent: runs once.

use proptest::prelude::*;
use proptest::sample::Index;
use tower_lock::LockKey;

/// (route pattern, or `None` for global; key).
type Pair = (Option<String>, String);

/// The length of the hashed form: `h:` + 64 hex digits.
const HASHED_LEN: usize = 66;

fn make((route, key): &Pair) -> LockKey {
    match route {
        None => LockKey::global(key),
        Some(route) => LockKey::route(route, key),
    }
    .expect("valid key")
}

fn enc(pair: &Pair) -> String {
    make(pair).encoded(usize::MAX)
}

/// Small alphabets full of separators, digits and scope letters, so that
/// look-alike encodings are likely; `é` is NFC-stable (raw equality is key
/// equality).
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[rgh0-9:/{}é]{1,10}",
        // Keys shaped like other namespaces' encodings.
        "(g:|h:|r[0-9]{1,2}:)[a-z0-9:/{}]{0,8}",
    ]
}

fn route() -> impl Strategy<Value = String> {
    "[rg0-9:/{}]{0,8}"
}

fn pair() -> impl Strategy<Value = Pair> {
    (proptest::option::of(route()), key())
}

fn long_pair() -> impl Strategy<Value = Pair> {
    (proptest::option::of("[a-z/{}:]{0,300}"), "[a-z0-9:]{1,512}")
}

/// Other pairs built from `pair`'s pieces: its encoding used as a global
/// key, the route/key boundary moved across `:`, route and key swapped.
fn lookalikes((route, key): &Pair, at: Index) -> Vec<Pair> {
    let mut out = vec![(None, enc(&(route.clone(), key.clone())))];
    let joined = match route {
        Some(route) => format!("{route}:{key}"),
        None => key.clone(),
    };
    out.push((None, joined.clone()));
    let cut = at.index(joined.len() + 1);
    if joined.is_char_boundary(cut) {
        let (r, k) = joined.split_at(cut);
        let k = k.strip_prefix(':').unwrap_or(k);
        if !k.is_empty() {
            out.push((Some(r.to_owned()), k.to_owned()));
            out.push((Some(r.trim_end_matches(':').to_owned()), format!(":{k}")));
        }
    }
    if let Some(route) = route
        && !route.is_empty()
    {
        out.push((Some(key.clone()), route.clone()));
        out.push((Some(format!("{}:{key}", route.len())), route.clone()));
    }
    out
}

proptest! {
    #[test]
    fn encoding_is_injective(a in pair(), b in pair()) {
        prop_assert_eq!(enc(&a) == enc(&b), a == b, "{:?} vs {:?}", a, b);
        prop_assert_eq!(make(&a) == make(&b), a == b);
    }

    #[test]
    fn lookalike_pairs_do_not_collide(a in pair(), at in any::<Index>()) {
        for b in lookalikes(&a, at) {
            if b.1.is_empty() || b.1.chars().any(char::is_control) {
                continue;
            }
            prop_assert_eq!(enc(&a) == enc(&b), a == b, "{:?} vs {:?}", a, b);
        }
    }

    #[test]
    fn long_encodings_are_hashed_within_the_limit(
        a in long_pair(),
        max_len in HASHED_LEN..=900,
    ) {
        let full = enc(&a);
        let got = make(&a).encoded(max_len);
        prop_assert!(got.len() <= max_len, "{} > {}", got.len(), max_len);
        if full.len() <= max_len {
            prop_assert_eq!(got, full);
        } else {
            prop_assert!(got.starts_with("h:"), "{}", got);
            prop_assert_eq!(got.len(), HASHED_LEN);
            prop_assert!(got[2..].bytes().all(|b| b.is_ascii_hexdigit()));
            // Stable: the same pair hashes the same whatever the limit.
            prop_assert_eq!(&got, &make(&a).encoded(full.len() - 1));
            let stored = make(&a).storage_key("lock:", max_len + 5);
            prop_assert_eq!(stored, format!("lock:{got}"));
        }
    }

    #[test]
    fn hashed_encodings_stay_injective(
        a in long_pair(),
        b in long_pair(),
        max_len in HASHED_LEN..=200,
    ) {
        let (ea, eb) = (make(&a).encoded(max_len), make(&b).encoded(max_len));
        prop_assert_eq!(ea == eb, a == b, "{:?} vs {:?}", a, b);
    }
}

#[test]
fn namespaces_differ_for_equal_text() {
    let cases: [Pair; 6] = [
        (None, "a:b".into()),
        (Some("a".into()), "b".into()),
        (Some(String::new()), "a:b".into()),
        (Some("a:".into()), "b".into()),
        (Some("a".into()), ":b".into()),
        (None, "r1:a:b".into()),
    ];
    for (i, a) in cases.iter().enumerate() {
        for b in &cases[i + 1..] {
            assert_ne!(enc(a), enc(b), "{a:?} vs {b:?}");
        }
    }
}

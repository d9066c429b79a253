//! The suite: every behaviour written once (`middleware`, `semantics`) as an
//! `async fn(Harness)`, instantiated per backend by [`for_each_backend!`].

mod harness;
mod keys;
mod lifecycle;
mod middleware;
mod semantics;
mod support;

/// Every backend-generic test, by name.
mod tests {
    pub use super::lifecycle::*;
    pub use super::middleware::*;
    pub use super::semantics::*;
}

/// ```text
/// for_each_backend! {
///     backends { NAME => HARNESS, VIRTUAL_HARNESS, (VIRTUAL_TEST_ARGS), .. }
///     tests { real_time: [..], virtual_time: [..], multi_thread: [..] }
/// }
/// ```
/// makes, per backend, `mod NAME` with one `#[tokio::test]` per test calling
/// `tests::TEST(harness).await`:
/// - `real_time`: current-thread runtime, `HARNESS`;
/// - `virtual_time` (tests that let TTLs run out): `VIRTUAL_HARNESS` on
///   `#[tokio::test(VIRTUAL_TEST_ARGS)]`, i.e. a paused clock for memory; a
///   real server keeps its real clock and short TTLs;
/// - `multi_thread`: 4 worker threads, `HARNESS`.
macro_rules! for_each_backend {
    (
        backends {
            $( $(#[$meta:meta])* $name:ident => $make:expr, $vmake:expr, $vargs:tt ),* $(,)?
        }
        tests $tests:tt
    ) => {
        $(
            $(#[$meta])*
            mod $name {
                for_each_backend!(@tests ($make) ($vmake) $vargs $tests);
            }
        )*
    };
    (
        @tests ($make:expr) ($vmake:expr) $vargs:tt {
            real_time: [ $($rt:ident),* $(,)? ],
            virtual_time: [ $($vt:ident),* $(,)? ],
            multi_thread: [ $($mt:ident),* $(,)? ] $(,)?
        }
    ) => {
        $(
            #[tokio::test]
            async fn $rt() {
                crate::suite::tests::$rt($make.await).await
            }
        )*
        $(
            #[tokio::test $vargs]
            async fn $vt() {
                crate::suite::tests::$vt($vmake.await).await
            }
        )*
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $mt() {
                crate::suite::tests::$mt($make.await).await
            }
        )*
    };
}

for_each_backend! {
    backends {
        memory =>
            crate::suite::harness::memory_backend(),
            crate::suite::harness::memory_backend_paused(),
            (start_paused = true),
        #[cfg(feature = "redis")]
        redis =>
            crate::suite::harness::redis_backend(),
            crate::suite::harness::redis_backend(),
            (),
        #[cfg(feature = "postgres")]
        postgres =>
            crate::suite::harness::postgres_backend(),
            crate::suite::harness::postgres_backend(),
            (),
    }
    tests {
        real_time: [
            // Through axum / tower.
            pass_through_without_spec,
            busy_lock_is_429_with_retry_after_and_json,
            lock_held_while_body_streams,
            ready_body_is_released_before_the_response_is_returned,
            release_on_dropped_response_future,
            release_on_tcp_client_disconnect,
            dropped_waiter_does_not_keep_the_lock,
            release_completes_when_client_leaves_mid_release,
            release_completes_when_body_dropped_mid_release,
            release_on_panic_with_catch_panic,
            release_on_panic_unwinding,
            release_on_inner_service_error,
            cancel_auto_release_hands_lock_to_job,
            dropping_owned_lock_releases,
            sequential_requests_never_429,
            sequential_requests_over_keep_alive_never_429,
            route_scope_isolates_routes,
            global_scope_is_shared_across_routes,
            invalid_key_or_ttl_is_400,
            locks_release_twice_is_already_released,
            backend_failure_is_503,
            multiple_specs_all_held_and_released,
            opposite_lock_orders_do_not_deadlock,
            dropped_acquisition_releases_every_lock,
            failed_acquisition_dropped_mid_cleanup_still_releases,
            release_calls_dropped_mid_flight_still_release,
            acquisition_with_lost_reply_is_released,
            extractor_lock_released_with_response,
            works_via_route_layer,
            works_inside_service_builder,
            // Backend contract.
            release_checks_owner,
            one_owner_token_never_makes_two_holders,
            // Lifecycle beyond one request.
            lost_signal_fires_when_force_released_under_a_handler,
            token_hand_off_across_handles,
            keep_after_response_then_release_through_admin,
            admin_force_release_and_bad_keys,
        ],
        virtual_time: [
            max_wait_succeeds_when_holder_releases,
            timeout_after_max_wait,
            ttl_expiry_frees_without_cleanup,
            extend_replaces_ttl,
            extend_never_revives_and_checks_owner,
            fencing_tokens_strictly_increase,
            watchdog_keeps_a_short_ttl_lock_through_a_long_handler,
            lost_signal_fires_at_ttl_without_watchdog,
            lost_signal_follows_extensions,
            watchdog_renews_many_locks_in_one_call_per_tick,
            stale_tokens_are_refused,
        ],
        multi_thread: [
            concurrent_requests_are_mutually_exclusive,
        ],
    }
}

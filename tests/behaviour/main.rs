//! Behavioural test suite of tower-lock.
//!
//! Every behaviour is written once, generic over the backend, as an
//! `async fn(Harness)` in one of the files beside this one (`middleware`,
//! `queue`, `semantics`, `lifecycle`), and instantiated per backend by
//! `for_each_backend!` below: `memory::*` runs against [`MemoryBackend`]
//! (virtual time where TTLs matter), `redis::*` against a private Redis
//! server, `redis_cluster::*` against a private Redis Cluster shared by the
//! binary (each test under a key prefix of its own), `postgres::*` against
//! a private PostgreSQL server, `etcd::*` against a private 3-member etcd
//! cluster shared by the binary (each test under a key prefix of its own).
//!
//! [`MemoryBackend`]: tower_lock::MemoryBackend

// Shared test support; `common::redis_server::RedisServer` and
// `common::pg_server::PgServer` start the private servers of
// `harness::{redis_backend, postgres_backend}`.
#[path = "../common/mod.rs"]
mod common;

#[cfg(feature = "apalis")]
mod apalis;
mod flight;
mod flight_http;
mod harness;
mod identity;
mod input;
mod keys;
mod kinds;
mod lifecycle;
mod middleware;
mod queue;
mod seeds;
mod semantics;
mod support;

/// Every backend-generic test, by name.
mod tests {
    #[cfg(feature = "apalis")]
    pub use super::apalis::*;
    pub use super::flight::*;
    pub use super::flight_http::*;
    pub use super::identity::*;
    pub use super::input::*;
    pub use super::kinds::*;
    pub use super::lifecycle::*;
    pub use super::middleware::*;
    pub use super::queue::*;
    pub use super::seeds::*;
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
            real_time: [ $( $(#[$rtm:meta])* $rt:ident ),* $(,)? ],
            virtual_time: [ $($vt:ident),* $(,)? ],
            multi_thread: [ $($mt:ident),* $(,)? ] $(,)?
        }
    ) => {
        $(
            $(#[$rtm])*
            #[tokio::test]
            async fn $rt() {
                crate::tests::$rt($make.await).await
            }
        )*
        $(
            #[tokio::test $vargs]
            async fn $vt() {
                crate::tests::$vt($vmake.await).await
            }
        )*
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $mt() {
                crate::tests::$mt($make.await).await
            }
        )*
    };
}

for_each_backend! {
    backends {
        memory =>
            crate::harness::memory_backend(),
            crate::harness::memory_backend_paused(),
            (start_paused = true),
        #[cfg(feature = "redis")]
        redis =>
            crate::harness::redis_backend(),
            crate::harness::redis_backend(),
            (),
        #[cfg(feature = "redis-cluster")]
        redis_cluster =>
            crate::harness::redis_cluster_backend(),
            crate::harness::redis_cluster_backend(),
            (),
        #[cfg(feature = "postgres")]
        postgres =>
            crate::harness::postgres_backend(),
            crate::harness::postgres_backend(),
            (),
        #[cfg(feature = "etcd")]
        etcd =>
            crate::harness::etcd_backend(),
            crate::harness::etcd_backend(),
            (),
    }
    tests {
        real_time: [
            // Through axum / tower.
            pass_through_without_spec,
            busy_lock_is_429_with_retry_after_and_json,
            lock_held_while_body_streams,
            a_chunked_body_keeps_its_lock_past_a_declared_length,
            a_body_of_known_size_is_released_at_that_size,
            a_lock_kept_once_the_handler_answered_is_refused,
            a_response_without_a_body_is_released_before_it_is_returned,
            ready_body_is_released_before_the_response_is_returned,
            release_on_dropped_response_future,
            release_on_tcp_client_disconnect,
            release_on_dropped_body_while_locks_live_on,
            dropped_waiter_does_not_keep_the_lock,
            release_completes_when_client_leaves_mid_release,
            release_completes_when_body_dropped_mid_release,
            release_on_panic_with_catch_panic,
            a_kept_lock_whose_handler_never_answered_is_released,
            a_kept_lock_whose_response_never_left_is_released,
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
            one_key_in_both_scopes_is_refused,
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
            a_dropped_call_never_gives_back_the_hold_its_retry_took,
            a_waiting_retry_answers_with_its_twins_grant,
            // The waiting queue.
            release_hands_the_lock_to_the_oldest_waiter_at_once,
            waiters_are_served_in_the_order_they_came,
            a_cancelled_waiter_does_not_hold_the_queue_up,
            a_release_after_the_queue_changed_reaches_the_live_waiter,
            a_release_after_a_force_release_is_refused,
            // Lifecycle beyond one request.
            lost_signal_fires_when_force_released_under_a_handler,
            token_hand_off_across_handles,
            keep_after_response_then_release_through_admin,
            admin_force_release_and_bad_keys,
            calls_after_the_response_say_already_released,
            a_late_extension_never_lands_on_a_newer_acquisition,
            an_extension_beyond_a_year_is_refused_whatever_the_backend,
            // Single-flight.
            a_burst_computes_once,
            a_burst_across_two_handles_computes_once,
            a_large_result_is_shared,
            a_zero_result_ttl_answers_only_the_waiting,
            a_failed_leader_hands_over_to_exactly_one_waiter,
            a_flight_begin_dropped_after_taking_the_lock_gives_it_back,
            a_flight_begin_whose_reply_was_lost_gives_the_lock_back,
            a_waiter_dropped_while_it_reads_the_result_gives_the_lock_back,
            an_oversized_result_is_not_shared,
            a_flight_and_a_lock_of_one_name_never_meet,
            the_layer_shares_one_response,
            the_layer_never_shares_private_or_failed_responses,
            the_layer_never_shares_an_oversized_body,
            the_layer_works_with_a_lock_layer_and_the_extractor,
            waiters_are_woken_by_the_result_not_by_the_lock,
            durations_without_end_saturate,
            a_result_nobody_waits_for_is_not_kept,
            // Single-flight over HTTP: every client gets what it asked for.
            conditional_and_range_requests_stay_out_of_flights,
            a_varied_response_reaches_only_the_requests_it_fits,
            a_response_reaches_only_the_clients_with_its_credentials,
            a_response_crosses_credentials_only_while_fresh,
            canonically_equivalent_keys_are_separate_flights,
            a_request_for_a_fresh_answer_never_gets_a_stored_one,
            a_burst_refusing_the_stored_answer_runs_the_handler_once,
            head_and_get_are_separate_flights,
            a_streamed_body_flows_to_its_client_and_is_shared_when_it_ends,
            a_stream_past_the_cap_releases_every_follower_at_once,
            an_event_stream_is_never_shared,
            copies_carry_no_lock_or_hop_by_hop_headers,
            // The seeds' APIs (issue 14).
            metadata_round_trips_through_every_lookup,
            bad_metadata_is_refused_before_anything_is_locked,
            with_lock_releases_on_ok_err_and_panic,
            release_all_frees_every_lock_of_a_request_and_a_job,
            lookups_by_owner_are_checked_against_the_locks,
            a_lookup_while_the_owner_waits_keeps_the_lock_findable,
            lookup_errors_never_name_the_owner,
            lookups_jobs_and_client_locks_never_log_keys_or_owners,
            job_layer_releases_when_the_job_is_processed_fails_or_panics,
            client_directed_locks_follow_the_headers_within_limits,
            // apalis workers (feature `apalis`).
            #[cfg(feature = "apalis")]
            apalis_tasks_release_their_lock_when_done_failed_or_panicked,
            #[cfg(feature = "apalis")]
            an_apalis_task_whose_lock_backend_is_down_may_be_retried,
            // An acquisition is named by its fence (round 3).
            a_token_restores_once,
            a_repeated_claim_answers_the_same,
            the_admin_release_honours_a_fence,
            // Input normalised or refused before it is used (issue 21).
            client_key_rules_see_the_key_that_is_locked,
            a_requests_locks_are_found_by_any_spelling_of_their_key,
            metadata_deeper_than_the_limit_or_with_nul_is_refused,
            metadata_reads_back_as_it_was_stored,
            // Kinds: held, or refused cleanly where the backend has none.
            a_kind_the_backend_does_not_hold_is_refused_and_takes_nothing,
        ],
        virtual_time: [
            max_wait_succeeds_when_holder_releases,
            timeout_after_max_wait,
            ttl_expiry_frees_without_cleanup,
            extend_replaces_ttl,
            two_extends_at_once_still_end_at_a_ttl,
            extend_never_revives_and_checks_owner,
            fencing_tokens_strictly_increase,
            watchdog_keeps_a_short_ttl_lock_through_a_long_handler,
            lost_signal_fires_at_ttl_without_watchdog,
            a_renewal_that_finds_the_lock_gone_signals_the_loss,
            lost_signal_follows_extensions,
            watchdog_renews_many_locks_in_one_call_per_tick,
            stale_tokens_are_refused,
            a_token_restores_only_its_own_acquisition,
            a_renewal_and_an_extend_never_disagree_with_the_backend,
            a_restore_dropped_after_its_claim_gives_the_lock_back,
            a_renewal_in_flight_never_outlives_a_release_within_the_min_hold,
            a_renewal_in_flight_never_outlives_a_dropped_handle_within_the_min_hold,
            a_restore_dropped_within_the_min_hold_keeps_the_hold,
            a_tokens_hold_never_outlasts_its_lock,
            an_expired_lock_goes_to_the_queue_not_to_a_newcomer,
            a_lock_never_runs_out_while_the_request_waits_for_another,
            a_lock_that_ran_out_before_the_handler_is_refused,
            several_locks_wait_at_most_the_longest_max_wait,
            a_waiter_gets_the_lock_when_the_holders_ttl_ends,
            a_lock_handed_to_its_holders_owner_still_ends_at_its_ttl,
            the_result_ttl_is_honoured,
            a_dead_leader_is_replaced_when_its_lock_runs_out,
            waiting_past_the_max_wait_times_out,
            the_layer_answers_429_after_the_max_wait,
            a_result_nobody_waits_for_lives_for_its_ttl_alone,
            a_later_flight_never_gets_an_earlier_result,
            a_result_kept_for_waiters_is_forgotten_when_no_longer_kept,
            metadata_belongs_to_its_acquisition,
            min_hold_keeps_an_early_release_until_it_ends,
            job_layer_watchdog_keeps_a_long_job_locked,
            lookups_never_list_an_expired_lock,
            a_stale_acquisition_of_a_reused_owner_touches_nothing,
            a_stale_release_of_a_reused_owner_keeps_the_lock_findable,
            a_stale_watchdog_never_renews_a_later_acquisition,
            a_finished_job_never_restores_within_its_minimum_hold,
        ],
        multi_thread: [
            concurrent_requests_are_mutually_exclusive,
        ],
    }
}

/// Shared holds and permits (`LockKind`), on the backends that hold them.
mod kinds_suite {
    for_each_backend! {
        backends {
            memory =>
                crate::harness::memory_backend(),
                crate::harness::memory_backend_paused(),
                (start_paused = true),
            #[cfg(feature = "redis")]
            redis =>
                crate::harness::redis_backend(),
                crate::harness::redis_backend(),
                (),
            #[cfg(feature = "redis-cluster")]
            redis_cluster =>
                crate::harness::redis_cluster_backend(),
                crate::harness::redis_cluster_backend(),
                (),
            #[cfg(feature = "postgres")]
            postgres =>
                crate::harness::postgres_backend(),
                crate::harness::postgres_backend(),
                (),
            #[cfg(feature = "etcd")]
            etcd =>
                crate::harness::etcd_backend(),
                crate::harness::etcd_backend(),
                (),
        }
        tests {
            real_time: [
                shared_holds_run_together_and_keep_a_writer_out,
                a_queued_writer_blocks_later_readers,
                consecutive_queued_readers_are_granted_together,
                permits_admit_n_and_serve_the_rest_in_order,
                permits_released_into_a_queue_each_give_back_their_own,
                each_hold_is_released_and_extended_on_its_own,
                a_clone_of_another_kind_is_not_a_retry_of_the_hold,
                kinds_that_cannot_meet_are_refused_and_never_queue,
                the_layer_takes_shared_holds_and_permits,
                shared_holds_and_permits_travel_by_token,
                a_force_release_frees_every_hold_and_hands_off,
            ],
            virtual_time: [
                an_expired_permit_goes_to_the_queue_not_to_a_newcomer,
                a_crashed_holder_frees_only_its_own_permit_at_its_ttl,
                each_hold_keeps_its_own_expiry_through_extend_and_claim,
                a_retried_hold_is_the_same_hold_with_its_ttl_refreshed,
            ],
            multi_thread: [
                racing_acquirers_never_take_more_than_n_permits,
            ],
        }
    }
}

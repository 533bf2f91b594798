//! The adapter conformance suite (feature `conformance`): async checks every adapter
//! runs unchanged against a real database, so the backends cannot drift apart.
//!
//! # Running the suite from an adapter
//!
//! Implement [`Backend`] (a factory for fresh, migrated, empty databases) and invoke
//! [`conformance_tests!`](crate::conformance_tests) in an integration test file. The
//! macro expands to one `#[tokio::test]` per check (multi-threaded runtime), named
//! after the check, so a failure names exactly what broke:
//!
//! ```text
//! // crates/adapters-foo/tests/conformance.rs
//! struct Foo;
//! #[async_trait::async_trait]
//! impl holdfast_ports::conformance::Backend for Foo {
//!     async fn fresh(&self) -> Result<Box<dyn holdfast_ports::conformance::TestDatabase>, holdfast_ports::conformance::BackendError> {
//!         /* create an empty database, migrate it, open one instance */
//!     }
//! }
//! holdfast_ports::conformance_tests!(Foo);
//! ```
//!
//! The adapter's dev-dependencies need `tokio` with the `macros` and
//! `rt-multi-thread` features (the generated tests use `#[tokio::test]`).
//!
//! Checks panic with a message naming what they expected and what they saw; they
//! never sleep and assert no timings.

pub mod change;
pub mod confirm;
pub mod locks;
pub mod queues;
pub mod read_and_claim;
pub mod security;
pub mod settlement;
pub mod statuses;
pub mod support;
pub mod tokens;
pub mod wake;

use async_trait::async_trait;

use crate::Stores;

/// Why a [`Backend`] could not provide a database (the suite then fails the check
/// with this error's message).
pub type BackendError = Box<dyn std::error::Error + Send + Sync>;

/// A factory of fresh databases for the suite. Each check calls [`Backend::fresh`]
/// once, so checks never see each other's data and may run in parallel.
#[async_trait]
pub trait Backend: Send + Sync {
    /// A new, empty, fully migrated database with one adapter instance open on it.
    async fn fresh(&self) -> Result<Box<dyn TestDatabase>, BackendError>;

    /// Why this backend cannot run here (for example: no database server was
    /// provided to the test run). `Some` makes each generated test print a loud
    /// `SKIPPED` line and return without running its check; a backend must return
    /// `Some` only when its test command decided that skipping is acceptable.
    /// The default never skips.
    fn skip_reason(&self) -> Option<String> {
        None
    }
}

/// One fresh database of a check, and the instances open on it.
#[async_trait]
pub trait TestDatabase: Send + Sync {
    /// The ports of the first adapter instance (the same instance on every call).
    fn stores(&self) -> Stores;

    /// Opens another, independent adapter instance on the same database, as a
    /// second replica of the app would: its own connections (pool) and its own
    /// round-trip counter. The suite uses replicas for its concurrency checks.
    async fn replica(&self) -> Result<Stores, BackendError>;
}

/// Calls [`Backend::fresh`], failing the check with the backend's error.
pub async fn fresh<B: Backend + ?Sized>(backend: &B) -> Box<dyn TestDatabase> {
    match backend.fresh().await {
        Ok(db) => db,
        Err(e) => panic!("conformance: the backend could not provide a fresh database: {e}"),
    }
}

/// The names of every check, as `module::check`, in the order the macro emits them.
pub const CHECK_NAMES: &[&str] = crate::conformance_tests!(@list names ());

/// Expands to one `#[tokio::test]` per conformance check, each calling the check with
/// a fresh database from the [`Backend`] expression given (evaluated once per test).
///
/// ```text
/// holdfast_ports::conformance_tests!(my_adapter_tests::SqliteFactory::default());
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($backend:expr) => {
        $crate::conformance_tests!(@list tests ($backend));
    };
    (@list $mode:ident $extra:tt) => {
        $crate::conformance_tests! {@$mode $extra
            tokens::add_tokens_is_idempotent,
            tokens::add_tokens_conflict_writes_nothing,
            tokens::set_spendable_reports_missing_and_spent,
            tokens::candidates_ascending_excluding_locked_spent_unspendable,
            tokens::candidates_equal_amounts_compare_exactly,
            tokens::candidates_keyset_paging_is_exact,
            tokens::candidate_bands_split_at_the_threshold,
            tokens::amounts_beyond_u64_round_trip_and_order,
            tokens::a_balance_cannot_overflow_across_adds,
            tokens::a_batch_cannot_overflow_a_balance,
            tokens::concurrent_adds_cannot_overflow_a_balance,
            tokens::balance_ignores_locks_excludes_spent_and_unspendable,
            tokens::list_tokens_filters_orders_and_limits,
            locks::claim_verdicts_stale_vs_contended,
            locks::sixteen_claimers_one_winner,
            locks::overlapping_windows_one_winner_per_token,
            locks::window_verdicts_in_order,
            locks::small_windows_verdicts,
            locks::window_larger_than_max_is_rejected,
            locks::window_claim_is_one_round_trip,
            locks::release_consumer_frees_exactly_its_locks,
            locks::release_tokens_frees_only_named_tokens_of_consumer,
            locks::spend_consumer_marks_spent_and_releases,
            locks::sweep_removes_expired_and_dead_consumers_only,
            locks::list_locks_oldest_first_with_status,
            read_and_claim::read_and_claim_wins_what_the_chooser_names,
            read_and_claim::read_and_claim_refuses_a_window_too_large,
            read_and_claim::read_and_claim_callers_never_lose_a_race,
            settlement::confirmed_spends_what_was_selected_even_after_the_sweep,
            settlement::a_second_confirmed_spender_is_a_double_spend_that_changes_nothing,
            settlement::renew_restamps_held_locks_and_reports_lost_ones,
            settlement::release_tokens_forgets_the_selection,
            settlement::a_consumer_cannot_win_its_own_swept_token_twice,
            settlement::a_selection_that_never_settles_is_forgotten_after_the_retention,
            confirm::confirm_spends_the_inputs_and_adds_the_outputs_at_once,
            confirm::a_retried_confirm_is_a_no_op_and_other_outputs_are_refused,
            confirm::outputs_that_do_not_conserve_the_inputs_change_nothing,
            confirm::a_confirm_of_a_token_spent_by_another_adds_nothing,
            confirm::outputs_that_would_overflow_a_wallet_change_nothing,
            confirm::concurrent_confirms_of_one_transaction_apply_it_once,
            change::the_change_of_each_type_goes_back_in_type_order,
            change::a_payment_in_full_has_no_change,
            change::outputs_confirm_would_refuse_are_refused_with_their_change,
            change::a_double_spend_wins_over_the_change,
            change::a_change_beyond_the_limit_is_refused,
            statuses::status_round_trips_and_replaces,
            queues::create_request_dedups_and_numbers,
            queues::create_request_concurrent_dedups,
            queues::queue_cas_rejects_stale_version,
            queues::request_cas_rejects_stale_version,
            queues::queue_cas_never_loses_a_concurrent_write,
            queues::request_cas_never_loses_a_concurrent_write,
            queues::owner_set_round_trips_exactly,
            queues::slot_builds_round_trip_and_end_with_the_slot,
            queues::list_requests_in_sequence_order,
            queues::list_queues_in_name_order,
            queues::prune_requests_keeps_head_green_owners_and_live,
            queues::one_reconcile_leader_per_tick,
            security::hostile_strings_are_stored_literally,
            wake::writes_that_free_tokens_signal_their_key,
            wake::a_queue_write_signals_its_queue,
            wake::a_release_wakes_a_waiter_of_another_instance,
        }
    };
    (@tests ($backend:expr) $($module:ident :: $name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let backend = $backend;
                if let Some(reason) = $crate::conformance::Backend::skip_reason(&backend) {
                    eprintln!("SKIPPED: conformance {}: {reason}", stringify!($name));
                    return;
                }
                let db = $crate::conformance::fresh(&backend).await;
                $crate::conformance::$module::$name(&*db).await;
            }
        )*
    };
    (@names () $($module:ident :: $name:ident),* $(,)?) => {
        &[$(concat!(stringify!($module), "::", stringify!($name))),*]
    };
}

#[cfg(test)]
mod tests {
    use super::CHECK_NAMES;

    #[test]
    fn check_names_are_unique() {
        let mut names: Vec<&str> = CHECK_NAMES
            .iter()
            .map(|n| n.split("::").nth(1).unwrap_or(n))
            .collect();
        let total = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), total, "two checks share a test name");
        assert!(total >= 29);
    }
}

//! The payment replay on real SQLite files: a small handmade history whose every
//! payment's inputs and change are known for `smallest_first`, and value
//! conservation for every policy.

use holdfast::Config;
use holdfast::backend::Backend;
use holdfast_domain::{TokenType, WalletId};
use holdfast_simulator::replay::{
    self, Payment, ReplayOptions, ReplayPolicy, TOKEN_TYPE, WALLET, median_payment, parse_payments,
};

/// Deposits of 10, 20 and 5 sat; a payment of 12; a deposit of 30; payments of
/// 30, 500 (more than the wallet holds) and 3; a deposit of 7, a payment of 27
/// and a deposit of 4. Deposits 76, payments made 72.
pub const HISTORY: &str = "\
0.00000010,0.00001000
0.00000020,0.00001000
0.00000005,0.00001000
-0.00000012,0.00001000
0.00000030,0.00001000
-0.00000030,0.00001000
-0.00000500,0.00001000
-0.00000003,0.00001000
0.00000007,0.00001000
-0.00000027,0.00001000
0.00000004,0.00001000
";

fn options(payments: Vec<Payment>, dir: &tempfile::TempDir) -> ReplayOptions {
    ReplayOptions {
        payments,
        source: "handmade".to_owned(),
        db: Some(dir.path().join("replay.db").display().to_string()),
        seed: 7,
        policies: ReplayPolicy::ALL.to_vec(),
        config: Config::default(),
        progress: false,
    }
}

/// Replays `HISTORY` with `policy` on a fresh SQLite file; returns the figures
/// and the wallet's unspent token amounts, ascending.
async fn run(policy: ReplayPolicy) -> (replay::PolicyFigures, Vec<u128>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let payments = parse_payments(HISTORY, None).expect("history parses");
    let median = median_payment(&payments);
    let options = options(payments, &dir);
    let url = dir.path().join("one.db").display().to_string();
    let backend = Backend::open(&url, &options.config.backend_options())
        .await
        .expect("open");
    let figures = replay::replay_policy_on(policy, &options, backend.stores(), median)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", policy.name()));
    let wallet = WalletId::new(WALLET).expect("wallet");
    let left = backend
        .stores()
        .tokens
        .list_tokens(
            &wallet,
            Some(TokenType::new(TOKEN_TYPE).expect("type")),
            1000,
        )
        .await
        .expect("list");
    backend.close().await;
    let mut values: Vec<u128> = left
        .iter()
        .filter(|t| t.spent_by.is_none())
        .map(|t| t.quantity.value())
        .collect();
    values.sort_unstable();
    (figures, values)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smallest_first_spends_the_smallest_tokens_and_mints_the_exact_change() {
    let (figures, left) = run(ReplayPolicy::SmallestFirst).await;
    // 12 from {5, 10, 20}: 5 + 10, change 3. 30 from {3, 20, 30}: all three,
    // change 23. 500: skipped. 3 from {23}: change 20. 27 from {7, 20}: both,
    // exactly (no change). Then the deposit of 4 is all that is left.
    assert_eq!(
        (figures.payments, figures.insufficient, figures.refused),
        (4, 1, 0)
    );
    assert_eq!((figures.inputs.mean, figures.inputs.max), (2.0, 3));
    assert_eq!(figures.changeless_share, 0.25);
    assert_eq!((figures.final_pool, figures.unspent_sats), (1, 4));
    assert_eq!(left, vec![4]);
    // Pool after each of the 11 lines: 1 2 3 2 3 1 1 1 2 0 1.
    assert_eq!(figures.mean_pool, 1.545);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_policy_conserves_value_and_counts_what_it_skipped() {
    for policy in ReplayPolicy::ALL {
        let (figures, left) = run(policy).await;
        let name = policy.name();
        assert_eq!(figures.unspent_sats, 76 - 72, "{name}");
        assert_eq!(left.iter().sum::<u128>(), 4, "{name}: {left:?}");
        assert_eq!(figures.final_pool, 1, "{name}: {left:?}");
        assert_eq!(
            (figures.payments, figures.insufficient, figures.refused),
            (4, 1, 0),
            "{name}"
        );
        assert!(
            figures.inputs.max >= 1 && figures.inputs.mean >= 1.0,
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_replay_reports_every_policy_on_fresh_databases() {
    let dir = tempfile::tempdir().expect("temp dir");
    let payments = parse_payments(HISTORY, None).expect("history parses");
    let report = replay::replay(options(payments, &dir))
        .await
        .expect("replay runs");
    assert_eq!(report.backend, "sqlite");
    assert_eq!(
        (report.lines, report.deposits, report.withdrawals),
        (11, 6, 5)
    );
    assert_eq!(report.median_payment_sats, 27);
    let names: Vec<&str> = report.policies.iter().map(|p| p.policy.as_str()).collect();
    assert_eq!(
        names,
        [
            "cover_first",
            "cover_first-untidy",
            "smallest_first",
            "cover_first+dust4",
            "random_draw",
            "random_improve"
        ]
    );
    assert!(report.policies.iter().all(|p| p.unspent_sats == 4));
    let text = report.text();
    assert!(
        text.contains("random_improve") && text.contains("final pool"),
        "{text}"
    );
}

//! The fuzz targets under proptest, for machines without cargo-fuzz (and for CI).
//!
//! Each target runs `HOLDFAST_FUZZ_CASES` cases (default 256) of raw bytes and of
//! inputs shaped like its grammar; with `HOLDFAST_FUZZ_SECONDS=N` it keeps running
//! fresh batches for about N seconds. A failure prints the shrunk input, which
//! replays under `cargo fuzz run <target> <file>` as well (the functions are the same).

use std::time::{Duration, Instant};

use holdfast::config::KEYS;
use holdfast_domain::Precision;
use holdfast_fuzz::{config, quantity, request_id, selection};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn env_number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(
        text.parse()
            .unwrap_or_else(|_| panic!("{name}={text:?}; expected a number")),
    )
}

/// Runs `check` over `strategy` for the configured budget; panics with the shrunk
/// failing input.
fn drive<S: Strategy>(target: &str, strategy: S, check: impl Fn(S::Value))
where
    S::Value: std::fmt::Debug,
{
    let cases = u32::try_from(env_number("HOLDFAST_FUZZ_CASES").unwrap_or(256)).unwrap_or(256);
    let deadline =
        env_number("HOLDFAST_FUZZ_SECONDS").map(|s| Instant::now() + Duration::from_secs(s));
    let mut batches = 0u64;
    loop {
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        if let Err(e) = runner.run(&strategy, |value| {
            check(value);
            Ok(())
        }) {
            panic!("fuzz target {target}: {e}");
        }
        batches += 1;
        if deadline.is_none_or(|d| Instant::now() >= d) {
            break;
        }
    }
    eprintln!(
        "fuzz target {target}: {} cases passed",
        batches * u64::from(cases)
    );
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..600)
}

#[test]
fn fuzz_quantity() {
    let shaped = (
        1u8..=128,
        "(0[xX])?[0-9a-fA-F+ \\-x_.e]{0,42}|[0-9]{30,45}|0x[0-9a-f]{25,40}",
    );
    drive("quantity", (bytes(), shaped), |(raw, (bits, text))| {
        quantity::run(&raw);
        quantity::check(&text, Precision::new(bits).unwrap_or(Precision::MAX));
    });
}

#[test]
fn fuzz_request_id() {
    let shaped = "(request/)?[a-z/ 0-9\\x00\\x7f\u{e9}]{0,12}(/[0-9]{0,22})?";
    drive("request_id", (bytes(), shaped), |(raw, text)| {
        request_id::run(&raw);
        request_id::check(&text);
    });
}

/// TOML documents built from the real keys (and a few unknown ones) with
/// values of every kind, in and out of range.
fn toml_documents() -> impl Strategy<Value = String> {
    let mut keys: Vec<String> = KEYS.iter().map(|k| k.key.to_owned()).collect();
    keys.extend(
        [
            "bogus",
            "selection.bogus",
            "admission.queues.main.max_concurrent",
            "admission.queues.\"\".gate_wait_delay_ms",
            "admission.queues.main.bogus",
        ]
        .map(str::to_owned),
    );
    let value = prop_oneof![
        Just("0".to_owned()),
        Just("1".to_owned()),
        Just("-1".to_owned()),
        Just("1.5".to_owned()),
        Just("true".to_owned()),
        Just("\"on_conflict\"".to_owned()),
        Just("\"sqlite::memory:\"".to_owned()),
        Just("\"\"".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("[1, 2]".to_owned()),
        (0u64..5_000_000).prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        "\"[a-z_:/ ]{0,12}\"",
    ];
    prop::collection::vec((prop::sample::select(keys), value), 0..8).prop_map(|pairs| {
        pairs
            .into_iter()
            .map(|(k, v)| format!("{k} = {v}\n"))
            .collect::<String>()
    })
}

#[test]
fn fuzz_config() {
    drive("config", (bytes(), toml_documents()), |(raw, text)| {
        config::run(&raw);
        config::check(&text);
    });
}

#[test]
fn fuzz_selection() {
    drive("selection", bytes(), |raw| selection::run(&raw));
}

//! The ledger check: the replicas' histories (what each was answered) against
//! the final tables (what the database holds), as findings.
//!
//! A finding is [`Severity::Broken`] when the database contradicts itself or
//! holds what no history explains (money made or lost, an output without its
//! confirmed status, a token spent by a transaction that never selected it):
//! never acceptable. It is [`Severity::Lost`] when something a replica was
//! answered for is missing (a confirmed payment, a deletion, the selection a
//! confirm needed): what a failover to an asynchronous standby loses, and never
//! acceptable otherwise.

use std::collections::{BTreeMap, BTreeSet};

use sqlx::{Connection, PgConnection};

use super::replicas::Replica;
use super::{FUNDING, PAYEE, WALLET};

/// The funding of a run: `count` tokens `tx:0..count` of `amount` in [`WALLET`].
#[derive(Debug, Clone, Copy)]
pub struct Funding {
    pub tx: &'static str,
    pub count: u32,
    pub amount: u128,
}

impl Funding {
    /// Everything funded.
    pub fn total(&self) -> u128 {
        self.amount * u128::from(self.count)
    }
}

/// What the replicas' histories say (tokens as `tx:index`).
#[derive(Debug, Default)]
pub struct Histories {
    /// Each selected transaction: its amount and inputs.
    pub selected: BTreeMap<String, (u128, Vec<String>)>,
    pub confirmed: BTreeSet<String>,
    pub deleted: BTreeSet<String>,
    pub double_spends: BTreeSet<String>,
    /// Confirms whose outputs the store refused (`refused TX REASON`).
    pub refused: BTreeMap<String, String>,
    /// Failed selects by reason (`failed TX REASON`).
    pub failed: BTreeMap<String, u64>,
}

pub fn read_histories(replicas: &[Replica]) -> Histories {
    let mut h = Histories::default();
    for r in replicas {
        let text = std::fs::read_to_string(&r.history).unwrap_or_default();
        // A killed process may leave its last line incomplete: only whole lines count.
        let whole = text.rfind('\n').map_or("", |end| &text[..=end]);
        for line in whole.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let tx = || words.get(1).expect("a tx").to_string();
            match words.first().copied().unwrap_or_default() {
                "selected" => {
                    let amount = words[2].parse().expect("amount");
                    let inputs = words[3..].iter().map(|t| t.to_string()).collect();
                    h.selected.insert(tx(), (amount, inputs));
                }
                "settled" if line.ends_with(" confirmed") => {
                    h.confirmed.insert(tx());
                }
                "settled" => {
                    h.deleted.insert(tx());
                }
                "double-spend" => {
                    h.double_spends.insert(tx());
                }
                "refused" => {
                    let reason = words.get(2).copied().unwrap_or_default();
                    h.refused.insert(tx(), reason.to_owned());
                }
                "failed" => {
                    let reason = words.get(2).copied().unwrap_or_default();
                    *h.failed.entry(reason.to_owned()).or_default() += 1;
                }
                "settling" => {}
                other => panic!("unknown history line {other:?}: {line}"),
            }
        }
    }
    h
}

/// A row of `tokens`.
#[derive(Debug)]
pub struct TokenRow {
    pub wallet: String,
    pub amount: u128,
    pub spent_by: Option<String>,
}

/// The final `tokens` (by `tx:index`) and `tx_statuses`.
#[derive(Debug)]
pub struct Tables {
    pub tokens: BTreeMap<String, TokenRow>,
    pub statuses: BTreeMap<String, String>,
}

/// Both tables are read in one snapshot: a commit that lands between the two reads
/// (a killed replica's last one, still on its way) cannot make a confirmed status
/// appear without its outputs.
pub async fn read_tables(url: &str) -> Tables {
    let mut conn = PgConnection::connect(url)
        .await
        .expect("connect for the ledger");
    sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut conn)
        .await
        .expect("begin the ledger snapshot");
    /// tx, index, wallet, amount, spender.
    type Row = (String, i64, String, String, Option<String>);
    let rows: Vec<Row> =
        sqlx::query_as("SELECT tx_id, idx, wallet, amount::text, spent_by FROM tokens")
            .fetch_all(&mut conn)
            .await
            .expect("read tokens");
    let tokens = rows
        .into_iter()
        .map(|(tx, idx, wallet, amount, spent_by)| {
            let row = TokenRow {
                wallet,
                amount: amount.parse().expect("amount"),
                spent_by,
            };
            (format!("{tx}:{idx}"), row)
        })
        .collect();
    let statuses = sqlx::query_as::<_, (String, String)>("SELECT tx_id, status FROM tx_statuses")
        .fetch_all(&mut conn)
        .await
        .expect("read statuses")
        .into_iter()
        .collect();
    sqlx::raw_sql("COMMIT")
        .execute(&mut conn)
        .await
        .expect("end the ledger snapshot");
    let _ = conn.close().await;
    Tables { tokens, statuses }
}

/// How bad a finding is (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Broken,
    Lost,
}

/// What was lost, by kind: the groups of a failover's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// The database contradicts itself or its histories.
    Broken,
    /// A payment a replica was answered confirmed is not confirmed (nor are its
    /// outputs there).
    ConfirmedPaymentLost,
    /// A deletion a replica was answered for is not recorded.
    DeletionLost,
    /// A token two payments were answered confirmed with.
    SpentTwice,
    /// A confirm the store refused: the selection it held was not the one
    /// answered (a claim's commit lost).
    ConfirmRefused,
    /// A confirmed transaction spent other tokens than its select answered (a
    /// claim or a give-back lost: the store held another selection of the same
    /// value, which the confirm then spent).
    SpendMismatch,
}

impl Kind {
    pub fn severity(self) -> Severity {
        match self {
            Kind::Broken => Severity::Broken,
            _ => Severity::Lost,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Kind::Broken => "the database contradicts itself or its histories",
            Kind::ConfirmedPaymentLost => {
                "confirmed payments acknowledged to a replica, missing on the database (status and outputs)"
            }
            Kind::DeletionLost => "deletions acknowledged to a replica, missing on the database",
            Kind::SpentTwice => "tokens acknowledged spent by two confirmed payments",
            Kind::ConfirmRefused => {
                "confirms refused because the selection the replica was answered was gone"
            }
            Kind::SpendMismatch => {
                "confirms that spent other tokens than their select answered (a claim or give-back lost)"
            }
        }
    }
}

/// One thing the check found.
#[derive(Debug, Clone)]
pub struct Finding {
    pub kind: Kind,
    pub what: String,
}

/// What the ledger check counted.
#[derive(Debug)]
pub struct Ledger {
    pub selected: usize,
    /// Transactions the database records confirmed.
    pub confirmed: usize,
    pub deleted: usize,
    pub double_spends: usize,
    /// Transactions no history selected, deleted by a restarted replica's orphan
    /// recovery (its predecessor was killed between claiming and writing
    /// `selected`).
    pub orphans: usize,
    pub failed_selects: BTreeMap<String, u64>,
    /// What the confirmed transactions paid to [`PAYEE`].
    pub paid: u128,
    /// What is left unspent in [`WALLET`].
    pub left: u128,
    /// Everything found, in the order of the checks.
    pub findings: Vec<Finding>,
}

impl Ledger {
    /// The findings of `severity`.
    pub fn of(&self, severity: Severity) -> Vec<&Finding> {
        self.findings
            .iter()
            .filter(|f| f.kind.severity() == severity)
            .collect()
    }

    /// Findings by kind: how many, and the first few.
    pub fn by_kind(&self) -> BTreeMap<Kind, Vec<&str>> {
        let mut kinds: BTreeMap<Kind, Vec<&str>> = BTreeMap::new();
        for f in &self.findings {
            kinds.entry(f.kind).or_default().push(&f.what);
        }
        kinds
    }
}

/// Checks the histories against the final tables (`soak --pay-to PAYEE`: a
/// confirmed transaction's outputs are `TX:0`, its amount to [`PAYEE`], and
/// `TX:1`, the change back to [`WALLET`], committed with its spend). Broken:
///
/// - the funding is not intact, or a token is not an output of a transaction
///   the database records confirmed; a confirmed transaction lacks its payment,
///   or its change when its inputs held more than its amount;
/// - a status belongs to a transaction no history selected and is not Deleted
///   (an orphan a restarted replica deleted: its predecessor died between
///   claiming and writing `selected`; such a transaction spends nothing and has
///   no outputs, as the checks below say);
/// - a spent token is spent by a transaction that is not confirmed; one that is
///   not confirmed spent some; a double spend is confirmed;
/// - value is not conserved: the unspent tokens of every wallet add up to other
///   than the funding, those of [`WALLET`] and [`PAYEE`] too, or [`PAYEE`] holds
///   other than the confirmed amounts.
///
/// Lost: a `settled X confirmed` that is not confirmed, a `settled X deleted`
/// that is not deleted, a token in the inputs of two `settled ... confirmed`,
/// a `refused` confirm; a confirmed transaction that spent other tokens than
/// its select answered (a token spent by one that did not select it, an input
/// not spent by its confirmed transaction, a token two confirmed transactions
/// selected).
pub fn check_ledger(funding: Funding, h: &Histories, t: &Tables) -> Ledger {
    let mut findings = Vec::new();
    let mut found = |kind: Kind, what: String| findings.push(Finding { kind, what });
    let broken = Kind::Broken;
    let confirmed = |tx: &str| t.statuses.get(tx).map(String::as_str) == Some("confirmed");
    for i in 0..funding.count {
        let id = format!("{}:{i}", funding.tx);
        match t.tokens.get(&id) {
            None => found(broken, format!("funding token {id} is gone")),
            Some(row) if (row.wallet.as_str(), row.amount) != (WALLET, funding.amount) => {
                found(broken, format!("{id} changed: {row:?}"));
            }
            Some(_) => {}
        }
    }
    let mut outputs = 0;
    for id in t.tokens.keys() {
        if id.starts_with(&format!("{}:", funding.tx)) {
            continue;
        }
        let (tx, index) = id.rsplit_once(':').expect("tx:index");
        if index != "0" && index != "1" {
            found(broken, format!("{id} is neither funding nor an output"));
        }
        if !h.selected.contains_key(tx) {
            found(
                broken,
                format!("{id} is an output of {tx}, which no history selected"),
            );
        }
        if !confirmed(tx) {
            found(
                broken,
                format!("{id} is an output of {tx}, which is not confirmed"),
            );
        }
        outputs += 1;
    }
    let mut orphans = 0;
    for (tx, status) in &t.statuses {
        if !h.selected.contains_key(tx) {
            if status != "deleted" {
                found(
                    broken,
                    format!("the database has {status} for {tx}, which no history selected"),
                );
            }
            orphans += 1;
        }
    }
    for (id, row) in &t.tokens {
        if let Some(by) = &row.spent_by {
            if !confirmed(by) {
                found(
                    broken,
                    format!("{id} is spent by {by}, which is not confirmed"),
                );
            }
            if !h
                .selected
                .get(by)
                .is_some_and(|(_, inputs)| inputs.contains(id))
            {
                found(
                    Kind::SpendMismatch,
                    format!("{id} is spent by {by}, which never selected it"),
                );
            }
        }
    }
    // Acknowledged, then lost.
    let mut acknowledged_spender: BTreeMap<&str, &str> = BTreeMap::new();
    for tx in &h.confirmed {
        if !confirmed(tx) {
            found(
                Kind::ConfirmedPaymentLost,
                format!("{tx} settled confirmed but the database does not have it"),
            );
        }
        for id in h.selected.get(tx).map_or(&[][..], |(_, inputs)| inputs) {
            if let Some(first) = acknowledged_spender.insert(id, tx) {
                found(
                    Kind::SpentTwice,
                    format!("{id} was acknowledged spent by {first} and by {tx}"),
                );
            }
        }
    }
    for tx in &h.deleted {
        if t.statuses.get(tx).map(String::as_str) != Some("deleted") {
            found(
                Kind::DeletionLost,
                format!("{tx} settled deleted but the database does not say so"),
            );
        }
    }
    for (tx, reason) in &h.refused {
        found(
            Kind::ConfirmRefused,
            format!("the confirm of {tx} was refused ({reason})"),
        );
    }
    let mut spender: BTreeMap<&str, &str> = BTreeMap::new();
    let (mut confirmed_count, mut expected_outputs, mut paid) = (0, 0, 0u128);
    for (tx, (amount, inputs)) in &h.selected {
        let spent_by_tx =
            |id: &String| t.tokens.get(id).and_then(|r| r.spent_by.as_deref()) == Some(tx);
        if h.double_spends.contains(tx) && confirmed(tx) {
            found(
                broken,
                format!("{tx} was refused as a double spend but is confirmed"),
            );
        }
        if !confirmed(tx) {
            if inputs.iter().any(spent_by_tx) {
                found(broken, format!("{tx} is not confirmed but spent"));
            }
            continue;
        }
        confirmed_count += 1;
        for id in inputs {
            if !spent_by_tx(id) {
                found(
                    Kind::SpendMismatch,
                    format!("{tx} is confirmed but its input {id} is not spent by it"),
                );
            }
            if let Some(first) = spender.insert(id, tx) {
                found(
                    Kind::SpendMismatch,
                    format!("{id} was selected by both confirmed {first} and {tx}"),
                );
            }
        }
        match t.tokens.get(&format!("{tx}:0")) {
            None => found(broken, format!("{tx} is confirmed without its payment")),
            Some(p) if (p.wallet.as_str(), p.amount) != (PAYEE, *amount) => {
                found(broken, format!("{tx}: the payment is {p:?}"));
            }
            Some(_) => {}
        }
        paid += amount;
        expected_outputs += 1;
        let held: Option<u128> = inputs
            .iter()
            .map(|id| t.tokens.get(id).map(|r| r.amount))
            .sum();
        let Some(change) = held.and_then(|held| held.checked_sub(*amount)) else {
            found(
                broken,
                format!("{tx}: its inputs are not all in the table, or hold less than {amount}"),
            );
            continue;
        };
        match t.tokens.get(&format!("{tx}:1")) {
            Some(row) => {
                if (row.wallet.as_str(), row.amount) != (WALLET, change) {
                    found(
                        broken,
                        format!("{tx}: change {row:?}, expected {change} back to {WALLET}"),
                    );
                }
                expected_outputs += 1;
            }
            None if change != 0 => found(broken, format!("{tx} is confirmed without its change")),
            None => {}
        }
    }
    if outputs != expected_outputs {
        found(
            broken,
            format!(
                "{outputs} outputs, but the confirmed transactions' payments and changes are {expected_outputs}"
            ),
        );
    }
    let unspent = |wallet: &str| -> u128 {
        t.tokens
            .values()
            .filter(|r| r.wallet == wallet && r.spent_by.is_none())
            .map(|r| r.amount)
            .sum()
    };
    let (left, received) = (unspent(WALLET), unspent(PAYEE));
    let funded = funding.total();
    if received != paid {
        found(
            broken,
            format!("{PAYEE} holds {received}, but the confirmed amounts are {paid}"),
        );
    }
    if left + received != funded {
        found(
            broken,
            format!("value not conserved: {left} left + {received} paid, {funded} funded"),
        );
    }
    let everywhere: u128 = t
        .tokens
        .values()
        .filter(|r| r.spent_by.is_none())
        .map(|r| r.amount)
        .sum();
    if everywhere != funded {
        found(
            broken,
            format!("value not conserved: {everywhere} unspent in all wallets, {funded} funded"),
        );
    }
    Ledger {
        selected: h.selected.len(),
        confirmed: confirmed_count,
        deleted: h.deleted.len(),
        double_spends: h.double_spends.len(),
        orphans,
        failed_selects: h.failed.clone(),
        paid,
        left,
        findings,
    }
}

/// Reads the fleet's histories and the tables at `url`, checks the ledger and
/// prints it (with the findings, if any).
pub async fn read_ledger(replicas: &[Replica], url: &str) -> Ledger {
    let histories = read_histories(replicas);
    let tables = read_tables(url).await;
    let ledger = check_ledger(FUNDING, &histories, &tables);
    let l = &ledger;
    println!(
        "ledger: {} selected, {} confirmed, {} deleted, {} double spend(s), {} orphan(s) \
         deleted, failed selects by reason {:?}; {} paid, {} left of {}",
        l.selected,
        l.confirmed,
        l.deleted,
        l.double_spends,
        l.orphans,
        l.failed_selects,
        l.paid,
        l.left,
        FUNDING.total()
    );
    for (kind, found) in l.by_kind() {
        println!("ledger: {} x {}", found.len(), kind.describe());
        for what in found.iter().take(5) {
            println!("    {what}");
        }
    }
    ledger
}

/// [`read_ledger`], asserting nothing was found: no fault a fleet survives may
/// break or lose anything.
pub async fn check_fleet(replicas: &[Replica], url: &str) -> Ledger {
    let ledger = read_ledger(replicas, url).await;
    assert!(
        ledger.findings.is_empty(),
        "the ledger does not hold:\n{}",
        ledger
            .findings
            .iter()
            .map(|f| format!("{:?}: {}", f.kind, f.what))
            .collect::<Vec<_>>()
            .join("\n")
    );
    ledger
}

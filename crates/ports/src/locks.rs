//! The lock store port: claims on tokens, their release, the lease sweep.

use std::collections::BTreeMap;

use async_trait::async_trait;
use holdfast_domain::{
    Candidate, ClaimVerdict, Precision, Quantity, SweepRule, Timestamp, Token, TokenId, TokenType,
    TxId, TxStatus, WalletId,
};

use crate::error::LockStoreError;
use crate::tokens::{BandQuery, CandidateQuery};

/// The most tokens one window claim may name.
pub const MAX_WINDOW: usize = 256;

/// Checks the size of a window before any claim of it is attempted, so every
/// adapter refuses the same windows: more than [`MAX_WINDOW`] tokens is
/// [`LockStoreError::WindowTooLarge`] naming the length and the limit. An empty
/// window is valid (it claims nothing), and a token named twice counts twice.
pub fn check_window(tokens: &[TokenId]) -> Result<(), LockStoreError> {
    if tokens.len() > MAX_WINDOW {
        return Err(LockStoreError::WindowTooLarge {
            len: tokens.len(),
            max: MAX_WINDOW,
        });
    }
    Ok(())
}

/// The most outputs one confirmed transaction may add.
pub const MAX_OUTPUTS: usize = 1024;

/// A token a confirmed transaction creates: its `index`-th output gets the id
/// `(transaction, index)`, spendable at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// The wallet it pays to (a recipient, or the payer's own for change).
    pub wallet: WalletId,
    /// Its type: each type's outputs must add up to that type's inputs.
    pub token_type: TokenType,
    /// Its amount, more than zero.
    pub quantity: Quantity,
}

/// The change of a transaction that selected `inputs` and pays `outputs`: per
/// token type, what the inputs hold beyond the outputs, to `wallet` (none for a
/// type paid in full; in type order). What [`LockStore::confirm_with_change`]
/// adds to the outputs.
pub fn change_outputs(inputs: &[Token], outputs: &[Output], wallet: &WalletId) -> Vec<Output> {
    let mut rest: BTreeMap<&TokenType, (u128, u128)> = BTreeMap::new();
    for t in inputs {
        let entry = rest.entry(&t.token_type).or_default();
        entry.0 = entry.0.saturating_add(t.quantity.value());
    }
    for o in outputs {
        let entry = rest.entry(&o.token_type).or_default();
        entry.1 = entry.1.saturating_add(o.quantity.value());
    }
    rest.into_iter()
        .filter(|(_, (ins, outs))| ins > outs)
        .filter_map(|(token_type, (ins, outs))| {
            Some(Output {
                wallet: wallet.clone(),
                token_type: token_type.clone(),
                quantity: Quantity::new(ins - outs, Precision::MAX).ok()?,
            })
        })
        .collect()
}

/// What [`LockStore::confirm`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Confirmation {
    /// The inputs spent now, in key order (empty when `replayed`).
    pub spent: Vec<TokenId>,
    /// The ids of the outputs, `(transaction, index)` in order.
    pub outputs: Vec<TokenId>,
    /// The transaction was already confirmed with exactly these outputs: nothing
    /// changed.
    pub replayed: bool,
}

/// Checks the outputs of a confirm before any I/O, so every adapter refuses the
/// same ones: more than [`MAX_OUTPUTS`], or an output of zero, is
/// [`LockStoreError::BadOutputs`].
pub fn check_outputs(outputs: &[Output]) -> Result<(), LockStoreError> {
    if outputs.len() > MAX_OUTPUTS {
        return Err(LockStoreError::BadOutputs {
            detail: format!("{} outputs; expected at most {MAX_OUTPUTS}", outputs.len()),
        });
    }
    if let Some(i) = outputs.iter().position(|o| o.quantity.is_zero()) {
        return Err(LockStoreError::BadOutputs {
            detail: format!("output {i} is 0; expected an amount of at least 1"),
        });
    }
    Ok(())
}

/// A lock as listed for diagnostics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    /// The locked token.
    pub token: TokenId,
    /// The transaction holding it.
    pub consumer: TxId,
    /// When it was claimed.
    pub created_at: Timestamp,
    /// The consumer's recorded status, if any.
    pub consumer_status: Option<TxStatus>,
    /// The owner id of the backend instance that claimed it (`""` for locks of
    /// versions before owners were recorded).
    pub owner: String,
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SweepReport {
    /// Whether this caller held sweep leadership for the tick (only the leader deletes).
    pub leader: bool,
    /// Locks deleted because they were older than the lease.
    pub expired: u64,
    /// Locks deleted because their consumer is Deleted or Orphan.
    pub released_by_status: u64,
    /// Selections forgotten: their lock gone and made before
    /// [`SweepRule::forget_before`].
    pub forgotten: u64,
}

/// Which candidates a [`LockStore::read_and_claim`] reads: a `cover_first` band
/// read or a candidate page, as [`crate::TokenStore`] answers them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CandidateRead {
    /// [`crate::TokenStore::candidate_bands`].
    Bands(BandQuery),
    /// [`crate::TokenStore::candidates`].
    Page(CandidateQuery),
}

/// Names, from a page of candidates just read, the tokens to claim (in claim
/// order; at most [`MAX_WINDOW`]); empty to claim nothing.
pub type Chooser = Box<dyn FnOnce(&[Candidate]) -> Vec<TokenId> + Send>;

/// When a selector reads and claims in one call ([`LockStore::read_and_claim`]),
/// as the store says it should ([`LockStore::read_with_claim`]); the domain's
/// [`holdfast_domain::read_plan()`] decides each read from it.
pub use holdfast_domain::ReadWithClaim;

/// What a [`LockStore::read_and_claim`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadAndClaim {
    /// The candidates read.
    pub page: Vec<Candidate>,
    /// A verdict per token the chooser named, in its order (empty if it named
    /// none).
    pub verdicts: Vec<(TokenId, ClaimVerdict)>,
}

/// Token locks: one row per locked token (the primary key is the mutual exclusion),
/// with the consumer transaction and the claim time; and, apart from the locks, the
/// *selections*: which tokens each consumer won, kept until it settles whatever the
/// lease sweep does, so a confirmed spend is never lost.
#[mockall::automock]
#[async_trait]
pub trait LockStore: Send + Sync {
    /// Claims one token for `consumer` at `at`: won, stale (not spendable, spent or
    /// missing) or contended (locked by anyone, including `consumer` itself, or
    /// already selected by `consumer` in an earlier select whose lock was swept). A
    /// won token is recorded as selected by `consumer` in the same transaction.
    async fn claim(
        &self,
        consumer: &TxId,
        token: &TokenId,
        at: Timestamp,
    ) -> Result<ClaimVerdict, LockStoreError>;

    /// Claims up to [`MAX_WINDOW`] tokens in one round trip, atomically, with a
    /// verdict per token in the order given (a longer window is refused as
    /// [`check_window`] says, before anything is claimed). Won tokens are recorded
    /// as selected, as [`LockStore::claim`] does. On error, nothing of the call is
    /// claimed unless the error is an ambiguous commit (the caller should treat the
    /// window as possibly held and release it by consumer and tokens).
    async fn claim_window(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
        at: Timestamp,
    ) -> Result<Vec<(TokenId, ClaimVerdict)>, LockStoreError>;

    /// Reads candidates as `read` says and claims for `consumer` at `at` what
    /// `choose` names from that page, in one transaction that no other
    /// read-and-claim of the same wallet and type can enter between the read and
    /// the claim (SQLite: under the database's write lock, which no other claim
    /// enters either; PostgreSQL: under an advisory lock of the wallet and type),
    /// so the claim loses no race to such a caller: one call. Won tokens are recorded
    /// as selected, as [`LockStore::claim_window`] does, and the same errors
    /// apply; on an error nothing is claimed unless it is an ambiguous commit, in
    /// which case tokens of the page may be held until the lease sweep (the
    /// caller never learnt which). `None` when this store cannot (the caller then
    /// reads and claims in two calls); that is the default.
    async fn read_and_claim(
        &self,
        consumer: &TxId,
        read: &CandidateRead,
        at: Timestamp,
        choose: Chooser,
    ) -> Result<Option<ReadAndClaim>, LockStoreError> {
        let _ = (consumer, read, at, choose);
        Ok(None)
    }

    /// When a selector should read and claim in one call
    /// ([`LockStore::read_and_claim`]) rather than in two; the default, for a
    /// store that cannot, is [`ReadWithClaim::Never`].
    fn read_with_claim(&self) -> ReadWithClaim {
        ReadWithClaim::Never
    }

    /// Re-stamps the locks `consumer` still holds among `tokens` with `at` (their
    /// lease starts again) and returns those tokens; a token missing from the answer
    /// is no longer held by `consumer` (the lease sweep took it). Read-only for
    /// tokens held by others.
    async fn renew(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
        at: Timestamp,
    ) -> Result<Vec<TokenId>, LockStoreError>;

    /// Settles `consumer` as deleted in one transaction: records its status
    /// [`TxStatus::Deleted`] at `at` (when `record_status`), releases every lock it
    /// holds and forgets its selections. Returns how many locks were released.
    /// Idempotent.
    async fn release_consumer(
        &self,
        consumer: &TxId,
        at: Timestamp,
        record_status: bool,
    ) -> Result<u64, LockStoreError>;

    /// Releases the given tokens' locks if `consumer` holds them (others' are
    /// untouched) and forgets them as selected by `consumer` (a failed or cancelled
    /// select gives them back); returns how many locks were released. Idempotent.
    async fn release_tokens(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
    ) -> Result<u64, LockStoreError>;

    /// Settles `consumer` as confirmed in one transaction: records its status
    /// [`TxStatus::Confirmed`] at `at` (when `record_status`), marks every token it
    /// selected spent by it at `at` (also those whose lock the lease sweep removed
    /// meanwhile, whoever locks them now), releases its locks and forgets its
    /// selections. Returns the tokens spent now, in key order. Idempotent: a second
    /// call spends nothing.
    ///
    /// If a selected token is already spent by another transaction, this is
    /// [`LockStoreError::DoubleSpend`] naming the token and its spender, and nothing
    /// changes (not even the status).
    async fn spend_consumer(
        &self,
        consumer: &TxId,
        at: Timestamp,
        record_status: bool,
    ) -> Result<Vec<TokenId>, LockStoreError>;

    /// Confirms `consumer` with its `outputs`, in one transaction (one round trip
    /// on PostgreSQL): records [`TxStatus::Confirmed`] at `at`, spends every token
    /// it selected (as [`LockStore::spend_consumer`] does), releases its locks,
    /// forgets its selections and adds the outputs as new spendable tokens with
    /// ids `(consumer, 0..)`. Signals the outputs' and the released tokens' keys.
    ///
    /// The outputs must conserve the inputs: per token type, the outputs add up to
    /// exactly what the selected tokens of that type hold, else
    /// [`LockStoreError::NotConserved`] and nothing changes. Retried with the same
    /// outputs after it committed, it changes nothing and answers `replayed`;
    /// with other outputs (or once confirmed without outputs) it is
    /// [`LockStoreError::OutputsDiffer`], nothing changed. A selected token
    /// another transaction spent is [`LockStoreError::DoubleSpend`], nothing
    /// changed. Outputs are checked by [`check_outputs`] first.
    async fn confirm(
        &self,
        consumer: &TxId,
        outputs: &[Output],
        at: Timestamp,
    ) -> Result<Confirmation, LockStoreError>;

    /// [`LockStore::confirm`] of `outputs` followed by their change to
    /// `change_to` ([`change_outputs`] of the tokens `consumer` selected):
    /// answers the confirmation and every output, the given ones first. By
    /// default it reads [`LockStore::selected`] and then confirms, two
    /// transactions; PostgreSQL works the change out inside the confirm's
    /// transaction from exactly the inputs it spends (one round trip). Once
    /// `consumer` is confirmed, a call answers as `confirm` of `outputs` alone
    /// would: `replayed` if it was confirmed without change, else
    /// [`LockStoreError::OutputsDiffer`] (the caller reads the stored outputs).
    /// A change beyond 2^128 - 1 (inputs of several wallets) is refused: by
    /// default as not conserved (the change is capped there), on PostgreSQL as
    /// bad outputs overflowing the change wallet; nothing is written.
    async fn confirm_with_change(
        &self,
        consumer: &TxId,
        outputs: &[Output],
        change_to: &WalletId,
        at: Timestamp,
    ) -> Result<(Confirmation, Vec<Output>), LockStoreError> {
        let inputs = self.selected(consumer).await?;
        let mut all = outputs.to_vec();
        all.extend(change_outputs(&inputs, outputs, change_to));
        let done = self.confirm(consumer, &all, at).await?;
        Ok((done, all))
    }

    /// The unspent tokens `consumer` has selected (also those whose lock the lease
    /// sweep took), in key order: what a confirm of it spends, for working out
    /// its change.
    async fn selected(&self, consumer: &TxId) -> Result<Vec<Token>, LockStoreError>;

    /// [`LockStore::unsettled`] of this instance's owner only: the transactions
    /// whose selections it (or an earlier process with the same owner id) made.
    /// What a restarted instance recovers; other owners' work is not listed.
    async fn unsettled_owned(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError>;

    /// The consumers that have selected tokens and not settled yet, each with its
    /// recorded status, in id order: what the start-up recovery pass looks at.
    async fn unsettled(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError>;

    /// If this caller wins sweep leadership for the tick, deletes the locks `rule`
    /// sweeps (created before its cut-off, or of a Deleted or Orphan consumer), and
    /// forgets the selections whose lock is gone that were made before
    /// [`SweepRule::forget_before`]; other selections stay. A lock both expired
    /// and of a dead consumer counts as expired in the report.
    async fn sweep(&self, rule: SweepRule) -> Result<SweepReport, LockStoreError>;

    /// Every lock with its consumer's recorded status, oldest first.
    async fn list_locks(&self) -> Result<Vec<LockInfo>, LockStoreError>;

    /// Database round trips made so far by this adapter instance, across all its ports.
    fn round_trips(&self) -> u64;
}

#[cfg(test)]
mod tests {
    use holdfast_domain::{TokenId, TxId};

    use super::{LockStoreError, MAX_WINDOW, check_window};

    fn window(len: usize) -> Vec<TokenId> {
        let tx = TxId::new("t").expect("tx id");
        (0..len)
            .map(|i| TokenId::new(tx.clone(), u32::try_from(i).expect("small index")))
            .collect()
    }

    #[test]
    fn windows_up_to_the_limit_pass_and_longer_ones_name_length_and_limit() {
        assert_eq!(check_window(&[]), Ok(()));
        assert_eq!(check_window(&window(MAX_WINDOW)), Ok(()));
        assert_eq!(
            check_window(&window(MAX_WINDOW + 1)),
            Err(LockStoreError::WindowTooLarge {
                len: MAX_WINDOW + 1,
                max: MAX_WINDOW,
            })
        );
    }
}

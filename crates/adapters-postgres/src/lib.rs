//! holdfast over PostgreSQL: the backend for fleets of replicas sharing one database.
//!
//! [`PgBackend::connect`] opens a pool, applies the embedded migrations (serialized
//! across replicas by PostgreSQL's migration advisory lock) and returns a backend
//! whose [`PgBackend::stores`] are holdfast's four ports.
//!
//! ```no_run
//! # async fn example() -> Result<(), holdfast_adapters_postgres::ConnectError> {
//! use holdfast_adapters_postgres::{LockStrategy, PgBackend, PgOptions};
//!
//! let backend = PgBackend::connect(
//!     "postgres://holdfast@db.internal/holdfast",
//!     PgOptions { strategy: LockStrategy::SkipLocked, ..PgOptions::default() },
//! )
//! .await?;
//! let stores = backend.stores();
//! # let _ = stores; Ok(()) }
//! ```
//!
//! - Amounts are `NUMERIC(39,0)`: exact, numerically ordered, every `u128` fits.
//! - Candidates are read through the partial index `tokens_candidates` on
//!   `(wallet, token_type, amount, tx_id, idx)` of spendable, unspent tokens: an
//!   ascending index scan, no sort, keyset pages.
//! - Claims follow the configured [`LockStrategy`]; a window claim of up to 256
//!   tokens is one statement reporting won / stale / contended per token.
//! - A read-and-claim (where the selector expects races) reads and claims in one
//!   transaction under the advisory lock `(`[`CLAIM_LINE_SPACE`]`, hash of wallet
//!   and type)`: four statements (`BEGIN` with the lock, read, claim, `COMMIT`),
//!   and no race lost to another read-and-claim of the same wallet and type.
//! - Adding tokens (`add_tokens`, a confirm's outputs) takes the balance locks
//!   `(`[`BALANCE_SPACE`]`, hash of wallet and type)`: shared when every amount
//!   and every unspent token of the pair is below 2^63 (no total can overflow),
//!   exclusive with a check of the totals otherwise.
//! - The lease sweep takes `pg_try_advisory_xact_lock(`[`SWEEP_LOCK_KEY`]`)`; only
//!   the replica that gets it deletes.
//! - Every operation holds at most one pooled connection, never two.
//! - A URL may name several hosts of one cluster and the kind of session wanted
//!   (libpq's syntax: `postgres://app@h1:5432,h2:5433/db?target_session_attrs=read-write`);
//!   new connections go to the first host that gives one and follow the primary
//!   after a failover (`docs/postgres-failover.md`). [`PgBackend::durability`]
//!   says whether the server's settings let an acknowledged commit be lost.
//! - [`PgBackend::round_trips`] counts statements; [`PgBackend::server_errors`]
//!   counts statements the server failed.
//! - Wake-ups cross instances by `NOTIFY` on [`CHANNEL`], sent only for keys
//!   another instance announced a wait on (every key for [`OPEN`] after a
//!   listener asks what the others wait for); [`PgBackend::wakes_sent`] and
//!   [`PgBackend::wakes_withheld`] count the freed keys sent and held back.

mod backend;
mod codec;
mod durability;
mod error;
mod hosts;
mod interest;
mod locks;
mod options;
mod queues;
mod route;
mod schema;
mod session;
mod statuses;
mod tokens;
mod url;
mod wake;

pub use backend::PgBackend;
pub use durability::{CommitRisk, DURABILITY_TARGET, Durability};
pub use error::ConnectError;
pub use hosts::{HostsError, TargetSessionAttrs};
pub use interest::{CATCH_UP, OPEN};
pub use locks::{
    CLAIM_LINE_SPACE, RELEASE_CONSUMER, SPEND, SWEEP_LOCK_KEY, WINDOW, WINDOW_SKIP_LOCKED,
    claim_line_key,
};
pub use options::{LockStrategy, MAX_SERVER_TIMEOUT, OptionsError, PgOptions, UnknownStrategy};
pub use route::{HOST_TIMEOUT, HostOutcome, HostTried, ROLE, ServerRole};
pub use schema::{MIGRATIONS, migrator_up_to};
pub use session::{KEEPALIVE_COUNT, KEEPALIVE_INTERVAL, PING_IDLE_AFTER, session_settings};
pub use tokens::BALANCE_SPACE;
pub use url::{redact_url, scrub_password, with_database};
pub use wake::{CHANNEL, COALESCE};

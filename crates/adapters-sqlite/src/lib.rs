//! holdfast over SQLite: the embedded default backend for tokens, locks,
//! transaction statuses and queues.
//!
//! ```no_run
//! use std::time::Duration;
//! use holdfast_adapters_sqlite::{SqliteBackend, SqliteOptions};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let options = SqliteOptions { busy_timeout: Duration::from_secs(5), readers: 4 };
//! let backend = SqliteBackend::open("sqlite://holdfast.db", options).await?;
//! let stores = backend.stores(); // holdfast_ports::Stores: tokens, locks, statuses, queues
//! # let _ = stores;
//! # Ok(()) }
//! ```
//!
//! # How it uses SQLite
//! - Bundled SQLite (rusqlite), WAL journal, `synchronous = FULL` (a committed claim
//!   survives a power cut), a busy timeout (default 5 s) after which a call fails
//!   with [`StoreFault::Busy`](holdfast_ports::StoreFault::Busy) instead of panicking.
//! - **One busy timeout per stretch of busy, not per call.** A write that waited
//!   out the whole busy timeout for another connection's write lock is
//!   remembered: until a write gets the lock (or for one busy timeout after the
//!   last such failure), writes try for it for a short probe only (a tenth of
//!   the busy timeout, at most 50 ms) and then fail busy. A select that cannot
//!   get the lock fails after about one busy timeout (5.3 s at the default,
//!   measured; 30 s before, six store calls of 5 s). A lock held for less than
//!   the busy timeout is waited for as before. Reads need no write lock in WAL
//!   mode and keep their own busy timeout. [`SqliteBackend::busy_waits`] counts
//!   the waits.
//! - **The file stays the file.** The device and inode of the database file and
//!   of its `-wal` are recorded on open and compared with what the paths name in
//!   every write transaction (before it writes and after its commit) and before
//!   every read. A file deleted or replaced under the process would otherwise
//!   take every later write, a confirmed spend too, into a file nobody opens
//!   again; instead every call answers
//!   [`StoreFault::Unavailable`](holdfast_ports::StoreFault::Unavailable) naming
//!   the path, and nothing more is written. Not for in-memory databases.
//! - One writer connection and [`SqliteOptions::readers`] reader connections per
//!   instance; every call runs on tokio's blocking threads, never on the executor.
//!   Every transaction that may write is `BEGIN IMMEDIATE`. Writes that queue for
//!   the writer while it is busy are committed together (group commit): each in
//!   its own savepoint, one commit and one fsync for the batch, every write
//!   answered only after that commit.
//! - Several instances (replicas, processes) may open one file; SQLite's file lock
//!   serializes their writers and the lock table's primary key gives exactly one
//!   winner per token.
//! - Versioned migrations ([`MIGRATIONS`]) are applied on open and recorded in
//!   `holdfast_schema`; a newer schema than this code knows is
//!   [`OpenError::SchemaTooNew`].
//! - Amounts are stored as [`Quantity::to_storage`](holdfast_domain::Quantity::to_storage)
//!   text (32 hex digits), read through the partial index `tokens_candidates`;
//!   timestamps as RFC 3339 UTC text with milliseconds (see [`timetext`]).
//! - [`LockStore::round_trips`](holdfast_ports::LockStore::round_trips) counts one per
//!   transaction sent (a window claim of up to 256 tokens is one).
//! - The lease sweep needs no leadership election here: SQLite's single writer
//!   serializes sweepers, so every caller is the leader of its own turn.
#![warn(missing_docs)]

mod backend;
mod codec;
mod dbfile;
mod error;
mod lockout;
mod locks;
mod options;
mod pool;
mod queues;
mod schema;
mod statuses;
pub mod timetext;
mod tokens;
mod wake;

pub use backend::SqliteBackend;
pub use error::OpenError;
pub use lockout::BusyWaits;
pub use options::{Location, MAX_BUSY_TIMEOUT, MAX_READERS, SqliteOptions};
pub use pool::begin_immediate;
pub use schema::{MIGRATIONS, Migration, SCHEMA_VERSION};
pub use wake::POLL_INTERVAL;

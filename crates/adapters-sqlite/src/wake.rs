//! Wake-ups over SQLite (`docs/wakeups.md`): the in-process [`Registry`] for the
//! waiters of this instance, and, for a file, a poller that notices commits of
//! other connections (other processes or instances on the same file).
//!
//! - Every write that may free tokens or a slot collects its keys inside its
//!   transaction (only when this instance has waiters: keys cost a read) and
//!   signals them after the commit.
//! - While anyone waits, the poller reads `PRAGMA data_version` on the writer
//!   connection every [`POLL_INTERVAL`]. That number changes only when another
//!   connection committed (this instance writes through the writer itself), and
//!   then every waiter is woken: the file does not say which keys changed. With
//!   no waiter, no polling. A writer busy at a tick skips that tick.

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use holdfast_domain::{TokenId, TxId};
use holdfast_ports::{Registry, StoreFault, Subscription, WakeKey, WakeUps};
use rusqlite::{OptionalExtension, Transaction, params};

use crate::SqliteBackend;
use crate::pool::{Db, Pool};

/// How often a waiting instance reads `PRAGMA data_version`.
pub const POLL_INTERVAL: Duration = Duration::from_millis(2);

/// The wake-ups of one instance: its registry, and the poller of a file.
#[derive(Debug)]
pub(crate) struct Wake {
    pub(crate) registry: Registry,
    poller: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Wake {
    fn drop(&mut self) {
        if let Some(poller) = self.poller.take() {
            poller.abort();
        }
    }
}

impl Wake {
    /// Wake-ups of an in-memory database: nobody else can write it.
    pub(crate) fn in_process() -> Wake {
        Wake {
            registry: Registry::new(),
            poller: None,
        }
    }

    /// Wake-ups of a file: the registry and its poller (spawned on the current
    /// runtime; it stops when this is dropped or the pool is gone).
    pub(crate) fn polling(pool: &Arc<Pool>) -> Wake {
        let registry = Registry::new();
        // The version at open: a commit of another connection before the first
        // wait is then noticed by that wait's first poll.
        let seen = pool.try_data_version();
        let poller = tokio::spawn(poll(registry.clone(), Arc::downgrade(pool), seen));
        Wake {
            registry,
            poller: Some(poller),
        }
    }

    /// Whether a write should collect its keys: only for waiters of this instance
    /// (others learn of the commit from `data_version`).
    pub(crate) fn wanted(&self) -> bool {
        self.registry.has_waiters()
    }
}

async fn poll(registry: Registry, pool: Weak<Pool>, mut seen: Option<i64>) {
    loop {
        registry.until_waiting().await;
        while registry.waiting() > 0 {
            let Some(pool) = pool.upgrade() else { return };
            if let Some(version) = pool.try_data_version() {
                if seen.is_some_and(|seen| seen != version) {
                    let woken = registry.signal_all();
                    tracing::trace!(woken, "another connection committed; waiters woken");
                }
                seen = Some(version);
            }
            drop(pool);
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

impl WakeUps for SqliteBackend {
    fn subscribe(&self, key: WakeKey, origin: Option<TxId>) -> Subscription {
        self.wake.registry.subscribe(key, origin)
    }

    fn signal(&self, keys: &[WakeKey], origin: Option<&TxId>) {
        if !keys.is_empty() {
            self.wake.registry.signal(keys, origin);
        }
    }

    fn connected(&self) -> bool {
        true
    }
}

/// The keys of `tokens` (each token's wallet and type).
pub(crate) fn token_keys<'a>(
    tx: &Transaction<'_>,
    tokens: impl IntoIterator<Item = &'a TokenId>,
) -> Result<Vec<WakeKey>, StoreFault> {
    let mut stmt = tx
        .prepare_cached("SELECT wallet, token_type FROM tokens WHERE tx = ?1 AND output = ?2")
        .db()?;
    let mut keys = BTreeSet::new();
    for token in tokens {
        let found: Option<(String, String)> = stmt
            .query_row(params![token.tx.as_str(), token.index], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
            .db()?;
        keys.extend(
            found.and_then(|(wallet, token_type)| WakeKey::tokens_of(&wallet, &token_type)),
        );
    }
    Ok(keys.into_iter().collect())
}

/// The keys of the tokens `consumer` holds locks on (read before releasing them).
pub(crate) fn consumer_keys(
    tx: &Transaction<'_>,
    consumer: &TxId,
) -> Result<Vec<WakeKey>, StoreFault> {
    let mut stmt = tx
        .prepare_cached(
            "SELECT DISTINCT t.wallet, t.token_type FROM locks AS l
             JOIN tokens AS t ON t.tx = l.tx AND t.output = l.output
             WHERE l.consumer = ?1",
        )
        .db()?;
    let mut rows = stmt.query([consumer.as_str()]).db()?;
    let mut keys = Vec::new();
    while let Some(r) = rows.next().db()? {
        let (wallet, token_type): (String, String) = (r.get(0).db()?, r.get(1).db()?);
        keys.extend(WakeKey::tokens_of(&wallet, &token_type));
    }
    Ok(keys)
}

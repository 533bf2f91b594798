//! Checks of the transaction status store.

use holdfast_domain::TxStatus;

use super::TestDatabase;
use super::support::{at, tx};

/// Every status round-trips; a later record replaces an earlier one, except that
/// nothing replaces Confirmed (it is final); an unknown tx has no status.
pub async fn status_round_trips_and_replaces(db: &dyn TestDatabase) {
    let s = db.stores();
    assert_eq!(s.statuses.status(&tx("nobody")).await, Ok(None));
    let all = [
        TxStatus::Pending,
        TxStatus::Confirmed,
        TxStatus::Deleted,
        TxStatus::Orphan,
        TxStatus::Busy,
        TxStatus::Unknown,
    ];
    for (i, st) in all.into_iter().enumerate() {
        let one = tx(&format!("tx-{i}"));
        s.statuses
            .record_status(&one, st, at(1))
            .await
            .expect("record");
        assert_eq!(s.statuses.status(&one).await, Ok(Some(st)), "{st}");
        let shared = tx("shared");
        s.statuses
            .record_status(&shared, st, at(2))
            .await
            .expect("record");
        // Pending, then Confirmed; everything after Confirmed leaves it.
        let kept = if i >= 1 { TxStatus::Confirmed } else { st };
        assert_eq!(
            s.statuses.status(&shared).await,
            Ok(Some(kept)),
            "after {st}"
        );
    }
}

//! [`forward_lock_store!`](crate::forward_lock_store): a [`LockStore`](crate::LockStore)
//! that wraps another and changes a few of its calls, without writing out the
//! calls it passes on.

/// Implements [`LockStore`](crate::LockStore) for a wrapper: the methods
/// written out in the block, and the methods named after `forward to FIELD:`
/// passed on unchanged to that field (any other method keeps the trait's
/// default). For instruments and test doubles that change one or two calls of a
/// real store.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// use holdfast_domain::{ClaimVerdict, Timestamp, TokenId, TxId};
/// use holdfast_ports::{LockStore, LockStoreError, forward_lock_store};
///
/// /// Counts the single claims it passes on.
/// struct Counting {
///     inner: Arc<dyn LockStore>,
///     claims: AtomicU64,
/// }
///
/// forward_lock_store! {
///     impl LockStore for Counting {
///         async fn claim(
///             &self,
///             consumer: &TxId,
///             token: &TokenId,
///             at: Timestamp,
///         ) -> Result<ClaimVerdict, LockStoreError> {
///             self.claims.fetch_add(1, Ordering::Relaxed);
///             self.inner.claim(consumer, token, at).await
///         }
///     }
///     forward to inner: claim_window, renew, release_consumer, release_tokens,
///         spend_consumer, confirm, selected, unsettled_owned, unsettled, sweep,
///         list_locks, round_trips
/// }
/// ```
#[macro_export]
macro_rules! forward_lock_store {
    (impl LockStore for $ty:ty { $($own:tt)* } forward to $inner:ident: $($method:ident),+ $(,)?) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($own)*]; $($method),+);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; ) => {
        #[$crate::__async_trait]
        impl $crate::LockStore for $ty {
            $($done)*
        }
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; claim $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            async fn claim(
                &self,
                consumer: &$crate::__domain::TxId,
                token: &$crate::__domain::TokenId,
                at: $crate::__domain::Timestamp,
            ) -> ::core::result::Result<$crate::__domain::ClaimVerdict, $crate::LockStoreError> {
                self.$inner.claim(consumer, token, at).await
            }
        ]; $($rest),*);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; claim_window $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            async fn claim_window(
                &self,
                consumer: &$crate::__domain::TxId,
                tokens: &[$crate::__domain::TokenId],
                at: $crate::__domain::Timestamp,
            ) -> ::core::result::Result<::std::vec::Vec<($crate::__domain::TokenId, $crate::__domain::ClaimVerdict)>, $crate::LockStoreError> {
                self.$inner.claim_window(consumer, tokens, at).await
            }
        ]; $($rest),*);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; read_and_claim $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            async fn read_and_claim(
                &self,
                consumer: &$crate::__domain::TxId,
                read: &$crate::CandidateRead,
                at: $crate::__domain::Timestamp,
                choose: $crate::Chooser,
            ) -> ::core::result::Result<::core::option::Option<$crate::ReadAndClaim>, $crate::LockStoreError> {
                self.$inner.read_and_claim(consumer, read, at, choose).await
            }
        ]; $($rest),*);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; read_with_claim $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            fn read_with_claim(
                &self,
            ) -> $crate::ReadWithClaim {
                self.$inner.read_with_claim()
            }
        ]; $($rest),*);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; renew $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            async fn renew(
                &self,
                consumer: &$crate::__domain::TxId,
                tokens: &[$crate::__domain::TokenId],
                at: $crate::__domain::Timestamp,
            ) -> ::core::result::Result<::std::vec::Vec<$crate::__domain::TokenId>, $crate::LockStoreError> {
                self.$inner.renew(consumer, tokens, at).await
            }
        ]; $($rest),*);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; release_consumer $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            async fn release_consumer(
                &self,
                consumer: &$crate::__domain::TxId,
                at: $crate::__domain::Timestamp,
                record_status: bool,
            ) -> ::core::result::Result<u64, $crate::LockStoreError> {
                self.$inner.release_consumer(consumer, at, record_status).await
            }
        ]; $($rest),*);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; release_tokens $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            async fn release_tokens(
                &self,
                consumer: &$crate::__domain::TxId,
                tokens: &[$crate::__domain::TokenId],
            ) -> ::core::result::Result<u64, $crate::LockStoreError> {
                self.$inner.release_tokens(consumer, tokens).await
            }
        ]; $($rest),*);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; spend_consumer $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            async fn spend_consumer(
                &self,
                consumer: &$crate::__domain::TxId,
                at: $crate::__domain::Timestamp,
                record_status: bool,
            ) -> ::core::result::Result<::std::vec::Vec<$crate::__domain::TokenId>, $crate::LockStoreError> {
                self.$inner.spend_consumer(consumer, at, record_status).await
            }
        ]; $($rest),*);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; confirm $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            async fn confirm(
                &self,
                consumer: &$crate::__domain::TxId,
                outputs: &[$crate::Output],
                at: $crate::__domain::Timestamp,
            ) -> ::core::result::Result<$crate::Confirmation, $crate::LockStoreError> {
                self.$inner.confirm(consumer, outputs, at).await
            }
        ]; $($rest),*);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; confirm_with_change $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            async fn confirm_with_change(
                &self,
                consumer: &$crate::__domain::TxId,
                outputs: &[$crate::Output],
                change_to: &$crate::__domain::WalletId,
                at: $crate::__domain::Timestamp,
            ) -> ::core::result::Result<($crate::Confirmation, ::std::vec::Vec<$crate::Output>), $crate::LockStoreError> {
                self.$inner.confirm_with_change(consumer, outputs, change_to, at).await
            }
        ]; $($rest),*);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; selected $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            async fn selected(
                &self,
                consumer: &$crate::__domain::TxId,
            ) -> ::core::result::Result<::std::vec::Vec<$crate::__domain::Token>, $crate::LockStoreError> {
                self.$inner.selected(consumer).await
            }
        ]; $($rest),*);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; unsettled_owned $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            async fn unsettled_owned(
                &self,
            ) -> ::core::result::Result<::std::vec::Vec<($crate::__domain::TxId, ::core::option::Option<$crate::__domain::TxStatus>)>, $crate::LockStoreError> {
                self.$inner.unsettled_owned().await
            }
        ]; $($rest),*);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; unsettled $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            async fn unsettled(
                &self,
            ) -> ::core::result::Result<::std::vec::Vec<($crate::__domain::TxId, ::core::option::Option<$crate::__domain::TxStatus>)>, $crate::LockStoreError> {
                self.$inner.unsettled().await
            }
        ]; $($rest),*);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; sweep $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            async fn sweep(
                &self,
                rule: $crate::__domain::SweepRule,
            ) -> ::core::result::Result<$crate::SweepReport, $crate::LockStoreError> {
                self.$inner.sweep(rule).await
            }
        ]; $($rest),*);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; list_locks $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            async fn list_locks(
                &self,
            ) -> ::core::result::Result<::std::vec::Vec<$crate::LockInfo>, $crate::LockStoreError> {
                self.$inner.list_locks().await
            }
        ]; $($rest),*);
    };
    (@each $ty:ty; $inner:ident; [$($done:tt)*]; round_trips $(, $rest:ident)*) => {
        $crate::forward_lock_store!(@each $ty; $inner; [$($done)*
            fn round_trips(
                &self,
            ) -> u64 {
                self.$inner.round_trips()
            }
        ]; $($rest),*);
    };
}

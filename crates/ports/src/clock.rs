//! The clock port: the only source of "now" for the app.

use holdfast_domain::Timestamp;

/// Tells the current time. Tests inject a fixed or stepped clock.
#[mockall::automock]
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Timestamp;
}

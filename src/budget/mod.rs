//! Spend budgets and the usage ledger: what a tenant may spend over a calendar day or month, in
//! tokens or USD (`budgets = [{ period, tokens | usd, warn_at }]` on tenants and plans,
//! `[prices]`), enforced at admission and written down per tenant, day and model (the bill).
//!
//! The pure core is [`book`] (reserve at admission, settle exactly once at the end) over
//! [`window`] (the day and month a moment falls in, in `[store] timezone`); [`price`] turns
//! the provider's usage into money; [`spending`] is the shell (the shared state, each
//! generation's limits, the request's [`Reservation`]); [`ledger`] keeps the rows in memory
//! until they are flushed, in batches, to a [`ledger::Sink`]. A spent budget is [`Error`].
//! With `[cluster]`, [`redis`] holds the spend, every replica's reservations and the ledger
//! (the book then mirrors what Redis counted), and budgets fail closed while it is unreachable.

pub mod book;
mod error;
pub mod ledger;
pub mod price;
pub mod redis;
pub mod spending;
pub mod sqlite;
pub mod window;

pub use book::{Book, Exhausted, Limit, Remaining, Spend, Unit, Warning};
pub use error::{remaining_headers, Error, REMAINING_TOKENS, REMAINING_USD};
pub use price::{Price, Prices, Used};
pub use spending::{run_flusher, wall_clock, Budgets, Clock, Reservation, Spending};

#[cfg(test)]
mod tests;

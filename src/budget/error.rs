//! A spent budget, rendered once (by `render`) in OpenAI's shape: `429`, `type` and `code`
//! `insufficient_quota`, `x-fairgate-limit: budget`, `x-should-retry: false` (the official SDKs
//! then do not retry), `Retry-After` = until the budget's period resets, and what is left of
//! every budget in `x-fairgate-budget-remaining-*`.

use std::time::Duration;

use http::{HeaderName, HeaderValue, StatusCode};

use super::book::{Exhausted, Remaining, Unit};
use crate::domain::Usd;
use crate::error::{ApiError, Limit, Reason};

/// Response header: tokens left of the tenant's budgets (the least of its token budgets).
pub const REMAINING_TOKENS: &str = "x-fairgate-budget-remaining-tokens";
/// Response header: USD left of the tenant's budgets (the least of its money budgets).
pub const REMAINING_USD: &str = "x-fairgate-budget-remaining-usd";

/// The `x-fairgate-budget-remaining-*` headers of `r` (none for a unit without a budget).
pub fn remaining_headers(r: Remaining) -> Vec<(HeaderName, HeaderValue)> {
    let mut h = Vec::with_capacity(2);
    if let Some(t) = r.tokens {
        h.push((
            HeaderName::from_static(REMAINING_TOKENS),
            HeaderValue::from(t),
        ));
    }
    if let Some(u) = r.usd {
        if let Ok(v) = HeaderValue::from_str(&u.to_string()) {
            h.push((HeaderName::from_static(REMAINING_USD), v));
        }
    }
    h
}

/// Why a budget refused a request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The estimate does not fit what is left of a budget.
    #[error("{}", message(.0))]
    Exhausted(Exhausted),
    /// Cluster mode: Redis, which holds the budgets, did not answer; budgets fail closed.
    #[error(
        "the budget store is unreachable, so budgeted requests are refused for now; retry shortly"
    )]
    Unavailable,
}

fn amount(unit: Unit, v: u64) -> String {
    match unit {
        Unit::Tokens => format!("{v} tokens"),
        Unit::Usd => format!("${}", Usd(v)),
    }
}

fn message(e: &Exhausted) -> String {
    let l = e.limit;
    format!(
        "you exceeded your {} budget of {} ({} used or reserved by requests in flight); it \
         resets in {}s",
        match l.period {
            crate::domain::Period::Day => "daily",
            crate::domain::Period::Month => "monthly",
        },
        amount(l.unit, l.amount),
        amount(l.unit, e.used),
        e.resets_in
    )
}

impl ApiError for Error {
    fn status(&self) -> StatusCode {
        match self {
            Error::Exhausted(_) => StatusCode::TOO_MANY_REQUESTS,
            Error::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            Error::Exhausted(_) => "insufficient_quota",
            Error::Unavailable => "server_error",
        }
    }
    fn code(&self) -> &'static str {
        match self {
            Error::Exhausted(_) => "insufficient_quota",
            Error::Unavailable => "budget_store_unavailable",
        }
    }
    fn limit(&self) -> Option<Limit> {
        Some(Limit::Budget)
    }
    fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Exhausted(e) => Some(Duration::from_secs(e.resets_in)),
            Error::Unavailable => Some(Duration::from_secs(1)),
        }
    }
    fn headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let Error::Exhausted(e) = self else {
            return Vec::new();
        };
        let mut h = remaining_headers(e.remaining);
        h.push((
            HeaderName::from_static("x-should-retry"),
            HeaderValue::from_static("false"),
        ));
        h
    }
    fn reason(&self) -> Reason {
        match self {
            Error::Exhausted(_) => Reason::Budget,
            Error::Unavailable => Reason::BudgetStore,
        }
    }
    fn never_sent(&self) -> bool {
        true
    }
}

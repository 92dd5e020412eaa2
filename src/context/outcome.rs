//! What happened to the request: admission's outcome ([`Admitted`], [`RateState`]), the fair
//! queue's grant ([`Dispatch`]) and the reconciled cost ([`Usage`]).

use std::time::Duration;

use tokio::time::Instant;

use crate::domain::{Charge, Tokens};

/// A request's queue-wait deadline.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    /// When the budget runs out.
    pub at: Instant,
    /// The budget as given.
    pub budget: Duration,
}

impl Deadline {
    /// Time left (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }
}

/// Admission let the request into the queue.
#[derive(Clone, Copy, Debug)]
pub struct Admitted {
    /// What the tenant's buckets were charged (`None`: the tenant has no rate limits).
    pub charged: Option<Charge>,
    /// The queue-wait deadline, if any.
    pub deadline: Option<Deadline>,
}

/// One bucket's state for the `x-ratelimit-*` headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketState {
    /// Bucket size.
    pub limit: u64,
    /// Cells left now (for a token bucket: including the ledger's credit, minus its debt).
    pub remaining: u64,
    /// Time until the bucket is full again.
    pub reset: Duration,
}

/// A tenant's buckets (absent: no such limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateState {
    /// The request bucket.
    pub requests: Option<BucketState>,
    /// The token buckets: all tokens, input tokens, output tokens.
    pub tokens: [Option<BucketState>; 3],
}

/// The fair queue's grant.
#[derive(Clone, Copy, Debug)]
pub struct Dispatch {
    /// The pool.
    pub pool: usize,
    /// Time queued.
    pub waited: Duration,
    /// The cost charged to the tenant's credit at dispatch (weighted tokens).
    pub charged: Tokens,
    /// When it was granted.
    pub at: Instant,
}

/// What the request actually cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Raw input and output tokens (the provider's usage, or the stated fallback).
    pub tokens: Charge,
    /// Of the input tokens, those the provider read from its prompt cache
    /// (`prompt_tokens_details.cached_tokens`, Responses `input_tokens_details`; 0 if unsaid).
    pub cached_input: u64,
    /// The weighted cost the fair queue reconciles the tenant's credit with.
    pub cost: Tokens,
    /// Whether the provider reported usage (else a fallback count).
    pub reported: bool,
    /// Why the provider's usage could not be read (the `reason` of
    /// `fairgate_usage_unread_total`, counted by `metrics` when the body is done): `encoding`,
    /// `decode`, `truncated`, `malformed`, `too_large` or `missing`. `None` when it was read.
    pub unread: Option<&'static str>,
}

/// What a provider's answer said about itself (OpenTelemetry's `gen_ai.response.*`): read
/// from the JSON body or the SSE events only when the request's spans are recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponseMeta {
    /// `id` (`chatcmpl-…`, `resp_…`), at most [`ResponseMeta::MAX_LEN`] bytes.
    pub id: Option<String>,
    /// `model`: the model that answered, at most [`ResponseMeta::MAX_LEN`] bytes.
    pub model: Option<String>,
    /// Each choice's `finish_reason` (a Responses API answer: its status), at most
    /// [`ResponseMeta::MAX_REASONS`].
    pub finish_reasons: Vec<String>,
}

impl ResponseMeta {
    /// Longest id or model kept (bytes; cut on a character boundary).
    pub const MAX_LEN: usize = 128;
    /// Finish reasons kept at most.
    pub const MAX_REASONS: usize = 16;
}

//! The observing state of a response body: plain or decoded bytes in, usage and text out, and
//! the reconciliation written to the context when the body is done.
//!
//! Invariants:
//! - Plain bodies are scanned as they pass (strip mode may hold back a partial line); coded
//!   bodies are forwarded untouched and a decoded copy is fed to the same scanner (`decode`).
//! - When the provider's usage cannot be read, the request is charged by the stated fallback —
//!   the generated text counted with the model's encoding, or (no text: a JSON body over the
//!   cap) its decoded bytes / 4, or (neither) the output the request was charged at admission
//!   (its output cap or `default_output_tokens`, times its choices) — never 0 output, and the
//!   reason is written to the context's `usage.unread`.

use std::io;

use bytes::Bytes;

use super::decode::{Coding, Decoder};
use super::extract::{self, Tally};
use super::sse::{Scanner, Verdict};
use super::MAX_JSON_BYTES;
use crate::context::{Ctx, Usage};
use crate::domain::{Charge, Weight};
use crate::estimate::{Encoding, Endpoint, Estimate, Estimator, OutputKey, INLINE_MAX_BYTES};

/// Reconciliation too large to run inline.
pub(super) type Work = Box<dyn FnOnce() + Send>;

/// What a completed request is reconciled with.
#[derive(Debug)]
struct Ledger {
    estimator: std::sync::Arc<Estimator>,
    key: OutputKey,
    endpoint: Endpoint,
    encoding: Encoding,
    input: u64,
    /// Output charged at admission: the fallback when usage and text are both missing.
    charged_output: u64,
    choices: u64,
    model_weight: Weight,
    ctx: Ctx,
}

enum Mode {
    Json {
        buf: Vec<u8>,
        total: u64,
        over: bool,
    },
    Sse(Scanner),
}

/// Observes plain (or decoded) bytes.
struct Plain {
    mode: Mode,
    tally: Tally,
    strip: bool,
}

impl Plain {
    /// Observes a plain chunk; returns what to forward (strip mode may change it).
    fn see(&mut self, data: Bytes) -> Bytes {
        match &mut self.mode {
            Mode::Sse(scanner) if self.strip => {
                let tally = &mut self.tally;
                scanner.feed(data, &mut |p| keep(tally, true, p))
            }
            _ => {
                self.look(&data);
                data
            }
        }
    }

    /// Observes a chunk without forwarding it.
    fn look(&mut self, data: &[u8]) {
        match &mut self.mode {
            Mode::Json { buf, total, over } => {
                *total = total.saturating_add(data.len() as u64);
                if !*over && buf.len() + data.len() <= MAX_JSON_BYTES {
                    buf.extend_from_slice(data);
                } else {
                    *over = true;
                    *buf = Vec::new();
                }
            }
            Mode::Sse(scanner) => {
                let tally = &mut self.tally;
                scanner.observe(data, &mut |p| {
                    keep(tally, false, p);
                });
            }
        }
    }

    /// At the end: observes what is left; returns bytes still held back (strip mode).
    fn end(&mut self) -> Bytes {
        match &mut self.mode {
            Mode::Json { buf, over, .. } => {
                let buf = std::mem::take(buf);
                if !*over && !buf.is_empty() {
                    self.tally.observe_body(&buf);
                } else if !*over {
                    self.tally.malformed += 1;
                }
                Bytes::new()
            }
            Mode::Sse(scanner) => {
                let (tally, strip) = (&mut self.tally, self.strip);
                scanner.finish(&mut |p| keep(tally, strip, p))
            }
        }
    }
}

impl io::Write for Plain {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.look(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The SSE payload filter: observe; in strip mode, drop the usage-only chunk and trim the
/// null usage of the others.
pub(super) fn keep(tally: &mut Tally, strip: bool, payload: &[u8]) -> Verdict {
    if payload.first() != Some(&b'{') {
        return Verdict::Keep;
    }
    let seen = tally.observe(payload);
    match seen.null_usage {
        _ if !strip => Verdict::Keep,
        _ if seen.usage_only => Verdict::Drop,
        Some(at) => Verdict::Trim(at),
        None => Verdict::Keep,
    }
}

enum Feed {
    Plain(Plain),
    Coded(Box<Decoder<Plain>>),
}

impl Feed {
    fn plain(&mut self) -> &mut Plain {
        match self {
            Feed::Plain(p) => p,
            Feed::Coded(d) => d.sink(),
        }
    }
}

/// A stream's output counted as it passes (SSE only). When a meter enforces a limit on it
/// (`exact`), each byte of delta text is counted once, in steps of at least [`STEP_BYTES`], so
/// the CPU spent is bounded by the text kept for the final count (`max_exact_bytes`); text past
/// that is estimated from its bytes. Otherwise the text's bytes / 4 stand for it (the meters
/// then only follow the cost; the final usage settles it). A provider that reports usage on
/// every chunk is taken at its word.
#[derive(Debug, Default)]
struct Running {
    /// Bytes of the tally's text counted so far.
    bytes: usize,
    /// Tokens counted in them.
    tokens: u64,
    /// The last progress reported.
    reported: u64,
}

/// New delta text is counted once this many bytes have arrived since the last count (about 64
/// tokens: the meters see a stream's cost in steps that small).
pub(super) const STEP_BYTES: usize = 256;

/// The observing state; see the module docs.
pub(super) struct Observer {
    feed: Feed,
    /// Why the bytes can no longer be read (`encoding`, `decode`); nothing more is fed then.
    lost: Option<&'static str>,
    ledger: Option<Ledger>,
    running: Running,
}

impl Observer {
    /// Observes the 2xx response (`sse` or JSON, coded with `coding`, `None`: an unknown
    /// coding) to the request of `ctx` with `estimate`.
    pub(super) fn new(
        estimate: &Estimate,
        estimator: std::sync::Arc<Estimator>,
        ctx: Ctx,
        sse: bool,
        coding: Option<Coding>,
    ) -> Self {
        let identity = coding == Some(Coding::Identity);
        // A coded stream cannot be edited: its usage chunk then stays.
        let strip = sse && estimate.strip_usage && identity;
        let max_text = estimator.config().max_exact_bytes;
        // The answer's id, model and finish reasons: only for a request whose spans are recorded.
        let recorded = ctx.recorded();
        let tally = move || {
            let mut t = Tally::new(max_text);
            t.meta = recorded.then(Box::default);
            t
        };
        let plain = || Plain {
            mode: if sse {
                Mode::Sse(Scanner::new(strip))
            } else {
                Mode::Json {
                    buf: Vec::new(),
                    total: 0,
                    over: false,
                }
            },
            tally: tally(),
            strip,
        };
        let (feed, lost) = match coding {
            Some(Coding::Identity) => (Feed::Plain(plain()), None),
            Some(c) => match Decoder::new(c, plain()) {
                Ok(Some(d)) => (Feed::Coded(Box::new(d)), None),
                _ => (Feed::Plain(plain()), Some("decode")),
            },
            None => (Feed::Plain(plain()), Some("encoding")),
        };
        Self {
            feed,
            lost,
            ledger: Some(Ledger {
                estimator,
                key: estimate.key.clone(),
                endpoint: estimate.endpoint,
                encoding: estimate.encoding,
                input: estimate.input.tokens,
                charged_output: estimate.charge.output,
                choices: estimate.choices.max(1),
                model_weight: estimate.model_weight,
                ctx,
            }),
            running: Running::default(),
        }
    }

    /// A stream's progress, when its output grew by a step since the last report; counted
    /// exactly when `exact` (see [`Running`]).
    pub(super) fn progress(&mut self, exact: bool) -> Option<crate::response::Progress> {
        let l = self.ledger.as_ref()?;
        let plain = self.feed.plain();
        if !matches!(plain.mode, Mode::Sse(_)) {
            return None;
        }
        let tally = &plain.tally;
        let output = if let Some(reported) = tally.usage.and_then(|u| u.completion_tokens) {
            reported
        } else {
            let new = tally.text.len() - self.running.bytes;
            if exact && new >= STEP_BYTES {
                let counted = l
                    .estimator
                    .count_text(l.encoding, &tally.text[self.running.bytes..]);
                self.running.tokens = self.running.tokens.saturating_add(counted.tokens);
                self.running.bytes = tally.text.len();
            }
            let uncounted = if exact { 0 } else { new.div_ceil(4) as u64 };
            self.running
                .tokens
                .saturating_add(uncounted)
                .saturating_add(tally.extra_bytes.div_ceil(4))
        };
        if output < self.running.reported.saturating_add(STEP_BYTES as u64 / 4) {
            return None;
        }
        self.running.reported = output;
        let cost = l.estimator.actual_cost(l.input, output, l.model_weight).0;
        Some(crate::response::Progress { output, cost })
    }

    /// Whether forwarded bytes may differ from the provider's (the length changes).
    pub(super) fn strips(&self) -> bool {
        matches!(&self.feed, Feed::Plain(p) if p.strip)
    }

    /// Observes one frame; returns what to forward.
    pub(super) fn see(&mut self, data: Bytes) -> Bytes {
        if self.lost.is_some() {
            return data;
        }
        match &mut self.feed {
            Feed::Plain(p) => p.see(data),
            Feed::Coded(d) => {
                if d.write(&data).is_err() {
                    self.lost = Some("decode");
                }
                data
            }
        }
    }

    /// Ends observation (`complete`: the body reached its end, rather than failing or being
    /// dropped): returns bytes still held back (strip mode), and reconciles (inline, or the
    /// returned work for the blocking pool). Idempotent.
    pub(super) fn end(&mut self, complete: bool) -> (Bytes, Option<Work>) {
        if self.ledger.is_none() {
            return (Bytes::new(), None);
        }
        if let (Feed::Coded(d), None) = (&mut self.feed, self.lost) {
            // A stream cut short does not finish either: that is `truncated`, not `decode`.
            if d.finish().is_err() && complete {
                self.lost = Some("decode");
            }
        }
        let held = self.feed.plain().end();
        (held, self.reconcile(complete))
    }

    fn reconcile(&mut self, complete: bool) -> Option<Work> {
        let l = self.ledger.take()?;
        let lost = self.lost;
        let plain = self.feed.plain();
        let tally = &mut plain.tally;
        let usage = tally.usage;
        let (json, over_bytes) = match &plain.mode {
            Mode::Json { total, over, .. } => (true, over.then_some(*total)),
            Mode::Sse(_) => (false, None),
        };
        let read = usage.is_some_and(|u| {
            u.completion_tokens.is_some() || (l.endpoint == Endpoint::Embeddings && lost.is_none())
        });
        let unread = if read {
            None
        } else if let Some(lost) = lost {
            Some(lost)
        } else if over_bytes.is_some() {
            Some("too_large")
        } else if json && tally.malformed > 0 {
            Some(if complete { "malformed" } else { "truncated" })
        } else if !complete && !json {
            Some("truncated")
        } else {
            Some("missing")
        };
        if let Some(meta) = tally.meta.take() {
            l.ctx.set_response(meta.finish());
        }
        let text = std::mem::take(&mut tally.text);
        let extra = tally.extra_bytes;
        let big = usage.is_none() && text.len() > INLINE_MAX_BYTES;
        let work = move || reconcile(l, usage, unread, text, extra, over_bytes);
        if big {
            Some(Box::new(work))
        } else {
            work();
            None
        }
    }
}

fn reconcile(
    l: Ledger,
    usage: Option<extract::Usage>,
    unread: Option<&'static str>,
    text: String,
    extra_bytes: u64,
    over_bytes: Option<u64>,
) {
    let input = usage.and_then(|u| u.prompt_tokens).unwrap_or(l.input);
    let output = if l.endpoint == Endpoint::Embeddings {
        0
    } else if let Some(out) = usage.and_then(|u| u.completion_tokens) {
        out
    } else if let Some(bytes) = over_bytes {
        bytes.div_ceil(4).max(1)
    } else {
        let counted = l.estimator.count_text(l.encoding, &text);
        let ratio = if counted.tokens > 0 {
            text.len() as f64 / counted.tokens as f64
        } else {
            4.0
        };
        let counted = counted
            .tokens
            .saturating_add((extra_bytes as f64 / ratio.max(1.0)).ceil() as u64);
        if counted > 0 {
            counted
        } else {
            l.charged_output.max(1)
        }
    };
    let actual = l.estimator.actual_cost(input, output, l.model_weight);
    l.ctx.set_usage(Usage {
        tokens: Charge { input, output },
        cached_input: usage.map_or(0, |u| u.cached_tokens()).min(input),
        cost: actual,
        reported: unread.is_none(),
        unread,
    });
    if l.endpoint != Endpoint::Embeddings {
        // Learned per choice: the estimate multiplies it back by the request's choices.
        l.estimator.record_output(&l.key, output / l.choices);
    }
    if let Some(d) = l.ctx.dispatch() {
        l.estimator
            .record_error(&l.key.tenant, d.charged, actual, unread.is_none());
    }
}

#[cfg(test)]
mod tests;

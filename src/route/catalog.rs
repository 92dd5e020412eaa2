//! The providers' own model lists, for `/v1/models` of upstreams routed by a wildcard.
//!
//! Invariants: a list is fetched only for `/v1/models` (never on the path of any other
//! request): lazily on the first `GET /v1/models` (which waits for it, at most the fetch's
//! `models_list_timeout_ms`), then served from the cache and refreshed in the background once
//! older than `models_list_ttl_ms` (one fetch in flight per upstream at most); at most
//! `models_list_max` entries are kept, the body is read up to `models_list_max_bytes`. A fetch
//! that fails keeps the last good list (none: only explicit names are listed), logs one
//! `warn` when an upstream starts failing and one `info` when it answers again, and is retried
//! after the TTL. No lock is held across an `.await`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::upstream::Upstream;

/// One model of a provider's list, as it described it.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// `id`.
    pub id: String,
    /// `created` (0 when absent).
    pub created: u64,
    /// `owned_by` (absent: the upstream's name).
    pub owned_by: Option<String>,
}

/// Longest model id kept (longer ones are skipped).
const MAX_ID_BYTES: usize = 256;

/// What one upstream's last fetch left.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    models: Arc<[Model]>,
    /// A fetch has finished (successfully or not): the first `GET` stops waiting.
    attempted: bool,
}

#[derive(Debug, Default)]
struct State {
    fetched: Option<Instant>,
    in_flight: bool,
    failing: bool,
}

/// One wildcard-routed upstream's cached list.
#[derive(Debug)]
struct Entry {
    upstream: Arc<Upstream>,
    state: Mutex<State>,
    snapshot: watch::Sender<Snapshot>,
}

/// The cache for every upstream (indexed like `[[upstreams]]`; `None`: no wildcard, nothing
/// fetched).
#[derive(Debug)]
pub struct Catalog {
    entries: Box<[Option<Arc<Entry>>]>,
}

/// Whether a `models` pattern has a wildcard.
pub fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?'])
}

impl Catalog {
    /// An entry for each upstream with a wildcard pattern.
    pub fn new(upstreams: &[Arc<Upstream>]) -> Self {
        let entries = upstreams
            .iter()
            .map(|u| {
                u.models.iter().any(|m| is_glob(m)).then(|| {
                    Arc::new(Entry {
                        upstream: u.clone(),
                        state: Mutex::default(),
                        snapshot: watch::Sender::new(Snapshot::default()),
                    })
                })
            })
            .collect();
        Self { entries }
    }

    /// Whether any upstream's list is fetched.
    pub fn is_empty(&self) -> bool {
        self.entries.iter().all(Option::is_none)
    }

    /// Every upstream's current list (index → models), starting the fetches that are due and
    /// waiting for the ones never made yet (each bounded by its own timeout).
    pub async fn current(&self) -> Vec<(usize, Arc<[Model]>)> {
        for e in self.entries.iter().flatten() {
            e.refresh_if_due();
        }
        let mut out = Vec::new();
        for (i, e) in self.entries.iter().enumerate() {
            let Some(e) = e else { continue };
            let mut rx = e.snapshot.subscribe();
            // The fetch bounds itself; this bound only guards against a fetch task lost.
            let wait = e.upstream.models_list.timeout + Duration::from_millis(100);
            let _ = tokio::time::timeout(wait, rx.wait_for(|s| s.attempted)).await;
            let models = rx.borrow().models.clone();
            out.push((i, models));
        }
        out
    }
}

impl Entry {
    /// Starts a background fetch if none is in flight and the list is missing or older than
    /// the TTL.
    fn refresh_if_due(self: &Arc<Self>) {
        {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let fresh = s
                .fetched
                .is_some_and(|at| at.elapsed() < self.upstream.models_list.ttl);
            if s.in_flight || fresh {
                return;
            }
            s.in_flight = true;
        }
        let entry = self.clone();
        tokio::spawn(async move {
            let result = entry.upstream.list_models().await.and_then(|body| {
                parse(&body, entry.upstream.models_list.max).map_err(|e| format!("body: {e}"))
            });
            let ok = result.is_ok();
            let (warn, recovered) = {
                let mut s = entry.state.lock().unwrap_or_else(|p| p.into_inner());
                s.in_flight = false;
                s.fetched = Some(Instant::now());
                let (warn, recovered) = transition(s.failing, ok);
                s.failing = !ok;
                (warn, recovered)
            };
            let name = &entry.upstream.name;
            match result {
                Ok(models) => {
                    if recovered {
                        tracing::info!(upstream = %name, "models list: the provider answers again");
                    }
                    entry.snapshot.send_replace(Snapshot {
                        models: models.into(),
                        attempted: true,
                    });
                }
                Err(why) => {
                    if warn {
                        tracing::warn!(
                            upstream = %name,
                            error = %why,
                            "models list: could not fetch the provider's /models; listing the \
                             models named in config (and the last list fetched, if any)"
                        );
                    }
                    entry.snapshot.send_modify(|s| s.attempted = true);
                }
            }
        });
    }
}

/// (log a warning, log a recovery) for a fetch that succeeded (`ok`) after a run that was
/// (`was_failing`) failing: one line per change, none while the state holds.
fn transition(was_failing: bool, ok: bool) -> (bool, bool) {
    (!was_failing && !ok, was_failing && ok)
}

/// An OpenAI list body (`{"data":[{"id":…},…]}`) → at most `max` models (ids longer than
/// [`MAX_ID_BYTES`] or not strings skipped).
pub fn parse(body: &[u8], max: usize) -> Result<Vec<Model>, serde_json::Error> {
    #[derive(serde::Deserialize)]
    struct List {
        data: Vec<serde_json::Value>,
    }
    let list: List = serde_json::from_slice(body)?;
    Ok(list
        .data
        .iter()
        .filter_map(|m| {
            let id = m.get("id")?.as_str()?;
            (!id.is_empty() && id.len() <= MAX_ID_BYTES).then(|| Model {
                id: id.to_owned(),
                created: m.get("created").and_then(|c| c.as_u64()).unwrap_or(0),
                owned_by: m
                    .get("owned_by")
                    .and_then(|o| o.as_str())
                    .filter(|o| o.len() <= MAX_ID_BYTES)
                    .map(str::to_owned),
            })
        })
        .take(max)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_keeps_at_most_max_and_skips_junk() {
        let long = "x".repeat(MAX_ID_BYTES + 1);
        let body = format!(
            r#"{{"object":"list","data":[{{"id":"a","created":7,"owned_by":"org"}},{{"id":3}},{{"id":"{long}"}},{{"id":"b"}},{{"id":"c"}}]}}"#
        );
        let models = parse(body.as_bytes(), 2).unwrap();
        assert_eq!(
            models,
            vec![
                Model {
                    id: "a".into(),
                    created: 7,
                    owned_by: Some("org".into())
                },
                Model {
                    id: "b".into(),
                    created: 0,
                    owned_by: None
                },
            ]
        );
        assert!(parse(b"{\"error\":{}}", 10).is_err());
    }

    #[test]
    fn failures_log_once_per_run() {
        // Healthy: nothing; first failure: warn; still failing: nothing; recovered: info.
        assert_eq!(transition(false, true), (false, false));
        assert_eq!(transition(false, false), (true, false));
        assert_eq!(transition(true, false), (false, false));
        assert_eq!(transition(true, true), (false, true));
    }
}

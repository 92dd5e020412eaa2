//! What a tenant's **own** provider keys (`upstream_api_key_env`, `upstream_api_key_envs`) have
//! learned from the provider: a pause per (pool, endpoint, tenant, model) — the provider's rate
//! limits are per key, and OpenAI's are per model within a key — set by that key's 429/503 (`retry-after-ms`, `Retry-After`, else
//! `x-ratelimit-reset-*`, else [`DEFAULT_PAUSE`]) and by a success that says a budget is spent
//! (`x-ratelimit-remaining-*: 0`).
//!
//! Invariants: a tenant key's answers never reach the pool's [`PoolCapacity`]
//! (super::capacity::PoolCapacity), so they never lower the shared key's learned limit nor pause
//! it; a paused key holds back only its own tenant's requests: they go to the pool's other
//! endpoints, and are refused (immediately, 429 `x-fairgate-limit: upstream` with the pause left
//! as `Retry-After`) only while the key is paused on every endpoint it is used on; the map is bounded ([`MAX_ENTRIES`]): expired
//! pauses are swept when it is full, and a model that finds it still full is paused under the
//! key-wide entry (model `*`), which every model of the key obeys — a tenant inventing model
//! names pauses only itself. Local to this replica (in cluster mode, each replica learns its
//! tenant keys' pauses from the answers it gets; they are not shared through Redis).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use http::{HeaderMap, StatusCode};

use super::capacity::{spent_until, upstream_wait};
use crate::domain::TenantId;

/// The pause after a 429/503 that names no wait.
pub const DEFAULT_PAUSE: Duration = Duration::from_secs(1);
/// Pauses held at most (then expired ones are swept, then the key-wide entry is used).
pub const MAX_ENTRIES: usize = 4096;
/// Model names longer than this are cut (bytes, on a char boundary) in the pause's key.
const MAX_MODEL: usize = 64;
/// The key-wide entry's model.
const ANY_MODEL: &str = "*";

type Key = (usize, usize, TenantId, Box<str>);

/// Pauses of tenants' own provider keys; see the module docs.
#[derive(Debug)]
pub struct KeyPauses {
    epoch: tokio::time::Instant,
    until: Mutex<HashMap<Key, Duration>>,
}

impl Default for KeyPauses {
    fn default() -> Self {
        Self {
            epoch: tokio::time::Instant::now(),
            until: Mutex::new(HashMap::new()),
        }
    }
}

fn cut(model: &str) -> &str {
    let mut end = model.len().min(MAX_MODEL);
    while !model.is_char_boundary(end) {
        end -= 1;
    }
    &model[..end]
}

impl KeyPauses {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Duration>> {
        self.until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Time left in the pause of `tenant`'s own key for `model` on endpoint `endpoint` of
    /// `pool` (zero: not paused).
    pub fn paused_for(
        &self,
        (pool, endpoint): (usize, usize),
        tenant: &TenantId,
        model: &str,
    ) -> Duration {
        let now = self.epoch.elapsed();
        let map = self.lock();
        [cut(model), ANY_MODEL]
            .iter()
            .filter_map(|m| map.get(&(pool, endpoint, tenant.clone(), Box::from(*m))))
            .map(|until| until.saturating_sub(now))
            .max()
            .unwrap_or_default()
    }

    /// Feeds one answer endpoint `endpoint` of `pool` gave `tenant`'s own key for `model`.
    pub fn observe(
        &self,
        (pool, endpoint): (usize, usize),
        tenant: &TenantId,
        model: &str,
        status: StatusCode,
        headers: &HeaderMap,
    ) {
        let wait = match status {
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                Some(upstream_wait(headers).unwrap_or(DEFAULT_PAUSE))
            }
            s if s.is_success() => spent_until(headers),
            _ => None,
        };
        let Some(wait) = wait.filter(|w| !w.is_zero()) else {
            return;
        };
        let now = self.epoch.elapsed();
        let mut map = self.lock();
        if map.len() >= MAX_ENTRIES {
            map.retain(|_, until| *until > now);
        }
        let model = if map.len() >= MAX_ENTRIES {
            ANY_MODEL
        } else {
            cut(model)
        };
        let until = map
            .entry((pool, endpoint, tenant.clone(), Box::from(model)))
            .or_default();
        *until = (*until).max(now + wait);
    }

    /// Pauses held (expired ones included until swept).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no pause is held.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::feedback::signals::header_map as h;

    #[tokio::test(start_paused = true)]
    async fn a_429_pauses_that_key_and_model_only_for_the_wait_it_names() {
        let p = KeyPauses::default();
        let (a, b) = (TenantId::new("a"), TenantId::new("b"));
        p.observe(
            (0, 0),
            &a,
            "gpt-4o",
            StatusCode::TOO_MANY_REQUESTS,
            &h(&[("retry-after", "2")]),
        );
        assert_eq!(p.paused_for((0, 0), &a, "gpt-4o"), Duration::from_secs(2));
        assert_eq!(p.paused_for((0, 0), &a, "gpt-4o-mini"), Duration::ZERO);
        assert_eq!(p.paused_for((0, 0), &b, "gpt-4o"), Duration::ZERO);
        assert_eq!(p.paused_for((1, 0), &a, "gpt-4o"), Duration::ZERO);
        assert_eq!(
            p.paused_for((0, 1), &a, "gpt-4o"),
            Duration::ZERO,
            "another endpoint"
        );
        tokio::time::advance(Duration::from_millis(2001)).await;
        assert_eq!(p.paused_for((0, 0), &a, "gpt-4o"), Duration::ZERO);
        // No wait named: the default pause; a spent budget on a success: until its reset.
        p.observe(
            (0, 0),
            &a,
            "m",
            StatusCode::SERVICE_UNAVAILABLE,
            &HeaderMap::new(),
        );
        assert_eq!(p.paused_for((0, 0), &a, "m"), DEFAULT_PAUSE);
        p.observe(
            (0, 0),
            &b,
            "m",
            StatusCode::OK,
            &h(&[
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", "3s"),
            ]),
        );
        assert_eq!(p.paused_for((0, 0), &b, "m"), Duration::from_secs(3));
        p.observe((0, 0), &a, "x", StatusCode::OK, &HeaderMap::new());
        p.observe((0, 0), &a, "x", StatusCode::BAD_REQUEST, &HeaderMap::new());
        assert_eq!(p.paused_for((0, 0), &a, "x"), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn invented_model_names_stay_bounded_and_pause_only_their_tenant() {
        let p = KeyPauses::default();
        let (a, b) = (TenantId::new("a"), TenantId::new("b"));
        let retry = h(&[("retry-after", "60")]);
        for i in 0..MAX_ENTRIES + 50 {
            let model = format!("{i}-{}", "m".repeat(500));
            p.observe((0, 0), &a, &model, StatusCode::TOO_MANY_REQUESTS, &retry);
        }
        assert!(p.len() <= MAX_ENTRIES + 1, "{}", p.len());
        assert!(
            p.paused_for((0, 0), &a, "never-seen") > Duration::ZERO,
            "full: the key-wide pause"
        );
        assert_eq!(p.paused_for((0, 0), &b, "never-seen"), Duration::ZERO);
    }
}

//! `[store]`, `[prices."MODEL"]` and `budgets = [...]` (on tenants and plans): what a tenant may
//! spend over a day or a month, what a model costs, and where the usage ledger is kept.
//!
//! Invariant: a validated budget has exactly one of `tokens` / `usd`, positive and finite, and
//! a `warn_at` in (0, 1]; every price is finite and >= 0; the store's `timezone` names a zone
//! the bundled time-zone database knows (or a fixed `+HH:MM` offset).

use std::path::PathBuf;

use serde::Deserialize;

use super::validate::invalid;
use super::{Config, ConfigError};
use crate::domain::Period;

/// `[store]`: the one embedded SQLite file for durable state (the usage ledger; with
/// `[cluster]` the ledger lives in Redis instead).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// The SQLite file (created on first use).
    pub path: PathBuf,
    /// Ledger rows (tenant, day, model) older than this many days are deleted.
    pub usage_retention_days: u32,
    /// How often the usage ledger is written, in one transaction (ms). A `kill -9` loses at
    /// most the spend of the requests in flight and of those that ended in the last interval.
    pub flush_ms: u64,
    /// The calendar of budget periods and of the ledger's days: `"UTC"`, an IANA zone
    /// (`"Europe/Berlin"`) or a fixed offset (`"+05:30"`).
    pub timezone: String,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("fairgate.sqlite"),
            usage_retention_days: 400,
            flush_ms: 1000,
            timezone: "UTC".to_owned(),
        }
    }
}

/// `[prices."MODEL"]` (the name may be a glob, as in `models` routes): USD per million tokens.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    /// USD per 1M input tokens.
    pub input: f64,
    /// USD per 1M output tokens.
    pub output: f64,
    /// USD per 1M cached input tokens (default: `input`).
    #[serde(default)]
    pub cached_input: Option<f64>,
}

/// One entry of `budgets = [...]`: at most `tokens` (input + output) or `usd` per `period`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// `day` or `month` (calendar, in `[store] timezone`).
    pub period: Period,
    /// Tokens (input + output) per period.
    #[serde(default)]
    pub tokens: Option<u64>,
    /// USD per period (priced by `[prices]`; a model without a price costs 0 USD).
    #[serde(default)]
    pub usd: Option<f64>,
    /// Fraction of the budget at which a warning is logged and counted (optional).
    #[serde(default)]
    pub warn_at: Option<f64>,
}

impl super::TenantConfig {
    /// Budgets: the tenant's own list (also an empty one) > the plan's > none.
    pub fn effective_budgets<'a>(&'a self, config: &'a Config) -> &'a [BudgetConfig] {
        match &self.budgets {
            Some(b) => b,
            None => self
                .plan
                .as_ref()
                .and_then(|p| config.plans.get(p))
                .and_then(|p| p.budgets.as_deref())
                .unwrap_or(&[]),
        }
    }
}

fn budget_list(prefix: &str, list: &[BudgetConfig]) -> Result<(), ConfigError> {
    for (i, b) in list.iter().enumerate() {
        let key = |k: &str| format!("{prefix}.budgets[{i}]{k}");
        match (b.tokens, b.usd) {
            (Some(0), None) => return Err(invalid(key(".tokens"), "must be > 0")),
            (None, Some(u)) if !(u.is_finite() && u > 0.0) => {
                return Err(invalid(key(".usd"), format!("must be > 0, got {u}")))
            }
            (Some(_), None) | (None, Some(_)) => {}
            _ => return Err(invalid(key(""), "needs exactly one of tokens or usd")),
        }
        if let Some(w) = b.warn_at {
            if !(w > 0.0 && w <= 1.0) {
                return Err(invalid(
                    key(".warn_at"),
                    format!("must be in (0, 1], got {w}"),
                ));
            }
        }
    }
    Ok(())
}

/// Checks `[store]`, `[prices]` and every `budgets` list.
pub(super) fn validate(c: &Config) -> Result<(), ConfigError> {
    if let Some(s) = &c.store {
        if s.path.as_os_str().is_empty() {
            return Err(invalid("store.path", "must not be empty"));
        }
        if s.flush_ms == 0 {
            return Err(invalid("store.flush_ms", "must be > 0"));
        }
        if s.usage_retention_days == 0 {
            return Err(invalid("store.usage_retention_days", "must be > 0"));
        }
        if let Err(e) = crate::domain::Zone::parse(&s.timezone) {
            return Err(invalid("store.timezone", e));
        }
    }
    for (model, p) in &c.prices {
        for (k, v) in [
            ("input", Some(p.input)),
            ("output", Some(p.output)),
            ("cached_input", p.cached_input),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(invalid(
                        format!("prices.{model:?}.{k}"),
                        format!("must be a number >= 0, got {v}"),
                    ));
                }
            }
        }
    }
    for (name, p) in &c.plans {
        budget_list(
            &format!("plans.{name}"),
            p.budgets.as_deref().unwrap_or(&[]),
        )?;
    }
    for (i, t) in c.tenants.iter().enumerate() {
        budget_list(
            &format!("tenants[{i}]"),
            t.budgets.as_deref().unwrap_or(&[]),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(&format!(
            "[[upstreams]]\nname = \"u\"\nbase_url = \"http://127.0.0.1:1/v1\"\n{extra}"
        ))
    }

    /// `[store] path` holds the jobs too; `[jobs] path`, the older spelling, still wins when set.
    #[test]
    fn jobs_are_stored_in_the_store_path_unless_jobs_path_is_set() {
        let jobs = |extra: &str| parse(extra).unwrap().jobs.unwrap().path;
        assert_eq!(jobs("[jobs]\n"), PathBuf::from("fairgate-jobs.sqlite"));
        assert_eq!(
            jobs("[store]\npath = \"s.sqlite\"\n[jobs]\n"),
            PathBuf::from("s.sqlite")
        );
        assert_eq!(
            jobs("[store]\n[jobs]\n"),
            PathBuf::from("fairgate.sqlite"),
            "[store]'s default path"
        );
        assert_eq!(
            jobs("[store]\npath = \"s.sqlite\"\n[jobs]\npath = \"j.sqlite\"\n"),
            PathBuf::from("j.sqlite")
        );
        assert_eq!(
            jobs("[jobs]\npath = \"j.sqlite\"\n"),
            PathBuf::from("j.sqlite")
        );
        let e = parse("[jobs]\npath = \"\"\n").unwrap_err().to_string();
        assert!(e.starts_with("jobs.path"), "{e}");
    }

    #[test]
    fn budgets_prices_and_the_store_parse_with_their_defaults() {
        let c = parse(
            r#"
[store]
path = "x.sqlite"
[prices."gpt-4o-mini"]
input = 0.15
output = 0.60
[plans.pro]
budgets = [{ period = "month", usd = 500.0, warn_at = 0.8 }]
[[tenants]]
id = "a"
api_keys = ["k"]
plan = "pro"
[[tenants]]
id = "b"
api_keys = ["k2"]
plan = "pro"
budgets = [{ period = "day", tokens = 2000000 }]
"#,
        )
        .unwrap();
        let s = c.store.clone().unwrap();
        assert_eq!((s.usage_retention_days, s.flush_ms), (400, 1000));
        assert_eq!(s.timezone, "UTC");
        assert_eq!(c.prices["gpt-4o-mini"].cached_input, None);
        let a = c.tenants[0].effective_budgets(&c);
        assert_eq!(a[0].period, Period::Month);
        assert_eq!(a[0].usd, Some(500.0));
        let b = c.tenants[1].effective_budgets(&c);
        assert_eq!(
            (b.len(), b[0].tokens),
            (1, Some(2_000_000)),
            "the tenant's own wins"
        );
    }

    #[test]
    fn bad_budgets_name_their_key() {
        let err = |t: &str| {
            parse(&format!("[[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\n{t}"))
                .unwrap_err()
                .to_string()
        };
        let both = err(r#"budgets = [{ period = "day", tokens = 5, usd = 1.0 }]"#);
        assert!(both.starts_with("tenants[0].budgets[0]:"), "{both}");
        let none = err(r#"budgets = [{ period = "day" }]"#);
        assert!(none.contains("exactly one"), "{none}");
        let warn = err(r#"budgets = [{ period = "day", tokens = 5, warn_at = 1.5 }]"#);
        assert!(warn.starts_with("tenants[0].budgets[0].warn_at"), "{warn}");
        let period = err(r#"budgets = [{ period = "week", tokens = 5 }]"#);
        assert!(period.contains("period"), "{period}");
        let zone = parse("[store]\ntimezone = \"Mars/Olympus\"").unwrap_err();
        assert!(zone.to_string().starts_with("store.timezone"), "{zone}");
        let price = parse("[prices.\"m\"]\ninput = -1.0\noutput = 1.0").unwrap_err();
        assert!(
            price.to_string().starts_with("prices.\"m\".input"),
            "{price}"
        );
    }
}

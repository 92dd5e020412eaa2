//! `[metrics]`, `[log]` and `[admin]`: what the Prometheus endpoint exposes, how request logs
//! look, and who may use the admin API.

use serde::Deserialize;

/// `[metrics]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Label per-tenant series with the tenant id (`true`) or with the tenant's plan cohort
    /// (`false`; tenants without a plan share the cohort `none`), for very many tenants.
    pub per_tenant_labels: bool,
    /// What the histograms (queue wait, duration, time to first byte, estimate error) are
    /// labelled by while `per_tenant_labels` is on: `"auto"` (default: per tenant up to
    /// [`AUTO_TENANT_HISTOGRAMS`] tenants, per plan beyond), `"plan"` (label `plan`, the
    /// tenant's plan or `none`) or `"tenant"` (labels `tenant` and `plan`: ~90 lines per
    /// tenant).
    pub histograms: HistogramLabels,
    /// Scrape-time gauges (queue depth, in flight, oldest queued, share ratio) are written for
    /// at most this many tenants: those with the most backlog (queued, then in flight, then
    /// served). Default 100; the console (`/admin/ui`) shows every tenant.
    pub top_tenants: usize,
}

/// With `[metrics] histograms = "auto"`, a configuration of at most this many tenants gets
/// per-tenant histograms (~90 lines each: ~18,000 lines at 200), a larger one histograms by
/// plan cohort.
pub const AUTO_TENANT_HISTOGRAMS: usize = 200;

/// `[metrics] histograms`: the label of the histograms.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum HistogramLabels {
    /// Per tenant while the configuration has at most [`AUTO_TENANT_HISTOGRAMS`] tenants, per
    /// plan cohort beyond (decided at each reload from that generation's tenant count).
    #[default]
    Auto,
    /// Per plan cohort (`plan` label): a handful of series however many tenants.
    Plan,
    /// Per tenant (`tenant` and `plan` labels).
    Tenant,
}

impl HistogramLabels {
    /// Whether a configuration of `tenants` tenants gets per-tenant histograms.
    pub fn per_tenant(self, tenants: usize) -> bool {
        match self {
            HistogramLabels::Auto => tenants <= AUTO_TENANT_HISTOGRAMS,
            HistogramLabels::Plan => false,
            HistogramLabels::Tenant => true,
        }
    }
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            per_tenant_labels: true,
            histograms: HistogramLabels::Auto,
            top_tenants: 100,
        }
    }
}

/// Format of log lines.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable `key=value` lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[log]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `"text"` (default) or `"json"`.
    pub format: LogFormat,
}

/// `[admin]`: the admin API (`GET /admin/tenants`), off unless a token is configured.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// A separate listener for `/metrics` and the admin API. Unset: both are on the main
    /// listener; set: only here (the main listener no longer answers them).
    pub listen: Option<std::net::SocketAddr>,
    /// Env var holding the bearer token of the admin API. Unset key: the admin API is off (404).
    pub token_env: Option<String>,
    /// Admin writes of tenants and keys waiting at once for the control plane's low-priority
    /// thread; one more is refused (503 `admin_writes_busy`, `Retry-After`). Default 256.
    pub max_queued_writes: usize,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: None,
            token_env: None,
            max_queued_writes: 256,
        }
    }
}

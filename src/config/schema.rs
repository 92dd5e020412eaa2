//! The configuration schema: every table and key of `config.toml`, with its default.
//!
//! Invariant: every struct rejects unknown keys; defaults here match the comments in the
//! reference `config.toml`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::domain::{Class, Weight};

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[server]`: listener and request limits.
    #[serde(default)]
    pub server: ServerConfig,
    /// `[scheduler]`: fair-queue policy and caps.
    #[serde(default)]
    pub scheduler: SchedulerConfig,
    /// `[[upstreams]]`: provider pools, tried in order for model routing (resolved into their
    /// endpoints as they are read, see `config::endpoints`).
    #[serde(deserialize_with = "super::endpoints::resolved_upstreams")]
    pub upstreams: Vec<UpstreamConfig>,
    /// `[plans.NAME]`: shared tenant settings.
    #[serde(default)]
    pub plans: BTreeMap<String, PlanConfig>,
    /// `[[tenants]]`.
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// `[admission]`: size caps, deadlines and upstream retries.
    #[serde(default)]
    pub admission: AdmissionConfig,
    /// `[estimate]`: how a request's cost is estimated.
    #[serde(default)]
    pub estimate: EstimateConfig,
    /// `[models."NAME"]`: per-model cost weight and tokenizer override.
    #[serde(default)]
    pub models: BTreeMap<String, ModelConfig>,
    /// `[metrics]`: the Prometheus endpoint.
    #[serde(default)]
    pub metrics: super::MetricsConfig,
    /// `[log]`: request log format.
    #[serde(default)]
    pub log: super::LogConfig,
    /// `[admin]`: the admin API.
    #[serde(default)]
    pub admin: super::AdminConfig,
    /// `[cluster]`: share capacity, fairness and rate limits with other replicas through Redis
    /// (absent: a single process).
    #[serde(default)]
    pub cluster: Option<super::ClusterConfig>,
    /// `[otel]`: OpenTelemetry trace export (off unless `endpoint` is set).
    #[serde(default)]
    pub otel: super::OtelConfig,
    /// `[jobs]`: asynchronous requests (`Prefer: respond-async`) and the Batch API, stored in an
    /// embedded SQLite file (absent: both are off).
    #[serde(default)]
    pub jobs: Option<JobsConfig>,
    /// `[store]`: the one embedded SQLite file of durable state (the usage ledger, tenants and
    /// keys created through the admin API); with `[cluster]` that state lives in Redis instead.
    /// Absent: the usage ledger is kept in memory only (a restart forgets what budgets were
    /// spent) and runtime tenants are off.
    #[serde(default)]
    pub store: Option<super::StoreConfig>,
    /// `[prices."MODEL"]`: USD per million tokens, by model name or glob.
    #[serde(default)]
    pub prices: BTreeMap<String, super::PriceConfig>,
}

/// `[jobs]`: asynchronous jobs and batches (`src/jobs`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct JobsConfig {
    /// `[jobs] path` as written (the older spelling of `[store] path`, still accepted).
    #[serde(rename = "path")]
    pub path_set: Option<PathBuf>,
    /// The SQLite file holding jobs, files and results (created on first use): `[jobs] path`
    /// when set, else `[store] path` with `[store]` (one file for all durable state), else
    /// `fairgate-jobs.sqlite`; resolved by [`super::Config::from_toml_str`]. Not used with
    /// `[cluster]` (jobs live in Redis).
    #[serde(skip)]
    pub path: PathBuf,
    /// Jobs (batch lines and async requests) of one tenant running through the stack at once.
    pub max_inflight_per_tenant: usize,
    /// Finished jobs, batches and their files are deleted this many hours after they finish
    /// (uploaded files: after they were created).
    pub retention_hours: u64,
    /// Jobs (async requests and batch lines) a tenant may have queued or running.
    pub max_queued_jobs_per_tenant: u64,
    /// Bytes a tenant may have stored (files, job bodies, results).
    pub max_stored_bytes_per_tenant: u64,
    /// With `[cluster]`: how long a replica's claim on a job holds without renewal (renewed
    /// every third of it); a job whose replica died runs elsewhere after this.
    pub lease_ms: u64,
    /// Largest `/v1/files` upload in bytes (whatever `[server] max_body_bytes` says).
    pub max_file_bytes: u64,
    /// Most (non-blank) lines of an uploaded file.
    pub max_file_lines: u64,
    /// File uploads and downloads one tenant may have open at once.
    pub max_transfers_per_tenant: usize,
    /// Bytes a second one tenant's file uploads and downloads move together (paced, with a
    /// burst of one second of it; per replica); 0: no limit.
    pub transfer_bytes_per_second_per_tenant: u64,
}

impl Default for JobsConfig {
    fn default() -> Self {
        Self {
            path_set: None,
            path: PathBuf::from("fairgate-jobs.sqlite"),
            max_inflight_per_tenant: 4,
            retention_hours: 24,
            max_queued_jobs_per_tenant: 50_000,
            max_stored_bytes_per_tenant: 512 << 20,
            lease_ms: 30_000,
            max_file_bytes: 200_000_000,
            max_file_lines: 50_000,
            max_transfers_per_tenant: 4,
            transfer_bytes_per_second_per_tenant: 25_000_000,
        }
    }
}

/// `[estimate]`: cost = (input × input_weight + output × output_weight + tool_call_tokens ×
/// allowed tool calls) × the model's weight.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EstimateConfig {
    /// Weight of an input token.
    pub input_weight: f64,
    /// Weight of an output token.
    pub output_weight: f64,
    /// Tokens budgeted per allowed tool call.
    pub tool_call_tokens: u64,
    /// Output tokens assumed before a (tenant, model) has history.
    pub default_output_tokens: u64,
    /// Tokenizer of models tiktoken-rs does not know.
    pub default_encoding: String,
    /// Text bytes per request counted exactly; the rest is extrapolated.
    pub max_exact_bytes: usize,
}

impl Default for EstimateConfig {
    fn default() -> Self {
        Self {
            input_weight: 1.0,
            output_weight: 1.5,
            tool_call_tokens: 2000,
            default_output_tokens: 512,
            default_encoding: "o200k_base".to_owned(),
            max_exact_bytes: 256 * 1024,
        }
    }
}

/// `[models."NAME"]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Cost multiplier of this model.
    #[serde(default = "one")]
    pub weight: f64,
    /// Tokenizer override (e.g. `cl100k_base`).
    #[serde(default)]
    pub encoding: Option<String>,
}

/// `[admission]`: defaults of the per-plan/tenant caps, and the upstream retry policy.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Estimated input tokens above this are refused (400) before queueing.
    pub max_input_tokens: u64,
    /// A `max_tokens` above this is refused (400) before queueing.
    pub max_output_tokens: u64,
    /// Default queue-wait budget in ms (none: wait as long as it takes).
    pub max_queue_wait_ms: Option<u64>,
    /// Retries of an upstream 429/502/503 answered before any byte reached the client.
    pub max_retries: u32,
    /// First retry backoff in ms (doubled per attempt, with jitter).
    pub retry_backoff_ms: u64,
    /// Ceiling of one retry backoff in ms.
    pub retry_backoff_max_ms: u64,
    /// Total time one request may wait between its upstream attempts (holding its pool slot),
    /// ms; a retry that would wait longer is not made and the 429 goes to the client.
    pub max_retry_wait_ms: u64,
    /// Debt (usage beyond what admission charged) a token bucket carries, in minutes of that
    /// bucket's rate: it is paid by later admissions, never forgiven while within this bound.
    pub max_debt_minutes: u32,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            max_input_tokens: 200_000,
            max_output_tokens: 100_000,
            max_queue_wait_ms: None,
            max_retries: 3,
            retry_backoff_ms: 50,
            retry_backoff_max_ms: 2_000,
            max_retry_wait_ms: 3_000,
            max_debt_minutes: 10,
        }
    }
}

/// A tenant's admission limits, resolved tenant > plan > `[admission]` default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantLimits {
    /// Requests per minute (none: unlimited).
    pub requests_per_minute: Option<u32>,
    /// Estimated tokens per minute (none: unlimited).
    pub tokens_per_minute: Option<u32>,
    /// Estimated input tokens per minute (none: unlimited).
    pub input_tokens_per_minute: Option<u32>,
    /// Estimated output tokens per minute (none: unlimited).
    pub output_tokens_per_minute: Option<u32>,
    /// Bucket size as a multiple of one minute's budget.
    pub burst: f64,
    /// Input-token cap of one request.
    pub max_input_tokens: u64,
    /// Output-token cap of one request.
    pub max_output_tokens: u64,
    /// Queue-wait budget, ms.
    pub max_queue_wait_ms: Option<u64>,
    /// Debt a token bucket carries, in minutes of its rate (`[admission] max_debt_minutes`).
    pub max_debt_minutes: u32,
    /// A stream is ended once its counted output passes this (none: no cap).
    pub max_stream_output_tokens: Option<u64>,
    /// A stream is ended once its counted output passes the tenant's remaining token budget.
    pub cut_off_over_budget: bool,
}

/// `[server]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Sidecar mode: a trusted header naming the tenant id.
    pub tenant_header: Option<String>,
    /// Peers whose `tenant_header` is trusted (CIDR ranges); from any other peer the header is
    /// ignored and an API key is required.
    pub trusted_sources: Vec<String>,
    /// Request body cap in bytes.
    pub max_body_bytes: usize,
    /// Drain time on shutdown, milliseconds.
    pub shutdown_grace_ms: u64,
    /// Optional inbound TLS.
    pub tls: Option<TlsConfig>,
    /// Threads serving client connections, each with its own single-threaded runtime and
    /// accept loop (absent: one per CPU core).
    pub workers: Option<usize>,
    /// A request body that delivers no data for this long is answered 408, ms.
    pub client_body_timeout_ms: u64,
    /// A request body abandoned early (413, 401, …) is read and discarded up to this many
    /// bytes before the connection is closed (0: close at once).
    pub linger_max_bytes: u64,
    /// … and for at most this long, ms.
    pub linger_timeout_ms: u64,
    /// A response whose client accepts no bytes for this long is aborted (upstream cancelled,
    /// every slot released, the connection closed), ms. nginx's `send_timeout`.
    pub client_write_timeout_ms: u64,
    /// An idle connection (no request in flight) is closed after this long, ms.
    pub keepalive_timeout_ms: u64,
    /// Client connections open at once on the main listener (absent: derived from the
    /// descriptor limit, see `fdlimit`).
    pub max_connections: Option<usize>,
    /// Client connections open at once from one IP address (absent: unlimited).
    pub max_connections_per_ip: Option<u32>,
    /// Concurrent h2 streams per connection.
    pub http2_max_concurrent_streams: u32,
    /// h2 keep-alive ping interval (and time allowed for its answer), ms.
    pub http2_keepalive_interval_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            tenant_header: None,
            trusted_sources: vec!["127.0.0.1/32".to_owned(), "::1/128".to_owned()],
            max_body_bytes: 8 * 1024 * 1024,
            shutdown_grace_ms: 30_000,
            tls: None,
            workers: None,
            client_body_timeout_ms: 60_000,
            linger_max_bytes: 64 * 1024 * 1024,
            linger_timeout_ms: 10_000,
            client_write_timeout_ms: 30_000,
            keepalive_timeout_ms: 75_000,
            max_connections: None,
            max_connections_per_ip: None,
            http2_max_concurrent_streams: 128,
            http2_keepalive_interval_ms: 20_000,
        }
    }
}

/// `[server.tls]`: PEM files.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Certificate chain (PEM).
    pub cert: PathBuf,
    /// Private key (PEM).
    pub key: PathBuf,
}

pub use crate::domain::Policy;

/// `[scheduler]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// `drr` or `fifo`.
    pub policy: Policy,
    /// Tokens per DRR visit at weight 1.
    pub quantum: u64,
    /// Pool-wide queued request cap (per upstream pool).
    pub max_queued: usize,
    /// Default per-tenant queued request cap.
    pub max_queued_per_tenant: usize,
    /// Request bytes (body + kept parsed form) queued or in flight in one pool, all tenants.
    pub max_queued_bytes: u64,
    /// Default per-tenant request bytes queued or in flight in one pool.
    pub max_queued_bytes_per_tenant: u64,
    /// Pool slots kept for recovery keys.
    pub reserved_slots: usize,
    /// A batch request waiting longer than this ages into interactive.
    pub batch_max_wait_ms: u64,
    /// Class shares within a pool.
    pub classes: ClassShares,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            policy: Policy::Drr,
            quantum: 4096,
            max_queued: 10_000,
            max_queued_per_tenant: 1000,
            max_queued_bytes: 512 * 1024 * 1024,
            max_queued_bytes_per_tenant: 64 * 1024 * 1024,
            reserved_slots: 0,
            batch_max_wait_ms: 30_000,
            classes: ClassShares::default(),
        }
    }
}

/// `[scheduler.classes]`: relative shares of the two classes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClassShares {
    /// Share of interactive traffic.
    pub interactive: u32,
    /// Share of batch traffic.
    pub batch: u32,
}

impl Default for ClassShares {
    fn default() -> Self {
        Self {
            interactive: 8,
            batch: 1,
        }
    }
}

/// `[[upstreams]]`: one provider pool (one fair queue) over one or more endpoints.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Unique name.
    pub name: String,
    /// `http(s)://host[:port]/prefix`; `/v1/X` goes to `base_url + /X`. A pool of one endpoint;
    /// exclusive with `endpoints`.
    #[serde(default)]
    pub base_url: Option<String>,
    /// Env var holding the provider key (the default of the endpoints' own).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Pool size shared by all tenants: the one written, else the sum of the endpoints'
    /// (filled in when read).
    #[serde(skip)]
    pub max_concurrency: usize,
    /// `max_concurrency` as written.
    #[serde(default, rename = "max_concurrency")]
    pub written_concurrency: Option<usize>,
    /// `[[upstreams.endpoints]]` as written.
    #[serde(default, rename = "endpoints")]
    pub(super) written_endpoints: Vec<super::endpoints::RawEndpoint>,
    /// The pool's endpoints, resolved when read (a plain `base_url`: one endpoint).
    #[serde(skip)]
    pub endpoints: Vec<super::EndpointConfig>,
    /// Model glob patterns (`*`, `?`).
    #[serde(default = "default_models")]
    pub models: Vec<String>,
    /// TCP connect timeout, ms (the endpoints' default).
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
    /// Time to the response head, ms (the endpoints' default).
    #[serde(default = "default_first_byte_timeout")]
    pub first_byte_timeout_ms: u64,
    /// Max gap between body chunks, ms (the endpoints' default).
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_ms: u64,
    /// A PEM bundle of CA certificates trusted for this upstream, on top of the bundled
    /// (Mozilla) roots: a private CA, a service mesh.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Also trust the operating system's certificate store.
    #[serde(default)]
    pub system_roots: bool,
    /// Client certificate chain (PEM) for mutual TLS; needs `client_key_file`.
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
    /// The header carrying the provider key (the endpoints' default): `authorization` as
    /// `Bearer KEY` when unset, any other name as the bare key (`api-key`).
    #[serde(default)]
    pub auth_header: Option<String>,
    /// Query parameters added to every request (the endpoints' default).
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    /// Request model names rewritten before sending (the endpoints' default).
    #[serde(default)]
    pub models_map: BTreeMap<String, String>,
    /// Ejection and probing of the pool's endpoints.
    #[serde(default)]
    pub health: super::HealthConfig,
    /// With a wildcard in `models`: the provider's own `GET /models` is fetched for fairgate's
    /// `/v1/models`, bounded by this time (connect, head and body), ms.
    #[serde(default = "default_models_list_timeout")]
    pub models_list_timeout_ms: u64,
    /// How long a fetched model list is served before it is refreshed (in the background), ms.
    #[serde(default = "default_models_list_ttl")]
    pub models_list_ttl_ms: u64,
    /// At most this many models are kept from the provider's list (the rest are dropped).
    #[serde(default = "default_models_list_max")]
    pub models_list_max: usize,
    /// The provider's list body is read up to this many bytes (beyond: the fetch fails).
    #[serde(default = "default_models_list_max_bytes")]
    pub models_list_max_bytes: usize,
}

fn default_models_list_timeout() -> u64 {
    5_000
}
fn default_models_list_ttl() -> u64 {
    300_000
}
fn default_models_list_max() -> usize {
    1_000
}
fn default_models_list_max_bytes() -> usize {
    1 << 20
}

fn default_models() -> Vec<String> {
    vec!["*".to_owned()]
}
fn default_connect_timeout() -> u64 {
    5_000
}
fn default_first_byte_timeout() -> u64 {
    120_000
}
fn default_idle_timeout() -> u64 {
    60_000
}

/// `[plans.NAME]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanConfig {
    /// Share weight.
    #[serde(default = "one")]
    pub weight: f64,
    /// Per-tenant concurrency cap.
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    /// Per-tenant queued cap.
    #[serde(default)]
    pub max_queued: Option<usize>,
    /// Per-tenant queued request bytes.
    #[serde(default)]
    pub max_queued_bytes: Option<u64>,
    /// Requests per minute (token bucket; optional, default unlimited).
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    /// Estimated tokens per minute (token bucket; optional, default unlimited).
    #[serde(default)]
    pub tokens_per_minute: Option<u32>,
    /// Estimated input tokens per minute (token bucket; optional, default unlimited).
    #[serde(default)]
    pub input_tokens_per_minute: Option<u32>,
    /// Estimated output tokens per minute (token bucket; optional, default unlimited).
    #[serde(default)]
    pub output_tokens_per_minute: Option<u32>,
    /// Bucket size as a multiple of one minute's budget (default 1.0).
    #[serde(default)]
    pub burst: Option<f64>,
    /// Input-token cap of one request (default `[admission] max_input_tokens`).
    #[serde(default)]
    pub max_input_tokens: Option<u64>,
    /// Output-token cap of one request (default `[admission] max_output_tokens`).
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    /// Queue-wait budget in ms (default `[admission] max_queue_wait_ms`).
    #[serde(default)]
    pub max_queue_wait_ms: Option<u64>,
    /// A stream is ended (a final error event and `[DONE]`) once its counted output passes
    /// this many tokens (optional; default none).
    #[serde(default)]
    pub max_stream_output_tokens: Option<u64>,
    /// A stream is ended once its counted output passes the tenant's remaining token budget
    /// (optional; default false: the overrun becomes debt).
    #[serde(default)]
    pub cut_off_over_budget: Option<bool>,
    /// Spend budgets per day or month (`config::budgets`).
    #[serde(default)]
    pub budgets: Option<Vec<super::BudgetConfig>>,
}

fn one() -> f64 {
    1.0
}

/// `[[tenants]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Unique tenant id.
    pub id: String,
    /// Plaintext keys (hashed at load).
    #[serde(default)]
    pub api_keys: Vec<String>,
    /// SHA-256 hex digests of keys.
    #[serde(default)]
    pub api_key_sha256: Vec<String>,
    /// Share weight (overrides the plan's).
    #[serde(default)]
    pub weight: Option<f64>,
    /// Plan name in `[plans]`.
    #[serde(default)]
    pub plan: Option<String>,
    /// Concurrency cap (overrides the plan's).
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    /// Queued cap (overrides the plan's and the scheduler default).
    #[serde(default)]
    pub max_queued: Option<usize>,
    /// Queued request bytes (overrides the plan's and the scheduler default).
    #[serde(default)]
    pub max_queued_bytes: Option<u64>,
    /// Env var holding this tenant's own provider key.
    #[serde(default)]
    pub upstream_api_key_env: Option<String>,
    /// This tenant's own provider key per endpoint name (env var names), over
    /// `upstream_api_key_env` on those endpoints.
    #[serde(default)]
    pub upstream_api_key_envs: BTreeMap<String, String>,
    /// Credential or account-selecting headers (e.g. `openai-project`) this tenant's clients
    /// may send to the provider; all others are stripped.
    #[serde(default)]
    pub forward_headers: Vec<String>,
    /// Default class of this tenant's requests.
    #[serde(default)]
    pub priority: Class,
    /// Keys whose requests may use `reserved_slots` (plaintext).
    #[serde(default)]
    pub recovery_api_keys: Vec<String>,
    /// Keys whose requests default to the batch class, whatever `priority` says (plaintext).
    #[serde(default)]
    pub batch_api_keys: Vec<String>,
    /// Requests per minute (token bucket; optional, default unlimited).
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    /// Estimated tokens per minute (token bucket; optional, default unlimited).
    #[serde(default)]
    pub tokens_per_minute: Option<u32>,
    /// Estimated input tokens per minute (token bucket; optional, default unlimited).
    #[serde(default)]
    pub input_tokens_per_minute: Option<u32>,
    /// Estimated output tokens per minute (token bucket; optional, default unlimited).
    #[serde(default)]
    pub output_tokens_per_minute: Option<u32>,
    /// Bucket size as a multiple of one minute's budget (default 1.0).
    #[serde(default)]
    pub burst: Option<f64>,
    /// Input-token cap of one request (default `[admission] max_input_tokens`).
    #[serde(default)]
    pub max_input_tokens: Option<u64>,
    /// Output-token cap of one request (default `[admission] max_output_tokens`).
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    /// Queue-wait budget in ms (default `[admission] max_queue_wait_ms`).
    #[serde(default)]
    pub max_queue_wait_ms: Option<u64>,
    /// A stream is ended (a final error event and `[DONE]`) once its counted output passes
    /// this many tokens (optional; default none).
    #[serde(default)]
    pub max_stream_output_tokens: Option<u64>,
    /// A stream is ended once its counted output passes the tenant's remaining token budget
    /// (optional; default false: the overrun becomes debt).
    #[serde(default)]
    pub cut_off_over_budget: Option<bool>,
    /// Spend budgets per day or month (`config::budgets`).
    #[serde(default)]
    pub budgets: Option<Vec<super::BudgetConfig>>,
}

impl TenantConfig {
    fn plan<'a>(&self, config: &'a Config) -> Option<&'a PlanConfig> {
        self.plan.as_ref().and_then(|p| config.plans.get(p))
    }

    /// Weight: tenant > plan > 1.
    pub fn effective_weight(&self, config: &Config) -> Weight {
        let w = self
            .weight
            .or_else(|| self.plan(config).map(|p| p.weight))
            .unwrap_or(1.0);
        Weight::new(w).unwrap_or(Weight::ONE)
    }

    /// Concurrency cap: tenant > plan > none.
    pub fn effective_max_concurrency(&self, config: &Config) -> Option<usize> {
        self.max_concurrency
            .or_else(|| self.plan(config).and_then(|p| p.max_concurrency))
    }

    /// Queued cap: tenant > plan > `[scheduler] max_queued_per_tenant`.
    pub fn effective_max_queued(&self, config: &Config) -> usize {
        self.max_queued
            .or_else(|| self.plan(config).and_then(|p| p.max_queued))
            .unwrap_or(config.scheduler.max_queued_per_tenant)
    }

    /// Queued request bytes: tenant > plan > `[scheduler] max_queued_bytes_per_tenant`.
    pub fn effective_max_queued_bytes(&self, config: &Config) -> u64 {
        self.max_queued_bytes
            .or_else(|| self.plan(config).and_then(|p| p.max_queued_bytes))
            .unwrap_or(config.scheduler.max_queued_bytes_per_tenant)
    }

    /// Admission limits: tenant > plan > `[admission]` defaults.
    pub fn effective_limits(&self, config: &Config) -> TenantLimits {
        let plan = self.plan(config);
        macro_rules! pick {
            ($f:ident) => {
                self.$f.or_else(|| plan.and_then(|p| p.$f))
            };
        }
        let d = &config.admission;
        TenantLimits {
            requests_per_minute: pick!(requests_per_minute),
            tokens_per_minute: pick!(tokens_per_minute),
            input_tokens_per_minute: pick!(input_tokens_per_minute),
            output_tokens_per_minute: pick!(output_tokens_per_minute),
            burst: pick!(burst).unwrap_or(1.0),
            max_input_tokens: pick!(max_input_tokens).unwrap_or(d.max_input_tokens),
            max_output_tokens: pick!(max_output_tokens).unwrap_or(d.max_output_tokens),
            max_queue_wait_ms: pick!(max_queue_wait_ms).or(d.max_queue_wait_ms),
            max_debt_minutes: d.max_debt_minutes,
            max_stream_output_tokens: pick!(max_stream_output_tokens),
            cut_off_over_budget: pick!(cut_off_over_budget).unwrap_or(false),
        }
    }
}

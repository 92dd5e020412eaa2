//! Configuration: the TOML schema (`config.toml` at the repo root is its annotated reference),
//! loading with key-path errors, semantic validation, and effective per-tenant values.
//!
//! Invariants: unknown keys are rejected everywhere; a `Config` returned by [`Config::load`] or
//! [`Config::from_toml_str`] has passed [`validate`] (unique ids/keys/names, weights > 0, plans
//! exist, URLs are http(s), digests are 64 hex chars). Environment variables are read only by
//! [`Config::check_env`], at startup.

mod budgets;
mod cidr;
mod cluster;
mod endpoints;
mod observe;
mod otel;
mod schema;
mod validate;

use std::path::{Path, PathBuf};

pub use budgets::{BudgetConfig, PriceConfig, StoreConfig};
pub use cidr::Cidr;
pub use cluster::ClusterConfig;
pub use endpoints::{EndpointConfig, HealthConfig, DEFAULT_ENDPOINT_CONCURRENCY};
pub use observe::{
    AdminConfig, HistogramLabels, LogConfig, LogFormat, MetricsConfig, AUTO_TENANT_HISTOGRAMS,
};
pub use otel::{is_url as is_otel_url, OtelConfig};
pub use schema::*;
pub use validate::validate;

/// A configuration error; its message names the offending key path.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// cannot read config file {path}: {source}
    #[error("cannot read config file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML does not parse or does not fit the schema.
    #[error("{0}")]
    Parse(String),
    /// A value fits the schema but makes no sense.
    #[error("{key}: {message}")]
    Invalid {
        /// Key path, e.g. `tenants[0].weight`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// An environment variable named by a `*_env` key is not set.
    #[error("{key}: environment variable {var} is not set")]
    MissingEnv {
        /// Key path, e.g. `upstreams[0].api_key_env`.
        key: String,
        /// The variable name.
        var: String,
    },
}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml_str(&text)
    }

    /// Parses and validates TOML text. Errors name the key path, e.g. `tenants[0].wieght`.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        let de = toml::Deserializer::parse(text).map_err(|e| ConfigError::Parse(at(text, &e)))?;
        let mut config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = redact(e.into_inner().message().trim());
            ConfigError::Parse(if path == "." {
                inner
            } else {
                format!("{path}: {inner}")
            })
        })?;
        config.resolve_jobs_path();
        validate(&config)?;
        Ok(config)
    }

    /// Where jobs are stored: `[jobs] path` (the older spelling) when set, else `[store] path`
    /// with `[store]` (the one file for durable state), else the default `fairgate-jobs.sqlite`.
    fn resolve_jobs_path(&mut self) {
        let store = self.store.as_ref().map(|s| s.path.clone());
        if let Some(j) = &mut self.jobs {
            if let Some(p) = j.path_set.clone().or(store) {
                j.path = p;
            }
        }
    }

    /// Every `*_env` key whose variable is unset, as errors naming the key.
    pub fn check_env(&self) -> Vec<ConfigError> {
        let upstreams = self.upstreams.iter().enumerate().filter_map(|(i, u)| {
            u.api_key_env
                .as_ref()
                .map(|v| (format!("upstreams[{i}].api_key_env"), v))
        });
        let tenants = self.tenants.iter().enumerate().filter_map(|(i, t)| {
            t.upstream_api_key_env
                .as_ref()
                .map(|v| (format!("tenants[{i}].upstream_api_key_env"), v))
        });
        let admin = self
            .admin
            .token_env
            .as_ref()
            .map(|v| ("admin.token_env".to_owned(), v));
        let cluster = self.cluster.iter().flat_map(|c| {
            [
                ("cluster.password_env", &c.password_env),
                ("cluster.username_env", &c.username_env),
            ]
            .into_iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k.to_owned(), v)))
        });
        upstreams
            .chain(tenants)
            .chain(admin)
            .chain(cluster)
            .filter(|(_, var)| std::env::var_os(var).is_none())
            .map(|(key, var)| ConfigError::MissingEnv {
                key,
                var: var.clone(),
            })
            .collect()
    }
}

/// A TOML syntax error as `line L, column C: message`, without the source line the `toml`
/// crate would quote (it may hold a key, token or Redis password).
fn at(text: &str, e: &toml::de::Error) -> String {
    let message = redact(e.message().trim());
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("TOML parse error at line {line}, column {column}: {message}")
        }
        None => format!("TOML parse error: {message}"),
    }
}

/// `message` with every double-quoted string replaced by `"…"`: serde quotes the offending value
/// (`invalid type: string "sk-…", expected a sequence`), and a value may be a secret; so is the
/// value of an `unknown variant`. Key names and the expected variants (in backticks) are kept.
pub fn redact(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut quoted = false;
    let mut escaped = false;
    for c in message.chars() {
        if quoted {
            match (escaped, c) {
                (false, '\\') => escaped = true,
                (false, '"') => {
                    quoted = false;
                    out.push_str("…\"");
                }
                _ => escaped = false,
            }
        } else {
            out.push(c);
            quoted = c == '"';
        }
    }
    if quoted {
        out.push('…');
    }
    // An unknown enum value is quoted in backticks: a value too (field names stay shown).
    const VARIANT: &str = "unknown variant `";
    if let Some(start) = out.find(VARIANT).map(|i| i + VARIANT.len()) {
        if let Some(len) = out[start..].find('`') {
            out.replace_range(start..start + len, "…");
        }
    }
    out
}

/// What `fairgate check` prints on success, plus warnings (e.g. unset env vars).
pub fn check(path: &Path) -> Result<(String, Vec<String>), ConfigError> {
    let config = Config::load(path)?;
    let warnings = config
        .check_env()
        .into_iter()
        .map(|e| format!("warning: {e}"))
        .collect();
    let summary = format!(
        "ok: {} tenants, {} upstreams",
        config.tenants.len(),
        config.upstreams.len()
    );
    Ok((summary, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("fairgate-{}-{name}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn check_reports_counts_and_warns_on_missing_env() {
        let path = write(
            "check-ok",
            "[[upstreams]]\nname = \"u\"\nbase_url = \"http://h/v1\"\n\
             api_key_env = \"FAIRGATE_TEST_SURELY_UNSET_VAR\"\n\
             [[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\n",
        );
        let (summary, warnings) = check(&path).unwrap();
        assert_eq!(summary, "ok: 1 tenants, 1 upstreams");
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].contains("upstreams[0].api_key_env"),
            "{warnings:?}"
        );
        let _ = std::fs::remove_file(path);
    }

    /// Config and reload errors never echo a secret value (keys, tokens, Redis passwords).
    #[test]
    fn errors_never_echo_a_secret() {
        const SECRET: &str = "sk-SECRET-0123";
        let base = "[[upstreams]]\nname = \"u\"\nbase_url = \"http://h/v1\"\n";
        for bad in [
            format!("{base}[[tenants]]\nid = \"a\"\napi_keys = \"{SECRET}\"\n"),
            format!("{base}[[tenants]]\nid = \"a\"\napi_keys = [\"{SECRET}\"\n"),
            format!("{base}[[tenants]]\nid = \"a\"\napi_keys = [\"{SECRET}\", \"{SECRET}\"]\n"),
            format!("{base}[[tenants]]\nid = \"a\"\napi_keys = [\"{SECRET}\"] x\n"),
            format!("{base}[[tenants]]\nid = \"a\"\nrecovery_api_keys = [{{k = \"{SECRET}\"}}]\n"),
            format!("{base}[[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\npriority = \"{SECRET}\"\n"),
            format!("{base}[cluster]\nredis_url = \"redis://:{SECRET}@h:6379\"\ntimeout_ms = 0\n"),
            format!("{base}[cluster]\nredis_url = \"rediss://:{SECRET}@h:6379\"\n"),
            format!("{base}[cluster]\nredis_url = \"http://:{SECRET}@h\"\n"),
            format!("{base}[cluster]\nredis_url = 7 {SECRET}\n"),
            format!("{base}[admin]\ntoken = \"{SECRET}\"\n"),
        ] {
            let e = Config::from_toml_str(&bad).unwrap_err().to_string();
            assert!(!e.contains(SECRET) && !e.contains("SECRET"), "{e}");
            assert!(!e.is_empty());
        }
        assert_eq!(
            redact(r#"invalid type: string "a\"b", expected `x`"#),
            r#"invalid type: string "…", expected `x`"#
        );
    }

    #[test]
    fn syntax_errors_name_line_and_column() {
        let e = Config::from_toml_str("[server]\nlisten = = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("TOML parse error at line 2, column"), "{e}");
    }

    #[test]
    fn check_fails_naming_the_key() {
        let path = write(
            "check-bad",
            "[[upstreams]]\nname = \"u\"\nbase_url = \"http://h/v1\"\nmax_concurency = 3\n",
        );
        let e = check(&path).unwrap_err().to_string();
        assert!(e.starts_with("upstreams[0].max_concurency"), "{e}");
        let _ = std::fs::remove_file(path);
        assert!(matches!(
            check(Path::new("/nonexistent/fairgate.toml")),
            Err(ConfigError::Io { .. })
        ));
    }
}

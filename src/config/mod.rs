//! Configuration: the TOML schema (`config.toml` at the repo root is its annotated reference),
//! loading with key-path errors, semantic validation, and effective per-tenant values.
//!
//! Invariants: unknown keys are rejected everywhere; a `Config` returned by [`Config::load`] or
//! [`Config::from_toml_str`] has passed [`validate`] (unique ids/keys/names, weights > 0, plans
//! exist, URLs are http(s), digests are 64 hex chars). Environment variables are read only by
//! [`Config::check_env`], at startup.

mod cluster;
mod observe;
mod schema;
mod validate;

use std::path::{Path, PathBuf};

pub use cluster::ClusterConfig;
pub use observe::{AdminConfig, LogConfig, LogFormat, MetricsConfig};
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
        let de = toml::Deserializer::parse(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().message().trim().to_owned();
            ConfigError::Parse(if path == "." {
                inner
            } else {
                format!("{path}: {inner}")
            })
        })?;
        validate(&config)?;
        Ok(config)
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
        upstreams
            .chain(tenants)
            .chain(admin)
            .filter(|(_, var)| std::env::var_os(var).is_none())
            .map(|(key, var)| ConfigError::MissingEnv {
                key,
                var: var.clone(),
            })
            .collect()
    }
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

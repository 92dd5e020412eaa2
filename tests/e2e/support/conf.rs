//! Test configs built as values: a TOML table edited by name — a server key, the upstream, a
//! tenant by id, any dotted path — never TOML text spliced by position. The result is parsed by
//! the real [`Config::from_toml_str`], so unknown keys are still refused and every default is the
//! one a user gets.
//!
//! ```ignore
//! let proxy = Conf::new(&mock.base_url())          // upstream `mock`, tenants `a` and `b`
//!     .server("max_body_bytes", 1024)
//!     .upstream("max_concurrency", 4)
//!     .tenant("b", "weight", 3.0)
//!     .set("scheduler.quantum", 40)
//!     .start()
//!     .await;
//! ```

use fairgate::config::Config;
use fairgate::server::ServerHandle;
use toml::{Table, Value};

use super::{proxy, proxy_with_env, KEY_A, KEY_B};

/// A fairgate config under construction (see the module doc).
#[derive(Debug, Clone)]
pub struct Conf(Table);

/// A value a config key can take: numbers, booleans, strings, lists of them, TOML values.
pub trait Val {
    /// As a TOML value.
    fn val(self) -> Value;
}

macro_rules! val_as_integer {
    ($($t:ty),*) => {$(
        impl Val for $t {
            fn val(self) -> Value {
                Value::Integer(i64::try_from(self).expect("fits a TOML integer"))
            }
        }
    )*};
}
val_as_integer!(i32, i64, u32, u64, usize);

impl Val for f64 {
    fn val(self) -> Value {
        Value::Float(self)
    }
}

impl Val for bool {
    fn val(self) -> Value {
        Value::Boolean(self)
    }
}

impl Val for &str {
    fn val(self) -> Value {
        Value::String(self.to_owned())
    }
}

impl Val for String {
    fn val(self) -> Value {
        Value::String(self)
    }
}

impl Val for &String {
    fn val(self) -> Value {
        Value::String(self.clone())
    }
}

impl<T: Val> Val for Vec<T> {
    fn val(self) -> Value {
        Value::Array(self.into_iter().map(Val::val).collect())
    }
}

impl<T: Val, const N: usize> Val for [T; N] {
    fn val(self) -> Value {
        Value::Array(self.into_iter().map(Val::val).collect())
    }
}

impl Val for Value {
    fn val(self) -> Value {
        self
    }
}

impl Val for Table {
    fn val(self) -> Value {
        Value::Table(self)
    }
}

impl Conf {
    /// `[server] listen = "127.0.0.1:0"` and nothing else.
    pub fn bare() -> Conf {
        Conf(Table::new()).server("listen", "127.0.0.1:0")
    }

    /// The default test config: one upstream `mock` at `base_url`, tenants `a` ([`KEY_A`]) and
    /// `b` ([`KEY_B`]), listening on 127.0.0.1:0.
    pub fn new(base_url: &str) -> Conf {
        Conf::bare()
            .add_upstream("mock", base_url)
            .add_tenant("a", KEY_A)
            .add_tenant("b", KEY_B)
    }

    /// One upstream `mock` at `base_url` of `capacity` slots (`max_concurrency`), no tenants.
    pub fn pool(base_url: &str, capacity: usize) -> Conf {
        Conf::bare()
            .add_upstream("mock", base_url)
            .upstream("max_concurrency", capacity)
    }

    /// Adds the `[[upstreams]]` entry `name` at `base_url`.
    pub fn add_upstream(self, name: &str, base_url: &str) -> Conf {
        self.push("upstreams", entry("name", name).with("base_url", base_url))
    }

    /// Adds the tenant `id` with one API key.
    pub fn add_tenant(self, id: &str, key: &str) -> Conf {
        self.push("tenants", entry("id", id).with("api_keys", [key]))
    }

    /// Adds the tenants `ids`, each with the one API key `key-ID`.
    pub fn add_tenants(self, ids: &[&str]) -> Conf {
        ids.iter()
            .fold(self, |c, id| c.add_tenant(id, &format!("key-{id}")))
    }

    /// Appends `entry` to the array of tables `array` (`tenants`, `upstreams`, `plans`…).
    pub fn push(mut self, array: &str, entry: Table) -> Conf {
        let slot = self
            .0
            .entry(array)
            .or_insert_with(|| Value::Array(Vec::new()));
        match slot {
            Value::Array(a) => a.push(Value::Table(entry)),
            other => panic!("`{array}` is not an array of tables: {other}"),
        }
        self
    }

    /// `[server] key = value`.
    pub fn server(self, key: &str, value: impl Val) -> Conf {
        self.set(&format!("server.{key}"), value)
    }

    /// Sets `key` on the first `[[upstreams]]` entry (the default config's only one, `mock`).
    pub fn upstream(mut self, key: &str, value: impl Val) -> Conf {
        let first = self.entries("upstreams").next().expect("an upstream");
        first.insert(key.to_owned(), value.val());
        self
    }

    /// Sets `key` on tenant `id`.
    pub fn tenant(mut self, id: &str, key: &str, value: impl Val) -> Conf {
        let tenant = self
            .entries("tenants")
            .find(|t| t.get("id").and_then(Value::as_str) == Some(id))
            .unwrap_or_else(|| panic!("no tenant {id}"));
        tenant.insert(key.to_owned(), value.val());
        self
    }

    /// Sets the dotted path `section.key` (or `section.sub.key`), creating tables as needed:
    /// `set("scheduler.quantum", 40)`, `set("otel.endpoint", url)`.
    pub fn set(mut self, path: &str, value: impl Val) -> Conf {
        let (tables, key) = path.rsplit_once('.').unwrap_or(("", path));
        let mut at = &mut self.0;
        for name in tables.split('.').filter(|n| !n.is_empty()) {
            let next = at.entry(name).or_insert_with(|| Value::Table(Table::new()));
            at = match next {
                Value::Table(t) => t,
                other => panic!("`{name}` in `{path}` is not a table: {other}"),
            };
        }
        at.insert(key.to_owned(), value.val());
        self
    }

    /// The TOML text (for `fairgate serve --config FILE`, or a reload).
    pub fn toml(&self) -> String {
        toml::to_string(&self.0).expect("a config serializes")
    }

    /// The parsed config (panics naming the bad key: the test built a wrong one).
    pub fn config(&self) -> Config {
        let text = self.toml();
        Config::from_toml_str(&text).unwrap_or_else(|e| panic!("invalid test config: {e}\n{text}"))
    }

    /// Starts fairgate with this config on 127.0.0.1:0.
    pub async fn start(&self) -> ServerHandle {
        proxy(&self.toml()).await
    }

    /// [`start`](Self::start) with its `*_env` settings read from `env` (no `set_var`).
    pub async fn start_with_env(&self, env: &[(&str, &str)]) -> ServerHandle {
        proxy_with_env(&self.toml(), env).await
    }

    /// The tables of the array `array`.
    fn entries<'a>(&'a mut self, array: &str) -> impl Iterator<Item = &'a mut Table> {
        match self.0.get_mut(array) {
            Some(Value::Array(a)) => a.iter_mut().filter_map(Value::as_table_mut),
            _ => panic!("the config has no `{array}`"),
        }
    }
}

/// A table entry (a tenant, an upstream, a plan) starting with `key = value`.
pub fn entry(key: &str, value: impl Val) -> Table {
    Table::new().with(key, value)
}

/// Adds keys to a [`Table`] fluently: `entry("id", "c").with("weight", 2.0)`.
pub trait With {
    /// `self` with `key = value`.
    fn with(self, key: &str, value: impl Val) -> Self;
}

impl With for Table {
    fn with(mut self, key: &str, value: impl Val) -> Table {
        self.insert(key.to_owned(), value.val());
        self
    }
}

//! The usage ledger in the embedded SQLite store (`[store] path`): one row per (tenant, day,
//! model), added to by each flush in one transaction (an upsert that adds, so a batch written
//! twice is never lost, and rows only ever grow). Every call runs on tokio's blocking pool.

use std::path::Path;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use rusqlite::{params, Connection, OptionalExtension};

use super::ledger::{Query, Row, RowKey, Sink, SinkError};
use crate::domain::Usd;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS usage_ledger (
    tenant TEXT NOT NULL,
    day TEXT NOT NULL,
    model TEXT NOT NULL,
    requests INTEGER NOT NULL,
    input_tokens INTEGER NOT NULL,
    cached_input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cost_picousd INTEGER NOT NULL,
    PRIMARY KEY (tenant, day, model)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS usage_ledger_day ON usage_ledger (day);
";

/// See the module docs.
#[derive(Clone)]
pub struct SqliteSink {
    conn: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for SqliteSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqliteSink")
    }
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn uint(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl SqliteSink {
    /// Opens (creating on first use) the ledger in `path`.
    pub fn open(path: &Path) -> Result<Self, String> {
        let open = || -> rusqlite::Result<Connection> {
            let conn = Connection::open(path)?;
            conn.busy_timeout(std::time::Duration::from_secs(5))?;
            let _: Option<String> = conn
                .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
                .optional()?;
            conn.execute_batch(SCHEMA)?;
            Ok(conn)
        };
        let conn = open().map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, SinkError>> {
        let conn = self.conn.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
                f(&mut c)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
        })
    }
}

impl Sink for SqliteSink {
    fn write(&self, rows: Vec<(RowKey, Row)>) -> BoxFuture<'_, Result<(), SinkError>> {
        self.blocking(move |c| {
            let tx = c.transaction()?;
            {
                let mut st = tx.prepare_cached(
                    "INSERT INTO usage_ledger (tenant, day, model, requests, input_tokens, \
                     cached_input_tokens, output_tokens, cost_picousd) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
                     ON CONFLICT (tenant, day, model) DO UPDATE SET \
                     requests = requests + excluded.requests, \
                     input_tokens = input_tokens + excluded.input_tokens, \
                     cached_input_tokens = cached_input_tokens + excluded.cached_input_tokens, \
                     output_tokens = output_tokens + excluded.output_tokens, \
                     cost_picousd = cost_picousd + excluded.cost_picousd",
                )?;
                for (k, r) in &rows {
                    st.execute(params![
                        k.tenant,
                        k.day,
                        k.model,
                        int(r.requests),
                        int(r.input_tokens),
                        int(r.cached_input_tokens),
                        int(r.output_tokens),
                        int(r.cost.0),
                    ])?;
                }
            }
            tx.commit()
        })
    }

    fn read(&self, q: Query) -> BoxFuture<'_, Result<Vec<(RowKey, Row)>, SinkError>> {
        self.blocking(move |c| {
            let mut st = c.prepare_cached(
                "SELECT tenant, day, model, requests, input_tokens, cached_input_tokens, \
                 output_tokens, cost_picousd FROM usage_ledger \
                 WHERE day >= ?1 AND day <= ?2 AND (?3 IS NULL OR tenant = ?3) \
                 ORDER BY tenant, day, model",
            )?;
            let rows = st.query_map(params![q.from, q.to, q.tenant], |r| {
                Ok((
                    RowKey {
                        tenant: r.get(0)?,
                        day: r.get(1)?,
                        model: r.get(2)?,
                    },
                    Row {
                        requests: uint(r.get(3)?),
                        input_tokens: uint(r.get(4)?),
                        cached_input_tokens: uint(r.get(5)?),
                        output_tokens: uint(r.get(6)?),
                        cost: Usd(uint(r.get(7)?)),
                    },
                ))
            })?;
            rows.collect()
        })
    }

    fn prune(&self, day: String) -> BoxFuture<'_, Result<u64, SinkError>> {
        self.blocking(move |c| {
            c.execute("DELETE FROM usage_ledger WHERE day < ?1", params![day])
                .map(|n| n as u64)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(t: &str, day: &str) -> RowKey {
        RowKey {
            tenant: t.to_owned(),
            day: day.to_owned(),
            model: "m".to_owned(),
        }
    }

    fn row(n: u64) -> Row {
        Row {
            requests: n,
            input_tokens: 10 * n,
            cached_input_tokens: n,
            output_tokens: 5 * n,
            cost: Usd(1_000 * n),
        }
    }

    #[tokio::test]
    async fn rows_add_up_across_flushes_and_reopens_and_old_days_are_pruned() {
        let dir = std::env::temp_dir().join(format!("fg-ledger-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("store.sqlite");
        let s = SqliteSink::open(&path).unwrap();
        s.write(vec![
            (key("a", "2026-12-01"), row(1)),
            (key("b", "2026-12-02"), row(2)),
        ])
        .await
        .unwrap();
        s.write(vec![(key("a", "2026-12-01"), row(3))])
            .await
            .unwrap();
        drop(s);
        let s = SqliteSink::open(&path).unwrap();
        let all = Query {
            tenant: None,
            from: "2026-01-01".into(),
            to: "2026-12-31".into(),
        };
        let rows = s.read(all.clone()).await.unwrap();
        assert_eq!(
            rows,
            vec![
                (key("a", "2026-12-01"), row(4)),
                (key("b", "2026-12-02"), row(2))
            ]
        );
        let b = Query {
            tenant: Some("b".into()),
            ..all.clone()
        };
        assert_eq!(s.read(b).await.unwrap().len(), 1);
        let day = Query {
            from: "2026-12-02".into(),
            ..all.clone()
        };
        assert_eq!(s.read(day).await.unwrap()[0].0.tenant, "b");
        assert_eq!(s.prune("2026-12-02".into()).await.unwrap(), 1);
        assert_eq!(s.read(all).await.unwrap().len(), 1);
        let _ = std::fs::remove_dir_all(dir);
    }
}

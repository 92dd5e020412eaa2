//! `GET /admin/usage?tenant=ID&from=YYYY-MM-DD&to=YYYY-MM-DD`: the bill, from the usage ledger
//! (rows written and those still pending, added up): `{"object":"list","data":[{"tenant",
//! "day","model","requests","input_tokens","cached_input_tokens","output_tokens",
//! "cost_usd"}]}`, or CSV with `Accept: text/csv`. `tenant` absent: every tenant; `from`
//! absent: the first of this month; `to` absent: today (days in `[store] timezone`).

use std::fmt::Write as _;
use std::sync::Arc;

use http::{header, HeaderValue, Response, StatusCode};

use crate::budget::ledger::{Query, Row, RowKey};
use crate::budget::window::{date_of, day_string, parse_day, window};
use crate::budget::Spending;
use crate::domain::Period;
use crate::error::{ApiError, Error, Reason};
use crate::response::ResponseBody;

/// A usage query the ledger cannot answer.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// A day that is not `YYYY-MM-DD`.
    #[error("{0} must be a date YYYY-MM-DD")]
    BadDay(&'static str),
    /// The ledger's store did not answer.
    #[error("the usage ledger cannot be read: {0}")]
    Store(String),
}

impl ApiError for UsageError {
    fn status(&self) -> StatusCode {
        match self {
            UsageError::BadDay(_) => StatusCode::BAD_REQUEST,
            UsageError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            UsageError::BadDay(_) => "invalid_request_error",
            UsageError::Store(_) => "server_error",
        }
    }
    fn code(&self) -> &'static str {
        match self {
            UsageError::BadDay(_) => "invalid_date",
            UsageError::Store(_) => "store_unavailable",
        }
    }
    fn param(&self) -> Option<&str> {
        match self {
            UsageError::BadDay(p) => Some(p),
            UsageError::Store(_) => None,
        }
    }
    fn reason(&self) -> Reason {
        Reason::Admin
    }
}

/// The ledger query of a request's query string.
fn query(spending: &Spending, q: Option<&str>) -> Result<Query, UsageError> {
    let now = spending.now();
    let zone = spending.zone();
    let mut out = Query {
        tenant: None,
        from: day_string(date_of(zone, window(zone, Period::Month, now).start)),
        to: day_string(date_of(zone, now)),
    };
    for (k, v) in form_urlencoded::parse(q.unwrap_or("").as_bytes()) {
        match &*k {
            "tenant" if !v.is_empty() => out.tenant = Some(v.into_owned()),
            "from" => out.from = day_string(parse_day(&v).ok_or(UsageError::BadDay("from"))?),
            "to" => out.to = day_string(parse_day(&v).ok_or(UsageError::BadDay("to"))?),
            _ => {}
        }
    }
    Ok(out)
}

fn json(rows: &[(RowKey, Row)]) -> Vec<u8> {
    let data: Vec<_> = rows
        .iter()
        .map(|(k, r)| {
            serde_json::json!({
                "tenant": k.tenant,
                "day": k.day,
                "model": k.model,
                "requests": r.requests,
                "input_tokens": r.input_tokens,
                "cached_input_tokens": r.cached_input_tokens,
                "output_tokens": r.output_tokens,
                "cost_usd": r.cost.dollars(),
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({ "object": "list", "data": data })).unwrap_or_default()
}

/// A CSV field: quoted when it holds a comma, quote or line break.
fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

fn csv(rows: &[(RowKey, Row)]) -> Vec<u8> {
    let mut out = String::from(
        "tenant,day,model,requests,input_tokens,cached_input_tokens,output_tokens,cost_usd\n",
    );
    for (k, r) in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{}",
            field(&k.tenant),
            k.day,
            field(&k.model),
            r.requests,
            r.input_tokens,
            r.cached_input_tokens,
            r.output_tokens,
            r.cost
        );
    }
    out.into_bytes()
}

/// Answers `GET /admin/usage`.
pub async fn answer(
    spending: Arc<Spending>,
    q: Option<String>,
    as_csv: bool,
) -> Result<Response<ResponseBody>, Error> {
    let query = query(&spending, q.as_deref())?;
    let rows = spending.usage(query).await.map_err(UsageError::Store)?;
    let mut res = if as_csv {
        let mut res = Response::new(ResponseBody::full(csv(&rows)));
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/csv; charset=utf-8"),
        );
        res
    } else {
        crate::response::json_bytes(StatusCode::OK, json(&rows))
    };
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Usd;

    #[test]
    fn the_query_defaults_to_this_month_and_refuses_bad_days() {
        let s = Spending::in_memory();
        let q = query(&s, None).unwrap();
        assert!(q.from.ends_with("-01") && q.from <= q.to && q.tenant.is_none());
        let q = query(&s, Some("tenant=acme&from=2026-11-01&to=2026-11-30")).unwrap();
        assert_eq!(
            (q.tenant.as_deref(), &*q.from, &*q.to),
            (Some("acme"), "2026-11-01", "2026-11-30")
        );
        assert!(matches!(
            query(&s, Some("from=11/01/2026")),
            Err(UsageError::BadDay("from"))
        ));
    }

    #[test]
    fn csv_quotes_what_needs_it() {
        let k = RowKey {
            tenant: "a,b".into(),
            day: "2026-12-02".into(),
            model: "m".into(),
        };
        let r = Row {
            requests: 2,
            input_tokens: 10,
            cached_input_tokens: 4,
            output_tokens: 5,
            cost: Usd::from_dollars(0.5),
        };
        let text = String::from_utf8(csv(&[(k, r)])).unwrap();
        assert_eq!(
            text.lines().nth(1),
            Some("\"a,b\",2026-12-02,m,2,10,4,5,0.500000")
        );
    }
}

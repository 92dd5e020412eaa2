//! Scrape-time budget families: `fairgate_budget_remaining{tenant,period,unit}` (tokens, or
//! USD) for the `top_tenants` budgeted tenants with the least left (by fraction of a budget),
//! `fairgate_budget_warnings_total{tenant,period,unit}` (soft thresholds passed) and
//! `fairgate_usage_ledger_pending_rows` (ledger rows waiting for the next flush). Written as
//! text, not registered: a tenant that drops out of the top stops being exported.

use std::fmt::Write as _;

use crate::budget::{Budgets, Unit};
use crate::domain::Usd;

/// The families' text.
pub fn render(budgets: &Budgets, top: usize, escape: impl Fn(&str) -> String) -> String {
    let spending = budgets.spending();
    let mut rows = Vec::new();
    for (tenant, limits) in budgets.budgeted() {
        let left = spending.left(tenant, limits);
        let least = limits
            .iter()
            .zip(&left)
            .map(|(l, &v)| v as f64 / l.amount.max(1) as f64)
            .fold(f64::INFINITY, f64::min);
        rows.push((least, tenant, limits, left));
    }
    rows.sort_by(|a, b| {
        a.0.total_cmp(&b.0)
            .then_with(|| a.1.as_str().cmp(b.1.as_str()))
    });
    rows.truncate(top);
    let mut out = String::from(
        "# HELP fairgate_budget_remaining What is left of a tenant's budget in its current period \
         (tokens, or USD; the top tenants by least left).\n\
         # TYPE fairgate_budget_remaining gauge\n",
    );
    for (_, tenant, limits, left) in &rows {
        for (l, &v) in limits.iter().zip(left) {
            let value = match l.unit {
                Unit::Tokens => v as f64,
                Unit::Usd => Usd(v).dollars(),
            };
            let _ = writeln!(
                out,
                "fairgate_budget_remaining{{tenant=\"{}\",period=\"{}\",unit=\"{}\"}} {value}",
                escape(tenant.as_str()),
                l.period.name(),
                l.unit.name()
            );
        }
    }
    out.push_str(
        "\n# HELP fairgate_budget_warnings_total Budget warning thresholds (warn_at) passed.\n\
         # TYPE fairgate_budget_warnings_total counter\n",
    );
    let mut warnings = spending.warnings();
    warnings.sort_by(|a, b| a.0 .0.as_str().cmp(b.0 .0.as_str()));
    for ((tenant, period, unit), n) in warnings {
        let _ = writeln!(
            out,
            "fairgate_budget_warnings_total{{tenant=\"{}\",period=\"{}\",unit=\"{}\"}} {n}",
            escape(tenant.as_str()),
            period.name(),
            unit.name()
        );
    }
    let _ = writeln!(
        out,
        "\n# HELP fairgate_usage_ledger_pending_rows Usage ledger rows waiting for the next flush.\n\
         # TYPE fairgate_usage_ledger_pending_rows gauge\n\
         fairgate_usage_ledger_pending_rows {}\n",
        spending.pending_rows()
    );
    out
}

//! The jobs subsystem's series (`crate::jobs::Meter`): `fairgate_jobs{tenant,state}`,
//! `fairgate_batch_lines_total{tenant,outcome}`, `fairgate_jobs_oldest_queued_seconds` and
//! `fairgate_jobs_late_total{tenant}` (answers discarded because the lease was lost).
//! The per-tenant label is the one every per-tenant series uses (`tenant`, the id, or `plan`,
//! its cohort, without `per_tenant_labels`); an id not configured (a tenant removed since) is
//! `other`, so the label set stays bounded by the config.

use metrics::{Key, Label, Recorder, SharedString};

use super::{Metrics, META};
use crate::domain::TenantId;
use crate::jobs::store::JobState;

impl Metrics {
    fn jobs_label(&self, tenant: &TenantId) -> SharedString {
        self.tenants
            .get(tenant)
            .and_then(|e| self.labels.get(e.label).cloned())
            .unwrap_or_else(|| SharedString::const_str("other"))
    }
}

impl crate::jobs::Meter for Metrics {
    fn jobs(&self, counts: &[(String, JobState, u64)]) {
        let mut sums: std::collections::HashMap<(SharedString, &'static str), u64> =
            std::collections::HashMap::new();
        for label in self
            .labels
            .iter()
            .cloned()
            .chain([SharedString::const_str("other")])
        {
            for s in JobState::ALL {
                sums.insert((label.clone(), s.as_str()), 0);
            }
        }
        for (tenant, st, n) in counts {
            let label = self.jobs_label(&TenantId::new(tenant.as_str()));
            if let Some(v) = sums.get_mut(&(label, st.as_str())) {
                *v += n;
            }
        }
        for ((label, st), n) in sums {
            let key = Key::from_parts(
                "fairgate_jobs",
                vec![
                    Label::new(self.label_key, label),
                    Label::new("state", SharedString::const_str(st)),
                ],
            );
            self.recorder.register_gauge(&key, &META).set(n as f64);
        }
    }

    fn line(&self, tenant: &TenantId, outcome: &'static str) {
        let key = Key::from_parts(
            "fairgate_batch_lines_total",
            vec![
                Label::new(self.label_key, self.jobs_label(tenant)),
                Label::new("outcome", SharedString::const_str(outcome)),
            ],
        );
        self.recorder.register_counter(&key, &META).increment(1);
    }

    fn late(&self, tenant: &TenantId) {
        let key = Key::from_parts(
            "fairgate_jobs_late_total",
            vec![Label::new(self.label_key, self.jobs_label(tenant))],
        );
        self.recorder.register_counter(&key, &META).increment(1);
    }

    fn oldest(&self, seconds: u64) {
        self.recorder
            .register_gauge(
                &Key::from_name("fairgate_jobs_oldest_queued_seconds"),
                &META,
            )
            .set(seconds as f64);
    }
}

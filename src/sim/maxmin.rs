//! Max-min fair entitlement per window: in each window of the run, the tokens served are divided
//! among the tenants by weighted water-filling over their demand (what they were served plus
//! what they still had queued at the window's end): a tenant that asked for less than its
//! weighted share is entitled to what it asked, the others split the rest by weight. This is the
//! share a light tenant served at once is entitled to (the per-dispatch entitlement of
//! `report.rs` counts only the instants it was queued, and so shows it as over-served).
//!
//! Invariant: the entitlements of a window sum to its served tokens (up to rounding) whenever
//! the demands do not fall short of it.

/// Weighted max-min division of `capacity` among `demands` (with `weights` > 0).
pub fn water_fill(capacity: f64, demands: &[f64], weights: &[f64]) -> Vec<f64> {
    let mut out = vec![0.0; demands.len()];
    let mut open: Vec<usize> = (0..demands.len()).filter(|&i| demands[i] > 0.0).collect();
    let mut left = capacity;
    while !open.is_empty() && left > 0.0 {
        let w: f64 = open.iter().map(|&i| weights[i]).sum();
        let satisfied: Vec<usize> = open
            .iter()
            .copied()
            .filter(|&i| demands[i] - out[i] <= left * weights[i] / w)
            .collect();
        if satisfied.is_empty() {
            for &i in &open {
                out[i] += left * weights[i] / w;
            }
            break;
        }
        for &i in &satisfied {
            left -= demands[i] - out[i];
            out[i] = demands[i];
        }
        open.retain(|i| !satisfied.contains(i));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn light_demands_are_met_and_the_rest_is_split_by_weight() {
        let e = water_fill(100.0, &[10.0, 1000.0, 1000.0], &[1.0, 1.0, 3.0]);
        assert_eq!(e[0], 10.0);
        assert!(
            (e[1] - 22.5).abs() < 1e-9 && (e[2] - 67.5).abs() < 1e-9,
            "{e:?}"
        );
        assert_eq!(water_fill(10.0, &[0.0, 5.0], &[1.0, 1.0]), vec![0.0, 5.0]);
    }
}

//! Chooses the default DRR quantum: every design scenario through the simulator (the real
//! scheduler on a virtual clock) at quanta from 256 to 16384 tokens, one row per quantum.
//!
//!     cargo run --release --example quantum_sweep
//!
//! Columns: the light tenants of issue 23 (a sequential agent with short and with 8k-token
//! requests, an interactive user, each beside a flood: DRR ÷ the limit, p95 wait in ms), the
//! noisy neighbour's small tenants and the non-reading client's quiet tenants (longest wait, s),
//! and the worst share error (|served ÷ entitled − 1|) of the weights, cost-variance,
//! chronic-underestimate and idle-return scenarios.

use std::path::Path;

use fairgate::scheduler::Policy;
use fairgate::sim::{compare, run, Scenario};

fn load(name: &str, quantum: u64) -> Scenario {
    let path = format!("{}/scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let mut s = Scenario::load(Path::new(&path)).expect("a bundled scenario");
    s.pool.quantum = quantum;
    s
}

fn main() {
    println!(
        "| quantum | agent ÷ limit | agent p95 ms | 8k agent ÷ limit | 8k agent p95 ms | user p95 ms | noisy small max s | non-reading quiet max s | worst share error |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for q in [256u64, 512, 1024, 2048, 4096, 8192, 16384] {
        let light = |name: &str| {
            let c = compare(&load(name, q)).remove(0);
            (c.drr.per_s / c.limit.per_s, c.drr.wait_p95_s * 1000.0)
        };
        let (a, a95) = light("sequential-agent");
        let (b, b95) = light("sequential-agent-8k");
        let (_, u95) = light("interactive-user");
        let max_wait = |name: &str, row: &str| {
            run(&load(name, q), Policy::Drr)
                .row(row)
                .map_or(f64::NAN, |r| r.wait_max_s)
        };
        let noisy = max_wait("noisy-neighbor", "small");
        let quiet = max_wait("non-reading-client", "quiet");
        let err = [
            "weights",
            "cost-variance",
            "chronic-underestimate",
            "idle-return",
        ]
        .iter()
        .flat_map(|name| run(&load(name, q), Policy::Drr).tenants)
        .filter(|r| r.entitled_share > 0.0)
        .map(|r| (r.share_ratio - 1.0).abs())
        .fold(0.0, f64::max);
        println!(
            "| {q} | {a:.2} | {a95:.0} | {b:.2} | {b95:.0} | {u95:.0} | {noisy:.1} | {quiet:.1} | {err:.3} |"
        );
    }
}

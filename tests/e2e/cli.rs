//! The binary's own subcommands: `simulate` prints the scenario's report for both policies, and
//! `demo` (time-compressed) shows DRR's small tenants waiting far less than FIFO's.

use std::process::Command;

use fairgate::demo::{self, DemoArgs};

use crate::support::Conf;

#[test]
fn simulate_prints_both_policies_as_json() {
    let out = Command::new(env!("CARGO_BIN_EXE_fairgate"))
        .args(["simulate", "scenarios/noisy-neighbor.toml", "--json"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reports: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[0]["policy"], "fifo");
    assert_eq!(reports[1]["policy"], "drr");
    let small_max = |r: &serde_json::Value| r["tenants"][1]["wait_max_s"].as_f64().unwrap();
    assert!(small_max(&reports[1]) * 10.0 < small_max(&reports[0]));
}

#[test]
fn simulate_rejects_a_bad_file_naming_the_key() {
    let dir = std::env::temp_dir().join(format!("fg-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, "name='x'\nduration_s=1\nwat=2\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fairgate"))
        .args(["simulate", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("wat"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_shows_small_tenants_served_promptly_under_drr_only() {
    let chart = std::env::temp_dir().join(format!("fg-demo-{}.svg", std::process::id()));
    let args = DemoArgs {
        chart: chart.clone(),
        time_scale: 0.3,
        console_token: None,
    };
    let (fifo, drr) = demo::run(&args).await.unwrap();
    let (n, _, _, _, errors) = demo::summary(&drr, true);
    assert_eq!((n, errors), (20, 0));
    let (_, fifo_p50, _, _, _) = demo::summary(&fifo, true);
    let (_, _, drr_p95, _, _) = demo::summary(&drr, true);
    assert!(
        drr_p95 * 3.0 < fifo_p50,
        "drr p95 {drr_p95} vs fifo p50 {fifo_p50}"
    );
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert_eq!(svg.matches("<circle").count(), fifo.len() + drr.len());
    let _ = std::fs::remove_file(chart);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_agent_scene_shows_drr_serving_the_agent_at_the_next_free_slot() {
    let [alone, fifo, drr] = demo::agent_scene(0.5, "tok").await.unwrap();
    println!("{}", demo::agent::table(alone, fifo, drr));
    assert!(alone.per_s > 0.0 && fifo.per_s > 0.0, "{alone:?} {fifo:?}");
    // FIFO queues it behind the flood's 24 loops; DRR serves it at the next free slot.
    assert!(drr.per_s >= 2.5 * fifo.per_s, "drr {drr:?} fifo {fifo:?}");
    assert!(
        drr.wait_p95_s < fifo.wait_p95_s / 2.0,
        "drr {drr:?} fifo {fifo:?}"
    );
}

#[test]
fn demo_prints_the_console_url_of_each_run() {
    let chart = std::env::temp_dir().join(format!("fg-demo-url-{}.svg", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fairgate"))
        .args([
            "demo",
            "--time-scale",
            "0.05",
            "--console-token",
            "tok-demo",
        ])
        .arg("--chart")
        .arg(&chart)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let urls: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_once("watch it live: ").map(|(_, u)| u))
        .collect();
    assert_eq!(urls.len(), 2, "{stdout}");
    assert!(
        stdout.contains("sequential agent beside a flood"),
        "{stdout}"
    );
    assert!(stdout.contains("beside the flood, DRR"), "{stdout}");
    for u in urls {
        assert!(u.starts_with("http://127.0.0.1:"), "{u}");
        assert!(u.ends_with("/admin/ui#token=tok-demo"), "{u}");
    }
    let _ = std::fs::remove_file(chart);
}

#[test]
fn check_loads_the_upstream_tls_files_serve_would_load() {
    let dir = std::env::temp_dir().join(format!("fg-check-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tls.toml");
    let write = |ca: &str| {
        let conf = Conf::bare()
            .add_upstream("u", "https://127.0.0.1:9/v1")
            .upstream("ca_file", ca);
        std::fs::write(&path, conf.toml()).unwrap()
    };
    let check = || {
        Command::new(env!("CARGO_BIN_EXE_fairgate"))
            .args(["check", "--config", path.to_str().unwrap()])
            .output()
            .unwrap()
    };
    write("/nonexistent/ca.pem");
    let out = check();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("upstreams[0].ca_file"), "{err}");
    write(&format!(
        "{}/tests/fixtures/localhost.crt",
        env!("CARGO_MANIFEST_DIR")
    ));
    let out = check();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

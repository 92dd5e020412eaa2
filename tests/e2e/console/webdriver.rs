//! A minimal W3C WebDriver client over hyper (a handful of JSON requests to `chromedriver`):
//! no WebDriver crate, so no second HTTP or TLS stack in the dev-dependencies.
//!
//! Finding the browser: `chromium` and `chromedriver` on PATH (Debian: `apt-get install chromium
//! chromium-driver`, done by `scripts/test` as root). Missing, the test fails naming the packages, unless the
//! developer opted out with `FAIRGATE_SKIP_BROWSER=1` ([`Driver::start`] then returns `None`).

use std::net::TcpListener as StdListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

/// The W3C key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn on_path(bin: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(bin))
        .find(|p| p.is_file())
}

/// A running chromedriver and one headless chromium session; both end on drop.
pub struct Driver {
    child: Child,
    base: String,
    session: String,
    _profile: TempDir,
}

/// A directory removed on drop (the browser's fresh profile).
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Driver {
    /// Starts chromedriver and a headless chromium session; `None` only when they are missing
    /// and `FAIRGATE_SKIP_BROWSER=1`.
    pub async fn start() -> Option<Driver> {
        let (Some(chromium), Some(chromedriver)) = (
            on_path("chromium").or_else(|| on_path("chromium-browser")),
            on_path("chromedriver"),
        ) else {
            crate::support::needs::BROWSER.missing();
            return None;
        };
        let port = StdListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let profile = TempDir(std::env::temp_dir().join(format!(
            "fairgate-console-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        )));
        let mut driver = Driver {
            child,
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            _profile: profile,
        };
        let mut ready = false;
        for _ in 0..100 {
            if let Ok(v) = driver.try_call(Method::GET, "/status", None).await {
                if v["value"]["ready"] == true {
                    ready = true;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ready, "chromedriver did not become ready");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                    "--window-size=1500,1000",
                    format!("--user-data-dir={}", driver._profile.0.display()),
                ],
            },
        }}});
        let v = driver.call(Method::POST, "/session", Some(caps)).await;
        driver.session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"))
            .to_owned();
        Some(driver)
    }

    async fn try_call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let fut = async {
            let res = crate::support::client()
                .request(req)
                .await
                .map_err(|e| e.to_string())?;
            let bytes = res
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            serde_json::from_slice::<Value>(&bytes).map_err(|e| e.to_string())
        };
        tokio::time::timeout(Duration::from_secs(60), fut)
            .await
            .map_err(|_| "webdriver call timed out".to_owned())?
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let v = self
            .try_call(method, path, body)
            .await
            .unwrap_or_else(|e| panic!("webdriver {path}: {e}"));
        if let Some(err) = v["value"].get("error") {
            panic!("webdriver {path}: {err} {}", v["value"]["message"]);
        }
        v
    }

    fn path(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    /// Navigates to `url`.
    pub async fn goto(&self, url: &str) {
        self.call(
            Method::POST,
            &self.path("/url"),
            Some(json!({ "url": url })),
        )
        .await;
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page: its return value.
    pub async fn eval(&self, script: &str, args: Value) -> Value {
        let body = json!({ "script": script, "args": args });
        self.call(Method::POST, &self.path("/execute/sync"), Some(body))
            .await["value"]
            .take()
    }

    /// The reference of the element matching `css`.
    async fn find(&self, css: &str) -> String {
        let body = json!({ "using": "css selector", "value": css });
        let v = self
            .call(Method::POST, &self.path("/element"), Some(body))
            .await;
        v["value"][ELEMENT].as_str().unwrap().to_owned()
    }

    /// Types `text` into the element matching `css`, as a user would.
    pub async fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css).await;
        let path = self.path(&format!("/element/{e}/value"));
        self.call(Method::POST, &path, Some(json!({ "text": text })))
            .await;
    }

    /// Clicks the element matching `css`.
    pub async fn click(&self, css: &str) {
        let e = self.find(css).await;
        let path = self.path(&format!("/element/{e}/click"));
        self.call(Method::POST, &path, Some(json!({}))).await;
    }

    /// A PNG screenshot of the window.
    pub async fn screenshot(&self) -> Vec<u8> {
        let v = self
            .call(Method::GET, &self.path("/screenshot"), None)
            .await;
        base64_decode(v["value"].as_str().unwrap())
    }

    /// Ends the session (and its browser), then chromedriver.
    pub async fn quit(self) {
        let _ = self.try_call(Method::DELETE, &self.path(""), None).await;
    }

    /// Polls `script` every 100 ms, at most `tries` times, until it returns `true`.
    pub async fn wait_for(&self, script: &str, tries: usize) -> bool {
        for _ in 0..tries {
            if self.eval(script, json!([])).await == true {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Ending chromedriver ends its browser.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Standard base64 (the screenshot's encoding), decoded without a crate.
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in s.bytes().filter_map(val) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

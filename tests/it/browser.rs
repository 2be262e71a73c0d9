//! Headless Chromium for tests, driven over WebDriver by a chromedriver
//! child process; screenshots go to `target/artifacts/`.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use crate::helpers::{lines_of, wait_until};

/// A chromedriver child process and one headless Chromium session.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    client: awc::Client,
}

impl Browser {
    pub async fn start() -> Self {
        let mut driver = Command::new("chromedriver")
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver must be installed (Debian: chromium chromium-driver; .ci/run installs them)");
        let printed = lines_of(driver.stdout.take().unwrap());
        let port = loop {
            let line = printed
                .recv_timeout(Duration::from_secs(20))
                .expect("chromedriver says which port it started on");
            if let Some(port) = line
                .strip_prefix("ChromeDriver was started successfully on port ")
                .and_then(|rest| rest.trim_end_matches('.').parse::<u16>().ok())
            {
                break port;
            }
        };
        let base = format!("http://127.0.0.1:{port}");
        let client = awc::Client::builder()
            .timeout(Duration::from_secs(60))
            .finish();
        wait_until("chromedriver to answer", Duration::from_secs(20), || {
            let request = client.get(format!("{base}/status"));
            async move { request.send().await.is_ok() }
        })
        .await;
        let mut browser = Self {
            driver,
            base,
            session: String::new(),
            client,
        };
        let session = browser
            .call(
                "POST",
                "/session",
                json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": "/usr/bin/chromium",
                        "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"]
                    }
                }}}),
            )
            .await;
        browser.session = session["sessionId"]
            .as_str()
            .expect("a session")
            .to_string();
        browser
    }

    pub async fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.base);
        let request = match method {
            "GET" => self.client.get(url),
            "DELETE" => self.client.delete(url),
            _ => self.client.post(url),
        };
        let mut response = if method == "POST" {
            request.send_json(&body).await
        } else {
            request.send().await
        }
        .expect("chromedriver answers");
        let answer: Value = response
            .json()
            .limit(64 * 1024 * 1024)
            .await
            .expect("WebDriver JSON");
        answer["value"].clone()
    }

    pub async fn session_call(&self, method: &str, path: &str, body: Value) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
            .await
    }

    pub async fn open(&self, url: &str) {
        self.session_call("POST", "/url", json!({ "url": url }))
            .await;
    }

    pub async fn run(&self, script: &str) -> Value {
        self.session_call(
            "POST",
            "/execute/sync",
            json!({"script": script, "args": []}),
        )
        .await
    }

    pub async fn screenshot(&self, name: &str) {
        let png = self.session_call("GET", "/screenshot", Value::Null).await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("a PNG"))
            .expect("base64 PNG");
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/artifacts");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }

    pub async fn resize(&self, width: u32, height: u32) {
        self.session_call(
            "POST",
            "/window/rect",
            json!({"width": width, "height": height}),
        )
        .await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

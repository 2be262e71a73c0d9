//! `leadrouter verify-release` against a running `leadrouter demo` (both
//! real child processes): every step passes while the demo's manager inbox
//! confirms, and the run fails naming the notify step when the inbox
//! answers 500.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::helpers::{lines_of, wait_until};

/// `leadrouter demo` in a directory of its own, on the port it was given
/// (port 0), read from its banner.
struct Demo {
    child: Child,
    base: String,
    inbox: String,
    _dir: tempfile::TempDir,
}

impl Demo {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_leadrouter"))
            .arg("demo")
            .current_dir(dir.path())
            .env("LEADROUTER_LISTEN", "127.0.0.1:0")
            .env("RUST_LOG", "warn")
            .env_remove("DATABASE_URL")
            .env_remove("LEADROUTER_ADMIN_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("leadrouter demo starts");
        let banner = lines_of(child.stdout.take().unwrap());
        let mut base = None;
        let mut inbox = None;
        let mut printed = Vec::new();
        // The banner is the last thing the demo prints; its last line is
        // the release check.
        loop {
            let line = banner
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("no demo banner; printed: {printed:?}"));
            if let Some(form) = line.trim().strip_prefix("demo form:") {
                base = form.trim().strip_suffix("/demo").map(str::to_string);
            }
            if let Some(url) = line.trim().strip_prefix("manager inbox: ") {
                inbox = url
                    .split_whitespace()
                    .next()
                    .map(|url| url.trim_end_matches('/').to_string());
            }
            let done = line.trim_start().starts_with("release check:");
            printed.push(line);
            if done {
                break;
            }
        }
        Self {
            child,
            base: base.expect("the banner names the demo form"),
            inbox: inbox.expect("the banner names the manager inbox"),
            _dir: dir,
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs verify-release; (success, what it printed).
fn verify_release(demo: &Demo, wait: &str) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_leadrouter"))
        .args(["verify-release", "--url", &demo.base, "--source", "website"])
        .args(["--wait", wait])
        .env("LEADROUTER_ADMIN_TOKEN", "demo-admin-token")
        .env("RUST_LOG", "warn")
        .output()
        .expect("verify-release runs");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), printed)
}

#[actix_web::test]
async fn verify_release_passes_against_the_demo_and_names_the_step_that_fails() {
    let demo = Demo::start();
    let (passed, printed) = verify_release(&demo, "20s");
    assert!(passed, "{printed}");
    for step in [
        "✓ 1. submit a test lead",
        "✓ 2. the stored record",
        "✓ 3. notify deliveries",
        "✓ 4. attribution and consent",
        "✓ 5. replay",
        "✓ 6. nothing delivered twice",
    ] {
        assert!(printed.contains(step), "{step} missing from:\n{printed}");
    }

    // Stop the inbox from its page (a redirect back to it, followed): it
    // answers 500 from now on.
    let client = awc::Client::default();
    let stopped = client
        .post(format!("{}/toggle", demo.inbox))
        .send()
        .await
        .unwrap();
    assert!(stopped.status().is_success(), "{}", stopped.status());
    wait_until(
        "the inbox to say it is stopped",
        Duration::from_secs(10),
        || async {
            let mut page = client.get(format!("{}/", demo.inbox)).send().await.unwrap();
            String::from_utf8_lossy(&page.body().await.unwrap()).contains("answering 500")
        },
    )
    .await;

    let (passed, printed) = verify_release(&demo, "3s");
    assert!(!passed, "{printed}");
    assert!(printed.contains("✓ 2. the stored record"), "{printed}");
    assert!(
        printed.contains("✗ 3. notify deliveries") && printed.contains("HTTP 500"),
        "{printed}"
    );
    assert!(
        printed.contains("verify-release failed at step 3 (notify deliveries)"),
        "{printed}"
    );
    assert!(
        !printed.contains("✓ 5."),
        "stops at the failed step: {printed}"
    );
}

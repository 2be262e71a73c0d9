//! `leadrouter check-config` as an operator runs it: the real binary.

use std::process::Command;

fn check_config(text: &str, env: &[(&str, &str)]) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leadrouter.toml");
    std::fs::write(&path, text).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_leadrouter"))
        .args(["check-config", "--config"])
        .arg(&path)
        .env_remove("DATABASE_URL")
        .env_remove("LEADROUTER_ADMIN_TOKEN")
        .env_remove("LEADROUTER_LISTEN")
        .env_remove("LEADROUTER_LOG_FORMAT")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn unknown_keys_and_bad_durations_are_rejected_with_their_key_paths() {
    let (ok, _, stderr) = check_config(
        r#"
        [server]
        listen = "127.0.0.1:8080"
        admin_tokn = "oops"
        [routing]
        lease = "two minutes"
        [[sources]]
        id = "partner"
        kind = "feed"
        [[buyers]]
        id = "acme"
        [buyers.post]
        url = "http://127.0.0.1:9001/post"
        timeout = "25"
        [buyers.circuit]
        open_for = "30x"
        "#,
        &[],
    );
    assert!(!ok, "check-config must exit non-zero");
    for expected in [
        "server.admin_tokn",
        "routing.lease",
        "buyers[0].post.timeout",
        "buyers[0].circuit.open_for",
        "sources[0].api_key: a feed needs an api_key",
    ] {
        assert!(
            stderr.contains(expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
}

#[test]
fn a_missing_variable_is_reported_and_a_set_one_passes() {
    let text = "[server]\nadmin_token = \"${SOME_ADMIN_TOKEN}\"\n";
    let (ok, _, stderr) = check_config(text, &[]);
    assert!(!ok);
    assert!(
        stderr.contains("server.admin_token: environment variable SOME_ADMIN_TOKEN is not set"),
        "{stderr}"
    );
    let (ok, stdout, _) = check_config(text, &[("SOME_ADMIN_TOKEN", "s3cret-value")]);
    assert!(ok);
    assert!(stdout.contains("configuration OK"), "{stdout}");
    assert!(
        !stdout.contains("s3cret-value"),
        "secrets never printed: {stdout}"
    );
}

#[test]
fn a_log_format_other_than_text_or_json_is_rejected_with_its_key_path() {
    let (ok, _, stderr) = check_config("[log]\nformat = \"xml\"\n", &[]);
    assert!(!ok, "check-config must exit non-zero");
    assert!(
        stderr.contains("log.format: unknown variant `xml`, expected `text` or `json`"),
        "{stderr}"
    );
    let (ok, _, stderr) = check_config("", &[("LEADROUTER_LOG_FORMAT", "yaml")]);
    assert!(!ok, "the environment's override is checked too");
    assert!(
        stderr.contains("log.format: unknown variant `yaml`"),
        "{stderr}"
    );
    for format in ["text", "json"] {
        let (ok, stdout, stderr) = check_config(&format!("[log]\nformat = \"{format}\"\n"), &[]);
        assert!(ok, "{format}: {stdout}{stderr}");
    }
}

#[test]
fn the_shipped_configurations_are_valid() {
    let root = env!("CARGO_MANIFEST_DIR");
    for (file, env) in [
        ("config/leadrouter.toml", vec![]),
        ("config/demo.toml", vec![]),
        (
            "config/example.toml",
            vec![
                ("PARTNER_KEY", "k"),
                ("ACME_TOKEN", "t"),
                ("LEADROUTER_ADMIN_TOKEN", "a"),
            ],
        ),
    ] {
        let text = std::fs::read_to_string(format!("{root}/{file}")).unwrap();
        let (ok, stdout, stderr) = check_config(&text, &env);
        assert!(ok, "{file}: {stdout}{stderr}");
    }
}

#[test]
fn a_ping_template_that_names_a_pii_field_is_rejected() {
    let (ok, _, stderr) = check_config(
        r#"
        [[buyers]]
        id = "acme"
        [buyers.ping]
        url = "http://127.0.0.1:9001/ping"
        body_template = '{"zip": "{{fields.zip}}", "mail": "{{ fields.email }}"}'
        [buyers.post]
        url = "http://127.0.0.1:9001/post"
        body_template = '{"mail": "{{fields.email}}"}'
        "#,
        &[],
    );
    assert!(!ok);
    assert!(
        stderr.contains("buyers[0].ping.body_template: names \"email\""),
        "{stderr}"
    );
    assert!(
        !stderr.contains("post.body_template"),
        "posts may carry it: {stderr}"
    );
    assert!(!stderr.contains("\"zip\""), "{stderr}");
}

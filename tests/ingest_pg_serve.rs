//! `bounded-ingest` selecting PostgreSQL from `--db postgres://…` / `BOUNDED_INGEST_DB`, against
//! a real server (tests/pg_support): it stores there and writes no SQLite file; it never prints
//! the password (not with `--debug`, not in an error); a replica given no shared secret refuses
//! to start before touching the database; a database failure is reported with the server's
//! reason; `mint` with a URL asks for the admin secret instead of guessing a file.

mod ingest_support;
mod pg_support;
mod store_support;

use std::process::Command;

use ingest_support::{ingest_command, INGEST_BIN};
use serde_json::json;
use store_support::{Served, StoreKind, TestDb};

fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn batch(ids: &[u64]) -> serde_json::Value {
    let events: Vec<_> = ids
        .iter()
        .map(|n| {
            let id = format!("{n:032x}");
            json!({
                "v": 2, "id": id, "ts": "2026-11-29T19:00:00.000Z", "class": "action",
                "rec": { "rail": "mcp", "action": "issue_refund", "registryVersion": null,
                         "fields": { "amount_cents": 4900 } },
                "dest": { "host": "mcp://payments", "pathTemplate": "/issue_refund", "method": "POST" },
                "actor": { "id": "mcp:sensor", "kind": "agent", "grade": "attested" },
                "status": 200, "dur_ms": 1.25, "bytes": { "req": 120, "resp": 300 },
            })
        })
        .collect();
    json!({ "v": 2, "sensor": { "version": "0.1.0", "transport": "stdio" }, "dropped": 0, "events": events })
}

fn tables(db: &TestDb) -> String {
    db.cluster().expect("postgres").psql(
        &db.pg_database().expect("db"),
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
    )
}

/// A sensor token minted for org `acme` with `bounded-ingest mint` against the ingest at `base`.
fn mint(db: &TestDb, base: &str) -> String {
    let out = ingest_command()
        .args(["mint", "--org", "acme", "--ingest", base])
        .args(db.admin_args())
        .output()
        .expect("run mint");
    assert!(out.status.success(), "{}", output_text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn serve_with_a_postgres_url_stores_there_writes_no_file_and_never_prints_the_password() {
    install_tls_provider();
    let db = TestDb::new(StoreKind::Postgres);
    let password = db.cluster().expect("postgres").password().to_string();
    let cwd = tempfile::tempdir().expect("tempdir");
    let mut cmd = db.serve_command();
    cmd.arg("--debug").current_dir(cwd.path());
    let mut served = Served::start(cmd);

    let token = mint(&db, &served.base);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (status, answer) = rt.block_on(async {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/events", served.base))
            .bearer_auth(&token)
            .json(&batch(&[1, 2]))
            .send()
            .await
            .expect("post");
        let status = r.status().as_u16();
        (status, r.json::<serde_json::Value>().await.expect("json"))
    });
    assert_eq!(status, 200);
    assert_eq!(answer["accepted"], 2, "{answer}");
    assert_eq!(db.stored_events(), 2, "the events are in PostgreSQL");

    assert!(served.stop().success());
    let stderr = served.stderr();
    assert!(
        stderr.contains(&format!(
            "Database postgres://bounded@127.0.0.1:{}/",
            db.cluster().expect("postgres").port()
        )),
        "{stderr}"
    );
    assert!(!stderr.contains(&password), "password printed: {stderr}");
    let left: Vec<_> = std::fs::read_dir(cwd.path())
        .expect("cwd")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(
        left.is_empty(),
        "no SQLite file or secret beside it: {left:?}"
    );
}

#[test]
fn a_replica_without_a_shared_secret_refuses_to_start_and_leaves_the_database_untouched() {
    let db = TestDb::new(StoreKind::Postgres);
    let url = db.url().expect("url").to_string();
    let signing = std::fs::read_to_string(db.signing_secret_file()).expect("secret");
    for (missing, args, env) in [
        (
            "BOUNDED_INGEST_SIGNING_SECRET",
            vec![
                "--admin-secret-file".to_string(),
                db.admin_secret_file().display().to_string(),
            ],
            vec![],
        ),
        (
            "BOUNDED_INGEST_ADMIN_SECRET",
            vec![],
            vec![("BOUNDED_INGEST_SIGNING_SECRET", signing.trim().to_string())],
        ),
    ] {
        let cwd = tempfile::tempdir().expect("tempdir");
        let out = ingest_command()
            .args(["serve", "--listen", "127.0.0.1:0", "--db", &url])
            .args(&args)
            .envs(env)
            .current_dir(cwd.path())
            .output()
            .expect("run serve");
        let text = output_text(&out);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(text.contains(missing), "names what to set: {text}");
        assert!(
            !text.contains(db.cluster().expect("pg").password()),
            "{text}"
        );
        assert_eq!(
            tables(&db),
            "0",
            "nothing created before the secrets are there"
        );
        assert_eq!(std::fs::read_dir(cwd.path()).expect("cwd").count(), 0);
    }
    // A malformed signing secret is refused too, never replaced.
    let out = ingest_command()
        .args(["serve", "--listen", "127.0.0.1:0", "--db", &url])
        .env("BOUNDED_INGEST_SIGNING_SECRET", "too-short")
        .env("BOUNDED_INGEST_ADMIN_SECRET_FILE", db.admin_secret_file())
        .output()
        .expect("run serve");
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("not 32 bytes"),
        "{}",
        output_text(&out)
    );
}

#[test]
fn a_database_failure_is_reported_with_the_servers_reason_and_not_the_password() {
    let db = TestDb::new(StoreKind::Postgres);
    let real = db.url().expect("url");
    let wrong_password = "Wr0ngPassw0rdCanary";
    let wrong = real.replacen(db.cluster().expect("pg").password(), wrong_password, 1);
    let out = ingest_command()
        .args(["serve", "--listen", "127.0.0.1:0", "--db", &wrong])
        .arg("--signing-secret-file")
        .arg(db.signing_secret_file())
        .arg("--admin-secret-file")
        .arg(db.admin_secret_file())
        .output()
        .expect("run serve");
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("password authentication failed"),
        "the server's reason, not just `db error`: {text}"
    );
    assert!(!text.contains(wrong_password), "{text}");
    assert!(
        !text.contains(db.cluster().expect("pg").password()),
        "{text}"
    );
}

#[test]
fn mint_and_revoke_with_a_postgres_db_ask_for_the_admin_secret_without_printing_the_url() {
    for sub in [&["mint", "--org", "acme"][..], &["revoke", "k_0123"][..]] {
        let out = Command::new(INGEST_BIN)
            .args(sub)
            .args(["--ingest", "http://127.0.0.1:9"])
            .env_remove("BOUNDED_INGEST_ADMIN_SECRET")
            .env_remove("BOUNDED_INGEST_ADMIN_SECRET_FILE")
            .env(
                "BOUNDED_INGEST_DB",
                "postgres://u:Pa55wordCanary@db.example/ingest",
            )
            .output()
            .expect("run");
        let text = output_text(&out);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(text.contains("--admin-secret-file"), "{text}");
        assert!(!text.contains("Pa55wordCanary"), "{text}");
    }
}

#[test]
fn help_shows_no_database_url() {
    let out = Command::new(INGEST_BIN)
        .args(["serve", "--help"])
        .env(
            "BOUNDED_INGEST_DB",
            "postgres://u:Pa55wordCanary@db.example/ingest",
        )
        .output()
        .expect("run");
    assert!(out.status.success());
    let text = output_text(&out);
    assert!(text.contains("postgres://user:password@host/db"), "{text}");
    assert!(!text.contains("Pa55wordCanary"), "{text}");
}

#[test]
fn a_store_failure_while_serving_is_logged_with_the_servers_reason() {
    install_tls_provider();
    let db = TestDb::new(StoreKind::Postgres);
    let mut served = Served::start(db.serve_command());
    let token = mint(&db, &served.base);
    // The database changes under the running ingest: its next batch cannot be stored.
    let name = db.pg_database().expect("db");
    db.cluster()
        .expect("pg")
        .psql(&name, "ALTER TABLE events RENAME TO events_elsewhere");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let status = rt.block_on(async {
        reqwest::Client::new()
            .post(format!("{}/v1/events", served.base))
            .bearer_auth(&token)
            .json(&batch(&[1]))
            .send()
            .await
            .expect("post")
            .status()
            .as_u16()
    });
    assert_eq!(
        status, 503,
        "a store failure is the ingest's, not the sensor's"
    );
    assert!(served.stop().success());
    let stderr = served.stderr();
    assert!(
        stderr.contains("relation \"events\" does not exist"),
        "the server's reason, not just `db error`: {stderr}"
    );
}

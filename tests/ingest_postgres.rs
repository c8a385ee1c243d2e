//! The PostgreSQL store against a real server (tests/pg_support): the schema is created on an
//! empty database at the current version, reopened as it is, created once when replicas start
//! together, and a newer or foreign database is refused and left as it was. The password never
//! appears in an error, and TLS is never silently dropped. The tests share one cluster, a
//! database each (pg_support::shared).

mod pg_support;
mod pki_support;

use bounded_observe_mcp::ingest::store::postgres::{self, PgConnect, PgOpenError, SCHEMA_VERSION};
use pg_support::PgCluster;

fn connect(url: &str) -> PgConnect {
    PgConnect::new(url, &[]).expect("valid url")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

const TABLES: &str = "bounded_ingest_schema,catalogs,error_groups,events,keys,sensors,tool_defs";

fn tables(pg: &PgCluster, db: &str) -> String {
    pg.psql(
        db,
        "SELECT string_agg(table_name, ',' ORDER BY table_name) FROM information_schema.tables \
         WHERE table_schema = 'public'",
    )
}

#[test]
fn an_empty_database_gets_the_schema_at_the_current_version_and_reopens_unchanged() {
    let pg = pg_support::shared();
    let url = pg.create_database("fresh");
    let rt = runtime();
    rt.block_on(postgres::open(&connect(&url))).expect("open");
    assert_eq!(tables(&pg, "fresh"), TABLES);
    let version = || {
        pg.psql(
            "fresh",
            "SELECT application_id, version FROM bounded_ingest_schema",
        )
    };
    assert_eq!(version(), format!("{}|{SCHEMA_VERSION}", 0x4264_496E_i64));

    pg.psql(
        "fresh",
        "INSERT INTO keys VALUES ('k_1', 'acme', NULL, 't', NULL)",
    );
    rt.block_on(postgres::open(&connect(&url))).expect("reopen");
    assert_eq!(version(), format!("{}|{SCHEMA_VERSION}", 0x4264_496E_i64));
    assert_eq!(
        pg.psql("fresh", "SELECT count(*) FROM keys"),
        "1",
        "data kept"
    );
}

#[test]
fn replicas_starting_together_create_the_schema_once() {
    let pg = pg_support::shared();
    let url = pg.create_database("together");
    let rt = runtime();
    let c = connect(&url);
    let results = rt.block_on(async {
        let opens = (0..4).map(|_| {
            let c = c.clone();
            tokio::spawn(async move { postgres::open(&c).await.map(|_| ()) })
        });
        futures_util::future::join_all(opens).await
    });
    for r in results {
        r.expect("task").expect("open");
    }
    assert_eq!(
        pg.psql("together", "SELECT count(*) FROM bounded_ingest_schema"),
        "1"
    );
    assert_eq!(tables(&pg, "together"), TABLES);
}

#[test]
fn a_newer_schema_is_refused_and_left_as_it_was() {
    let pg = pg_support::shared();
    let url = pg.create_database("newer");
    let rt = runtime();
    rt.block_on(postgres::open(&connect(&url))).expect("open");
    pg.psql("newer", "UPDATE bounded_ingest_schema SET version = 99");
    let err = rt
        .block_on(postgres::open(&connect(&url)))
        .expect_err("newer refused");
    assert!(matches!(err, PgOpenError::Newer { found: 99, .. }), "{err}");
    assert!(err.to_string().contains("newer"), "{err}");
    assert_eq!(
        pg.psql("newer", "SELECT version FROM bounded_ingest_schema"),
        "99"
    );
}

#[test]
fn another_programs_database_is_refused_and_left_as_it_was() {
    let pg = pg_support::shared();
    let url = pg.create_database("foreign_db");
    pg.psql(
        "foreign_db",
        "CREATE TABLE invoices (id int); INSERT INTO invoices VALUES (7)",
    );
    let rt = runtime();
    let err = rt
        .block_on(postgres::open(&connect(&url)))
        .expect_err("foreign refused");
    assert!(matches!(err, PgOpenError::Foreign { .. }), "{err}");
    assert!(err.to_string().contains("invoices"), "{err}");
    assert_eq!(tables(&pg, "foreign_db"), "invoices", "nothing created");
    assert_eq!(pg.psql("foreign_db", "SELECT id FROM invoices"), "7");

    // A marker table of the same name written by someone else is not ours either.
    let url = pg.create_database("lookalike");
    pg.psql(
        "lookalike",
        "CREATE TABLE bounded_ingest_schema (application_id bigint, version int); \
         INSERT INTO bounded_ingest_schema VALUES (1, 1)",
    );
    let err = rt
        .block_on(postgres::open(&connect(&url)))
        .expect_err("lookalike refused");
    assert!(matches!(err, PgOpenError::Foreign { .. }), "{err}");
    assert_eq!(tables(&pg, "lookalike"), "bounded_ingest_schema");
}

#[test]
fn the_password_never_appears_in_an_error() {
    let pg = pg_support::shared();
    let rt = runtime();
    let canary = "Canary-Pw-7f3a9c";

    // A wrong password: the server refuses, the message names the database only.
    let url = format!(
        "postgres://bounded:{canary}@127.0.0.1:{}/postgres?sslmode=disable",
        pg.port()
    );
    let c = connect(&url);
    assert!(!format!("{c:?}").contains(canary));
    let err = rt.block_on(postgres::open(&c)).expect_err("wrong password");
    let text = format!("{err} {err:?}");
    assert!(!text.contains(canary), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{}", pg.port())), "{text}");
    assert!(text.contains("password authentication failed"), "{text}");

    // A URL the parser rejects, with the password in it.
    for bad in [
        format!("postgres://bounded:{canary}@127.0.0.1:notaport/db"),
        format!("postgres://bounded:{canary}@127.0.0.1:5432/db?sslmode={canary}"),
    ] {
        let err = PgConnect::new(&bad, &[]).expect_err("bad url");
        let text = format!("{err} {err:?}");
        assert!(!text.contains(canary), "{text}");
    }
}

#[test]
fn tls_is_required_unless_the_url_disables_it() {
    // The test cluster has no certificate: every mode but `disable` must fail, never fall back.
    let pg = pg_support::shared();
    let rt = runtime();
    let base = format!(
        "postgres://bounded:{}@127.0.0.1:{}/postgres",
        pg.password(),
        pg.port()
    );
    for url in [
        base.clone(),
        format!("{base}?sslmode=prefer"),
        format!("{base}?sslmode=require"),
    ] {
        let err = rt
            .block_on(postgres::open(&connect(&url)))
            .expect_err("no TLS on the server");
        assert!(matches!(err, PgOpenError::Db { .. }), "{err}");
    }
    rt.block_on(postgres::open(&connect(&format!("{base}?sslmode=disable"))))
        .expect("plain when asked");
}

#[test]
fn verify_full_with_the_databases_ca_connects_encrypted_and_an_unknown_ca_is_refused() {
    // A cluster of its own: the shared one must keep serving without TLS.
    let pg = PgCluster::start();
    let issued = pki_support::issue("bounded test database CA", "bounded test database");
    pg.enable_tls(&issued.cert_pem, &issued.key_pem);
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_path = dir.path().join("db ca.pem");
    std::fs::write(&ca_path, &issued.ca_pem).expect("write ca");

    let url = pg.create_database("tls");
    let base = url.split('?').next().expect("url").to_string();
    let rt = runtime();
    let encrypted = |connect: PgConnect| {
        rt.block_on(async {
            postgres::open(&connect).await?;
            let client = connect.connect().await?;
            let row = client
                .query_one(
                    "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                    &[],
                )
                .await
                .map_err(|cause| PgOpenError::Db {
                    target: connect.target().clone(),
                    cause,
                })?;
            Ok::<bool, PgOpenError>(row.get(0))
        })
    };
    // What a managed database's instructions say: verify-full and its CA in the URL.
    let in_url = format!(
        "{base}?sslmode=verify-full&sslrootcert={}",
        ca_path.display().to_string().replace(' ', "%20")
    );
    assert!(encrypted(connect(&in_url)).expect("verify-full with sslrootcert"));
    // The same CA given beside the URL (--db-ca).
    let ca_der = bounded_observe_mcp::http_client::load_ca_file(&ca_path).expect("ca");
    assert!(
        encrypted(PgConnect::new(&format!("{base}?sslmode=require"), &ca_der).expect("url"))
            .expect("require with the CA given")
    );
    // Without the CA the certificate is not trusted: refused, never downgraded.
    let err = encrypted(connect(&format!("{base}?sslmode=verify-full")))
        .expect_err("an unknown CA is refused");
    assert!(matches!(err, PgOpenError::Db { .. }), "{err}");
    assert!(!err.to_string().contains(pg.password()), "{err}");
    // The host name is checked, always (verify-ca included): `hostaddr` connects to the same
    // server under a name the certificate does not carry, and under one it does.
    let root = format!(
        "sslrootcert={}",
        ca_path.display().to_string().replace(' ', "%20")
    );
    let named = |host: &str| {
        format!(
            "{}?hostaddr=127.0.0.1&sslmode=verify-ca&{root}",
            base.replace("@127.0.0.1:", &format!("@{host}:"))
        )
    };
    assert!(encrypted(connect(&named("localhost"))).expect("a name the certificate carries"));
    let err = encrypted(connect(&named("db.example.com")))
        .expect_err("a name the certificate does not carry is refused");
    assert!(err.to_string().contains("TLS handshake"), "{err}");
}

mod store {
    //! The [`Store`] over PostgreSQL: the same answers as SQLite for the same batches, one
    //! transaction per batch, and de-duplication and revocation that hold across replicas.

    use std::sync::Arc;

    use bounded_observe_mcp::event::health::Health;
    use bounded_observe_mcp::ingest::store::postgres::{
        self as postgres_store, PgConnect, PgStore,
    };
    use bounded_observe_mcp::ingest::store::{
        BatchOutcome, BatchWrite, EventQuery, EventRow, Evidence, KeyRecord, RevokeOutcome,
        SqliteStore, Store,
    };

    use super::{pg_support, runtime};

    fn key(id: &str) -> KeyRecord {
        KeyRecord {
            key_id: id.into(),
            org: "acme".into(),
            name: Some("laptop".into()),
            created_at: "2026-11-30T19:00:00.000Z".into(),
            revoked_at: None,
        }
    }

    fn row(id: &str, tool: &str, n: i64, host: &str) -> EventRow {
        let body = serde_json::json!({
            "id": id, "actor": "alice", "action": tool, "class": "action",
            "rec": { "fields": { "rows": n, "ratio": 0.5 } },
        });
        EventRow {
            id: id.into(),
            actor: "alice".into(),
            action: tool.into(),
            class: "action".into(),
            body: body.to_string(),
            evidence: Evidence {
                host: host.into(),
                seen: format!("2026-11-30T19:{:02}:00.000Z", n % 60),
                tool_defs: vec![format!("def-{}", n % 2)],
                error: (n % 3 == 0).then(|| ("fp1".into(), "tool_error".into(), Some(-32000))),
                catalog: Some((Some(3), 1000 + n as u64)),
            },
        }
    }

    fn batch(key_id: &str, ids: std::ops::Range<i64>) -> BatchWrite {
        BatchWrite {
            key_id: key_id.into(),
            org: "acme".into(),
            received_at: "2026-11-30T19:30:00.000Z".into(),
            rows: ids
                .map(|n| row(&format!("ev-{n}"), "search", n, "srv"))
                .collect(),
            dropped: 2,
            health: Health {
                stdout_non_json: 1,
                ..Default::default()
            },
            sensor_version: Some("0.1.0".into()),
            sensor_transport: Some("stdio".into()),
        }
    }

    async fn pg_store(url: &str) -> Arc<PgStore> {
        PgStore::open(&PgConnect::new(url, &[]).expect("url"))
            .await
            .expect("open")
    }

    fn stored(o: BatchOutcome) -> (u64, u64) {
        match o {
            BatchOutcome::Stored {
                accepted,
                duplicates,
            } => (accepted, duplicates),
            BatchOutcome::KeyRevoked => panic!("refused as revoked"),
        }
    }

    #[test]
    fn postgres_answers_as_sqlite_does_for_the_same_batches() {
        let pg = pg_support::shared();
        let url = pg.create_database("parity");
        let dir = tempfile::tempdir().expect("tempdir");
        let rt = runtime();
        rt.block_on(async {
            let stores: [Arc<dyn Store>; 2] = [
                SqliteStore::open(&dir.path().join("i.db")).expect("sqlite"),
                pg_store(&url).await,
            ];
            let mut answers = Vec::new();
            for s in &stores {
                s.mint(key("k_1")).await.expect("mint");
                assert_eq!(
                    stored(s.write_batch(batch("k_1", 0..10)).await.expect("b")),
                    (10, 0)
                );
                // A retry of part of it, with new ones and an id repeated inside the batch.
                let mut again = batch("k_1", 5..15);
                again.rows.push(row("ev-14", "search", 14, "srv"));
                assert_eq!(stored(s.write_batch(again).await.expect("b")), (5, 6));
                let events = s
                    .events(EventQuery {
                        limit: 100,
                        ..Default::default()
                    })
                    .await
                    .expect("events");
                let after = s.events_after(None, 3).await.expect("after");
                let since = s
                    .events_received_since(
                        "2026-11-30T19:00:00.000Z".into(),
                        Some("acme".into()),
                        4,
                    )
                    .await
                    .expect("since");
                let rollups =
                    serde_json::to_value(s.rollups(None).await.expect("rollups")).expect("json");
                let sensors =
                    serde_json::to_value(s.sensors().await.expect("sensors")).expect("json");
                let tools =
                    serde_json::to_value(s.tools(Some("acme".into())).await.expect("tools"))
                        .expect("json");
                let evidence = s.evidence_rollups(None).await.expect("evidence");
                let evidence = serde_json::to_value(&evidence).expect("json");
                answers.push((
                    events,
                    after.into_iter().map(|(_, b)| b).collect::<Vec<_>>(),
                    since,
                    rollups,
                    sensors,
                    tools,
                    evidence,
                ));
            }
            let (a, b) = (&answers[0], &answers[1]);
            assert_eq!(a.0.len(), 15);
            assert_eq!(a.0, b.0, "events");
            assert_eq!(a.1, b.1, "events_after");
            assert_eq!(a.2, b.2, "events_received_since");
            assert_eq!(a.3, b.3, "rollups");
            assert_eq!(a.4, b.4, "sensors");
            assert_eq!(a.5, b.5, "tools");
            assert_eq!(a.6, b.6, "error groups and catalogs");
            // The sums are there to compare: 0+1+…+14 rows, 15 × 0.5 ratio.
            assert_eq!(b.3[0]["sums"]["rows"], 105, "{}", b.3);
            assert_eq!(b.3[0]["sums"]["ratio"], 7.5, "{}", b.3);
            for s in &stores {
                s.close().await;
            }
        });
    }

    #[test]
    fn a_batch_failing_midway_stores_nothing() {
        let pg = pg_support::shared();
        let url = pg.create_database("whole");
        let rt = runtime();
        rt.block_on(async {
            let s = pg_store(&url).await;
            s.mint(key("k_1")).await.expect("mint");
            let mut b = batch("k_1", 0..5);
            // PostgreSQL text cannot hold NUL: the last row's aggregate fails after the events
            // were inserted.
            b.rows[4].evidence.host = "bad\0host".into();
            assert!(s.write_batch(b).await.is_err());
            assert_eq!(pg.psql("whole", "SELECT count(*) FROM events"), "0");
            assert_eq!(pg.psql("whole", "SELECT count(*) FROM tool_defs"), "0");
            assert_eq!(pg.psql("whole", "SELECT count(*) FROM sensors"), "0");
            // And the same batch, fixed, then goes in whole.
            assert_eq!(
                stored(s.write_batch(batch("k_1", 0..5)).await.expect("b")),
                (5, 0)
            );
        });
    }

    #[test]
    fn a_batch_retried_on_another_replica_is_stored_once() {
        let pg = pg_support::shared();
        let url = pg.create_database("replicas");
        let rt = runtime();
        rt.block_on(async {
            let (a, b) = (pg_store(&url).await, pg_store(&url).await);
            a.mint(key("k_1")).await.expect("mint");
            assert_eq!(
                stored(a.write_batch(batch("k_1", 0..50)).await.expect("a")),
                (50, 0)
            );
            assert_eq!(
                stored(b.write_batch(batch("k_1", 0..50)).await.expect("b")),
                (0, 50)
            );
            // Both at once, overlapping: every id is stored by exactly one of them.
            let (x, y) = tokio::join!(
                a.write_batch(batch("k_1", 40..200)),
                b.write_batch(batch("k_1", 100..300))
            );
            let (x, y) = (stored(x.expect("x")), stored(y.expect("y")));
            assert_eq!(x.0 + y.0, 250, "{x:?} {y:?}");
            assert_eq!(pg.psql("replicas", "SELECT count(*) FROM events"), "300");
        });
    }

    #[test]
    fn a_key_revoked_through_one_replica_stores_nothing_through_another() {
        let pg = pg_support::shared();
        let url = pg.create_database("revoked");
        let rt = runtime();
        rt.block_on(async {
            let (a, b) = (pg_store(&url).await, pg_store(&url).await);
            a.mint(key("k_1")).await.expect("mint");
            assert_eq!(
                b.key("k_1".into()).await.expect("key").map(|k| k.org),
                Some("acme".to_string()),
                "a key minted through one replica is known to another at once"
            );
            assert_eq!(b.key_records().await.expect("keys").len(), 1);
            assert_eq!(
                a.revoke("k_1".into(), "2026-11-30T20:00:00.000Z".into())
                    .await
                    .expect("revoke"),
                RevokeOutcome::Revoked
            );
            assert_eq!(
                b.write_batch(batch("k_1", 0..3)).await.expect("b"),
                BatchOutcome::KeyRevoked
            );
            assert_eq!(
                b.revoke("k_1".into(), "2026-11-30T20:01:00.000Z".into())
                    .await
                    .expect("again"),
                RevokeOutcome::AlreadyRevoked
            );
            assert_eq!(
                b.revoke("k_nope".into(), "2026-11-30T20:01:00.000Z".into())
                    .await
                    .expect("unknown"),
                RevokeOutcome::Unknown
            );
            assert_eq!(pg.psql("revoked", "SELECT count(*) FROM events"), "0");
            for replica in [&a, &b] {
                assert_eq!(
                    replica
                        .key("k_1".into())
                        .await
                        .expect("key")
                        .and_then(|k| k.revoked_at)
                        .as_deref(),
                    Some("2026-11-30T20:00:00.000Z"),
                    "every replica sees the revocation at once"
                );
            }
        });
    }

    #[test]
    fn concurrent_batches_sharing_aggregates_all_commit() {
        // Sixteen batches at once through two replicas, each touching the same hosts, tools
        // and error groups in its own order: none may fail (a deadlock aborts one).
        let pg = pg_support::shared();
        let url = pg.create_database("shared_aggregates");
        let rt = runtime();
        rt.block_on(async {
            let (a, b) = (pg_store(&url).await, pg_store(&url).await);
            a.mint(key("k_1")).await.expect("mint");
            let writes = (0..16i64).map(|t| {
                let s = if t % 2 == 0 { a.clone() } else { b.clone() };
                let mut rows: Vec<EventRow> = (0..40i64)
                    .map(|n| {
                        let mut r = row(&format!("t{t}-{n}"), &format!("tool{}", n % 5), n, "srv");
                        r.evidence.host = format!("host{}", n % 8);
                        r
                    })
                    .collect();
                if t % 2 == 1 {
                    rows.reverse();
                }
                let mut w = batch("k_1", 0..0);
                w.rows = rows;
                tokio::spawn(async move { s.write_batch(w).await })
            });
            for r in futures_util::future::join_all(writes).await {
                assert_eq!(stored(r.expect("task").expect("committed")), (40, 0));
            }
        });
        assert_eq!(
            pg.psql("shared_aggregates", "SELECT count(*) FROM events"),
            "640"
        );
        assert_eq!(
            pg.psql("shared_aggregates", "SELECT sum(count) FROM error_groups"),
            (16 * (0..40).filter(|n| n % 3 == 0).count()).to_string()
        );
    }

    /// Batches (ids, transactions) by the transaction that inserted them: rows inserted by one
    /// transaction share its `xmin`.
    fn transactions_of(pg: &pg_support::PgCluster, db: &str, ids: &[&str]) -> usize {
        let list = ids
            .iter()
            .map(|i| format!("'{i}'"))
            .collect::<Vec<_>>()
            .join(",");
        pg.psql(
            db,
            &format!("SELECT count(DISTINCT xmin::text) FROM events WHERE id IN ({list})"),
        )
        .parse()
        .expect("count")
    }

    /// Holds every committer of `s` up with a plug batch each (waiting on a lock on `keys`),
    /// queues `batches` in order behind them, lets the lock go and returns the batches'
    /// outcomes: the queued batches are taken as one group.
    async fn grouped(
        s: &Arc<PgStore>,
        url: &str,
        db: &str,
        pg: &pg_support::PgCluster,
        batches: Vec<BatchWrite>,
    ) -> Vec<Result<BatchOutcome, String>> {
        let (lock, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        let driver = tokio::spawn(conn);
        lock.batch_execute("BEGIN; LOCK TABLE keys IN ACCESS EXCLUSIVE MODE")
            .await
            .expect("lock");
        let blocked = || {
            pg.psql(
                db,
                &format!(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = '{db}' AND wait_event_type = 'Lock'"
                ),
            )
        };
        let mut plugs = Vec::new();
        for p in 0..postgres_store::COMMITTERS {
            let s = s.clone();
            // Ids no other batch uses, none an error event (`row` makes n % 3 == 0 one).
            static PLUGS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
            let first = 1_000_000 + 3 * PLUGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            plugs.push(tokio::spawn(async move {
                s.write_batch(batch("k_1", first..first + 1)).await
            }));
            // One at a time, so that each committer takes one plug, not a group of them.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while blocked() != (p + 1).to_string() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "committer {p} never blocked"
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
        let s2 = s.clone();
        // Polled in order, each queued on its first poll: the queue holds them in order.
        let rest = tokio::spawn(async move {
            futures_util::future::join_all(batches.into_iter().map(|b| s2.write_batch(b))).await
        });
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        lock.batch_execute("COMMIT").await.expect("unlock");
        drop(lock);
        let _ = driver.await;
        for p in plugs {
            stored(p.await.expect("plug task").expect("plug"));
        }
        rest.await
            .expect("task")
            .into_iter()
            .map(|r| r.map_err(|e| e.to_string()))
            .collect()
    }

    fn ids(b: &BatchWrite) -> Vec<&str> {
        b.rows.iter().map(|r| r.id.as_str()).collect()
    }

    #[test]
    fn a_group_with_one_bad_batch_stores_the_others_and_fails_only_that_one() {
        let pg = pg_support::shared();
        let url = pg.create_database("bad_in_group");
        let rt = runtime();
        rt.block_on(async {
            let s = pg_store(&url).await;
            s.mint(key("k_1")).await.expect("mint");
            let mut bad = batch("k_1", 100..110);
            // PostgreSQL text cannot hold NUL: the group's aggregate statement fails.
            bad.rows[9].evidence.host = "bad\0host".into();
            let (a, c) = (batch("k_1", 0..10), batch("k_1", 200..210));
            let out = grouped(
                &s,
                &url,
                "bad_in_group",
                &pg,
                vec![a.clone(), bad, c.clone()],
            )
            .await;
            assert_eq!(out[0].clone().map(stored), Ok((10, 0)));
            assert!(out[1].is_err(), "{:?}", out[1]);
            assert_eq!(out[2].clone().map(stored), Ok((10, 0)));
            // One plug batch of one event per committer.
            let n = postgres_store::COMMITTERS;
            assert_eq!(
                pg.psql("bad_in_group", "SELECT count(*) FROM events"),
                (20 + n).to_string()
            );
            assert_eq!(
                pg.psql(
                    "bad_in_group",
                    "SELECT count(*) FROM events WHERE id LIKE 'ev-10_'"
                ),
                "0",
                "nothing of the bad batch"
            );
            assert_eq!(
                pg.psql("bad_in_group", "SELECT batches, accepted FROM sensors"),
                format!("{}|{}", n + 2, 20 + n),
                "the bad batch is not counted"
            );
            // The bad batch's error events are not in the error group either.
            let errors_ok = (0..10).chain(200..210).filter(|n| n % 3 == 0).count();
            assert_eq!(
                pg.psql("bad_in_group", "SELECT sum(count) FROM error_groups"),
                errors_ok.to_string()
            );
            // The good ones were each committed on their own after the group failed.
            assert_eq!(
                transactions_of(&pg, "bad_in_group", &[ids(&a), ids(&c)].concat()),
                2
            );
        });
    }

    #[test]
    fn duplicates_within_a_group_and_across_groups_are_stored_once_and_counted() {
        let pg = pg_support::shared();
        let url = pg.create_database("dup_groups");
        let rt = runtime();
        rt.block_on(async {
            let s = pg_store(&url).await;
            s.mint(key("k_1")).await.expect("mint");
            let a = batch("k_1", 0..100);
            // Overlaps `a` in the same group, and repeats an id inside itself.
            let mut b = batch("k_1", 50..150);
            b.rows.push(row("ev-149", "search", 149, "srv"));
            let out = grouped(&s, &url, "dup_groups", &pg, vec![a.clone(), b.clone()]).await;
            assert_eq!(
                out[0].clone().map(stored),
                Ok((100, 0)),
                "first in the group wins"
            );
            assert_eq!(out[1].clone().map(stored), Ok((50, 51)));
            // One transaction stored both: they were one group.
            assert_eq!(
                transactions_of(&pg, "dup_groups", &[ids(&a), ids(&b)].concat()),
                1
            );

            // A later group repeating ids of the first, and each other.
            let c = batch("k_1", 100..200);
            let d = batch("k_1", 150..250);
            let out = grouped(&s, &url, "dup_groups", &pg, vec![c.clone(), d.clone()]).await;
            assert_eq!(out[0].clone().map(stored), Ok((50, 50)));
            assert_eq!(out[1].clone().map(stored), Ok((50, 50)));
            assert_eq!(transactions_of(&pg, "dup_groups", &["ev-150", "ev-249"]), 1);

            let plugs = 2 * postgres_store::COMMITTERS;
            assert_eq!(
                pg.psql("dup_groups", "SELECT count(*) FROM events"),
                (250 + plugs).to_string()
            );
            assert_eq!(
                pg.psql("dup_groups", "SELECT batches, accepted FROM sensors"),
                format!("{}|{}", 4 + plugs, 250 + plugs)
            );
            assert_eq!(
                pg.psql("dup_groups", "SELECT sum(count) FROM error_groups"),
                (0..250).filter(|n| n % 3 == 0).count().to_string()
            );
            // The stored body is the first occurrence's, the same as one batch after another.
            assert_eq!(
                pg.psql(
                    "dup_groups",
                    "SELECT count(*) FROM events WHERE body LIKE '%ev-149%'"
                ),
                "1"
            );
        });
    }

    #[test]
    fn concurrent_groups_on_two_stores_over_one_database_answer_as_sqlite() {
        // Eight writers on two replicas at once, each batch overlapping others (retries on
        // the other replica), all sharing hosts, tools and error groups; SQLite gets the same
        // batches one after the other. What was stored must read the same.
        let pg = pg_support::shared();
        let url = pg.create_database("two_stores");
        let dir = tempfile::tempdir().expect("tempdir");
        let rt = runtime();
        rt.block_on(async {
            let (a, b) = (pg_store(&url).await, pg_store(&url).await);
            let lite = SqliteStore::open(&dir.path().join("i.db")).expect("sqlite");
            a.mint(key("k_1")).await.expect("mint");
            lite.mint(key("k_1")).await.expect("mint");
            let batches: Vec<BatchWrite> = (0..48i64)
                .map(|i| {
                    let mut w = batch("k_1", i * 40..i * 40 + 80);
                    for r in &mut w.rows {
                        let n: i64 = r.id[3..].parse().expect("n");
                        r.evidence.host = format!("host{}", n % 5);
                        r.action = format!("tool{}", n % 7);
                    }
                    w
                })
                .collect();
            let mut writers = Vec::new();
            for w in 0..8 {
                let s = if w % 2 == 0 { a.clone() } else { b.clone() };
                let mine: Vec<BatchWrite> = batches.iter().skip(w).step_by(8).cloned().collect();
                writers.push(tokio::spawn(async move {
                    let mut accepted = 0;
                    for m in mine {
                        accepted += stored(s.write_batch(m).await.expect("committed")).0;
                    }
                    accepted
                }));
            }
            let mut accepted = 0;
            for w in writers {
                accepted += w.await.expect("writer");
            }
            for w in &batches {
                lite.write_batch(w.clone()).await.expect("sqlite");
            }
            assert_eq!(accepted, 47 * 40 + 80, "every id once");
            let pgs: Arc<dyn Store> = a.clone();
            let lite: Arc<dyn Store> = lite;
            for (what, x, y) in [
                (
                    "rollups",
                    json(pgs.rollups(None).await),
                    json(lite.rollups(None).await),
                ),
                (
                    "tools",
                    json(pgs.tools(None).await),
                    json(lite.tools(None).await),
                ),
                (
                    "evidence",
                    by_tool(json(pgs.evidence_rollups(None).await)),
                    by_tool(json(lite.evidence_rollups(None).await)),
                ),
                (
                    "sensors",
                    json(pgs.sensors().await),
                    json(lite.sensors().await),
                ),
            ] {
                assert_eq!(x, y, "{what}");
            }
            // The figures are there to compare.
            let evidence = json(pgs.evidence_rollups(None).await);
            assert!(
                evidence[0][0]["count"].as_u64().unwrap_or(0) > 50,
                "{evidence}"
            );
            lite.close().await;
        });
    }

    /// Error groups of equal count in tool order: both stores list them by count and
    /// fingerprint only, so groups of one fingerprint and count come in storage order.
    fn by_tool(mut evidence: serde_json::Value) -> serde_json::Value {
        if let Some(groups) = evidence[0].as_array_mut() {
            groups.sort_by_key(|g| {
                (
                    std::cmp::Reverse(g["count"].as_u64()),
                    g["tool"].to_string(),
                )
            });
        }
        evidence
    }

    fn json<T: serde::Serialize>(
        r: Result<T, bounded_observe_mcp::ingest::store::StoreError>,
    ) -> serde_json::Value {
        serde_json::to_value(r.expect("read")).expect("json")
    }
}

/// The live view follows the store sequence (`events_after`). PostgreSQL hands sequence values
/// out at insert, not at commit: a batch still committing holds lower ones than a batch that
/// committed after it started. A reader must not skip past it.
#[test]
fn a_reader_following_the_sequence_never_skips_a_batch_still_committing() {
    use bounded_observe_mcp::ingest::store::postgres::PgStore;
    use bounded_observe_mcp::ingest::store::Store;
    let pg = pg_support::shared();
    let url = pg.create_database("commit_order");
    let rt = runtime();
    rt.block_on(async {
        let store = PgStore::open(&connect(&url)).await.expect("open");
        let (mut slow, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        // A batch that took the lower sequence value and has not committed yet…
        let tx = slow.transaction().await.expect("begin");
        tx.execute(
            "INSERT INTO events (id, org, sensor, actor, action, class, received_at, body)
             VALUES ('slow', 'acme', 'k', 'a', 'x', 'action', 't', '{\"id\":\"slow\"}')",
            &[],
        )
        .await
        .expect("insert");
        // …and one that took a higher value and committed.
        pg.psql(
            "commit_order",
            "INSERT INTO events (id, org, sensor, actor, action, class, received_at, body)
             VALUES ('fast', 'acme', 'k', 'a', 'x', 'action', 't', '{\"id\":\"fast\"}')",
        );
        let store2 = store.clone();
        let read = tokio::spawn(async move { store2.events_after(Some(0), 100).await });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        tx.commit().await.expect("commit");
        let rows = read.await.expect("join").expect("read");
        let ids: Vec<&str> = rows
            .iter()
            .map(|(_, body)| {
                if body.contains("slow") {
                    "slow"
                } else {
                    "fast"
                }
            })
            .collect();
        assert_eq!(
            ids,
            ["slow", "fast"],
            "both, in sequence order: a reader that had answered `fast` alone would have \
             moved past `slow` for good"
        );
    });
}

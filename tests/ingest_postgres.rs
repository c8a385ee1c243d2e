//! The PostgreSQL store against a real server (tests/pg_support): the schema is created on an
//! empty database at the current version, reopened as it is, created once when replicas start
//! together, and a newer or foreign database is refused and left as it was. The password never
//! appears in an error, and TLS is never silently dropped.

mod pg_support;

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
    let pg = PgCluster::start();
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
    let pg = PgCluster::start();
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
    let pg = PgCluster::start();
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
    let pg = PgCluster::start();
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
    let pg = PgCluster::start();
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
    let pg = PgCluster::start();
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

//! The live view's server side without a browser, against a real in-process ingest on
//! 127.0.0.1:0: sign-in and its cookie, the back-off, CSRF on state-changing calls, the
//! security headers, the one-time sign-in link, and the event stream receiving a committed
//! event. Each case runs on both stores (`name::sqlite`, `name::postgres`, tests/store_support).
//! The browser itself is driven in tests/web_browser.rs.

mod ingest_support;
mod pg_support;
mod store_support;

use std::time::{Duration, Instant};

use bounded_observe_mcp::ingest::{self, RunningIngest};
use serde_json::{json, Value};
use store_support::{StoreKind, TestDb};

const IO_TIMEOUT: Duration = Duration::from_secs(60);

struct Web {
    running: RunningIngest,
    _dir: TestDb,
    http: reqwest::Client,
    base: String,
}

async fn start(store: StoreKind) -> Web {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = TestDb::new(store);
    let running = ingest::start(dir.config()).await.expect("ingest starts");
    let base = running.base_url();
    Web {
        running,
        _dir: dir,
        http: reqwest::Client::builder()
            .timeout(IO_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client"),
        base,
    }
}

impl Web {
    async fn sign_in(&self, secret: &str) -> reqwest::Response {
        self.http
            .post(format!("{}/ui/signin", self.base))
            .json(&json!({ "secret": secret }))
            .send()
            .await
            .expect("request")
    }

    /// Signs in with the right secret; the `Cookie` header value to send.
    async fn session(&self) -> String {
        let r = self.sign_in(self.running.admin_secret()).await;
        assert_eq!(r.status(), 200);
        cookie_of(&r)
    }

    /// `GET path` on the session cookie.
    async fn get(&self, path: &str, cookie: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.base))
            .header("cookie", cookie)
            .send()
            .await
            .expect("request")
    }

    /// `GET path` on the session cookie, answered with JSON.
    async fn get_json(&self, path: &str, cookie: &str) -> Value {
        self.get(path, cookie).await.json().await.expect("json")
    }

    async fn csrf(&self, cookie: &str) -> String {
        let v = self.get_json("/ui/session", cookie).await;
        v["csrf"].as_str().expect("csrf token").to_string()
    }

    async fn mint_with(&self, cookie: &str, csrf: Option<&str>) -> reqwest::Response {
        let mut req = self
            .http
            .post(format!("{}/v1/admin/keys", self.base))
            .header("cookie", cookie)
            .json(&json!({ "org": "acme" }));
        if let Some(t) = csrf {
            req = req.header("x-csrf-token", t);
        }
        req.send().await.expect("request")
    }
}

/// `bounded_session=<value>` from a `Set-Cookie` answer.
fn cookie_of(r: &reqwest::Response) -> String {
    let set = r
        .headers()
        .get("set-cookie")
        .expect("Set-Cookie")
        .to_str()
        .expect("ascii");
    set.split(';').next().expect("pair").trim().to_string()
}

both_stores!(sign_in_sets_a_hardened_session_cookie_the_api_accepts);
async fn sign_in_sets_a_hardened_session_cookie_the_api_accepts(store: StoreKind) {
    let web = start(store).await;
    let wrong = web.sign_in("not-the-admin-secret").await;
    assert_eq!(wrong.status(), 401);
    assert!(wrong.headers().get("set-cookie").is_none());

    let r = web.sign_in(web.running.admin_secret()).await;
    assert_eq!(r.status(), 200);
    let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(set.contains(attr), "{attr} missing: {set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP on loopback: {set}");
    let cookie = cookie_of(&r);
    assert!(cookie.len() > 40, "a long random value: {cookie}");

    let events = |c: Option<&str>| {
        let mut req = web.http.get(format!("{}/v1/events", web.base));
        if let Some(c) = c {
            req = req.header("cookie", c);
        }
        req.send()
    };
    assert_eq!(events(Some(&cookie)).await.unwrap().status(), 200);
    assert_eq!(events(None).await.unwrap().status(), 401);
    assert_eq!(
        events(Some("bounded_session=forged"))
            .await
            .unwrap()
            .status(),
        401
    );
    // The bearer secret keeps working.
    let bearer = web
        .http
        .get(format!("{}/v1/admin/sensors", web.base))
        .bearer_auth(web.running.admin_secret())
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status(), 200);
    // A wrong bearer is not rescued by a good cookie: the header that is there is checked.
    let both = web
        .http
        .get(format!("{}/v1/events", web.base))
        .header("cookie", &cookie)
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(both.status(), 401);

    // Signing out ends the session.
    let csrf = web.csrf(&cookie).await;
    let out = web
        .http
        .post(format!("{}/ui/signout", web.base))
        .header("cookie", &cookie)
        .header("x-csrf-token", &csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 204);
    assert_eq!(events(Some(&cookie)).await.unwrap().status(), 401);
    web.running.shutdown().await.expect("shutdown");
}

both_stores!(sign_in_form_posts_are_refused);
async fn sign_in_form_posts_are_refused(store: StoreKind) {
    let web = start(store).await;
    // A cross-site form can only send form encodings; sign-in takes JSON only.
    let r = web
        .http
        .post(format!("{}/ui/signin", web.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("secret={}", web.running.admin_secret()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    assert!(r.headers().get("set-cookie").is_none());
    web.running.shutdown().await.expect("shutdown");
}

both_stores!(five_failures_within_a_minute_make_the_next_try_wait);
async fn five_failures_within_a_minute_make_the_next_try_wait(store: StoreKind) {
    let web = start(store).await;
    for i in 0..5 {
        let r = web.sign_in(&format!("wrong-{i}")).await;
        assert_eq!(r.status(), 401, "try {i}");
    }
    // Even the right secret waits now: the back-off does not tell a guesser which try was right.
    let r = web.sign_in(web.running.admin_secret()).await;
    assert_eq!(r.status(), 429);
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    assert!(r.headers().get("set-cookie").is_none());
    // The bearer API is not held back by the page's sign-in failures.
    let bearer = web
        .http
        .get(format!("{}/v1/events", web.base))
        .bearer_auth(web.running.admin_secret())
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status(), 200);
    web.running.shutdown().await.expect("shutdown");
}

both_stores!(state_changing_calls_on_the_cookie_need_the_csrf_token);
async fn state_changing_calls_on_the_cookie_need_the_csrf_token(store: StoreKind) {
    let web = start(store).await;
    let cookie = web.session().await;
    let none = web.mint_with(&cookie, None).await;
    assert_eq!(none.status(), 401);
    let wrong = web.mint_with(&cookie, Some("0123456789")).await;
    assert_eq!(wrong.status(), 401);
    let csrf = web.csrf(&cookie).await;
    let ok = web.mint_with(&cookie, Some(&csrf)).await;
    assert_eq!(ok.status(), 201);
    let minted: Value = ok.json().await.unwrap();
    let key_id = minted["keyId"].as_str().unwrap().to_string();

    let revoke = |csrf: Option<String>| {
        let mut req = web
            .http
            .delete(format!("{}/v1/admin/keys/{key_id}", web.base))
            .header("cookie", &cookie);
        if let Some(t) = csrf {
            req = req.header("x-csrf-token", t);
        }
        req.send()
    };
    assert_eq!(revoke(None).await.unwrap().status(), 401);
    let keys = web.get_json("/ui/keys", &cookie).await;
    assert!(
        keys["keys"][0].get("revokedAt").is_none(),
        "not revoked without the token: {keys}"
    );
    assert_eq!(revoke(Some(csrf)).await.unwrap().status(), 204);
    let keys = web.get_json("/ui/keys", &cookie).await;
    assert!(keys["keys"][0]["revokedAt"].is_string(), "{keys}");
    web.running.shutdown().await.expect("shutdown");
}

both_stores!(pages_carry_the_content_security_policy_and_no_inline_code);
async fn pages_carry_the_content_security_policy_and_no_inline_code(store: StoreKind) {
    let web = start(store).await;
    for (path, ctype) in [
        ("/", "text/html"),
        ("/assets/app.js", "text/javascript"),
        ("/assets/app.css", "text/css"),
    ] {
        let r = web
            .http
            .get(format!("{}{path}", web.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let h = r.headers();
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.starts_with("default-src 'self'"), "{path}: {csp}");
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert!(h["content-type"].to_str().unwrap().starts_with(ctype));
        let body = r.text().await.unwrap();
        if path == "/" {
            // Every script has a src (no inline script), no style element or attribute, nothing
            // loaded from another origin.
            assert_eq!(
                body.matches("<script").count(),
                body.matches("<script src=\"/assets/").count(),
                "{body}"
            );
            assert!(
                !body.contains("<style") && !body.contains("style="),
                "{body}"
            );
            assert!(!body.contains("http://") && !body.contains("https://"));
            for handler in ["onclick=", "onload=", "onsubmit=", "onerror="] {
                assert!(!body.contains(handler), "inline handler {handler}");
            }
        }
        if path == "/assets/app.js" {
            assert!(!body.contains("innerHTML") && !body.contains("insertAdjacentHTML"));
            assert!(!body.contains("eval("));
        }
    }
    web.running.shutdown().await.expect("shutdown");
}

both_stores!(the_sign_in_link_opens_a_session_once);
async fn the_sign_in_link_opens_a_session_once(store: StoreKind) {
    let web = start(store).await;
    let link = web.running.sign_in_link().expect("link");
    assert!(
        link.starts_with(&format!("{}/ui/link?t=", web.base)),
        "{link}"
    );
    let r = web.http.get(&link).send().await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/");
    let cookie = cookie_of(&r);
    let s = web.get("/ui/session", &cookie).await;
    assert_eq!(s.status(), 200);
    let again = web.http.get(&link).send().await.unwrap();
    assert_eq!(again.status(), 401);
    assert!(again.headers().get("set-cookie").is_none());
    web.running.shutdown().await.expect("shutdown");
}

fn event(id: &str, action: &str) -> Value {
    json!({
        "v": 2, "id": id, "ts": "2026-11-29T19:00:00.000Z", "class": "action",
        "rec": { "rail": "mcp", "action": action, "registryVersion": null, "fields": { "amount_cents": 4900 } },
        "dest": { "host": "mcp://payments", "pathTemplate": format!("/{action}"), "method": "POST" },
        "actor": { "id": "mcp:sensor", "kind": "agent", "grade": "attested" },
        "status": 200, "dur_ms": 1.25, "bytes": { "req": 120, "resp": 300 },
    })
}

/// Reads the stream until `needle` shows up; the text read.
async fn read_until(resp: &mut reqwest::Response, needle: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    let mut text = String::new();
    while !text.contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, resp.chunk()).await {
            Ok(Ok(Some(c))) => text.push_str(&String::from_utf8_lossy(&c)),
            other => panic!("{needle} not streamed within {within:?} ({other:?}): {text}"),
        }
    }
    text
}

both_stores!(the_stream_pushes_a_committed_event_and_ends_at_shutdown);
async fn the_stream_pushes_a_committed_event_and_ends_at_shutdown(store: StoreKind) {
    let web = start(store).await;
    let admin = web.running.admin_client().unwrap();
    let key = admin.mint("acme", Some("s")).await.unwrap();
    let post = |id: &str| {
        web.http
            .post(format!("{}/v1/events", web.base))
            .bearer_auth(&key.token)
            .json(
                &json!({ "v": 2, "sensor": { "version": "0.1.0", "transport": "stdio" },
                           "dropped": 0, "events": [event(id, "issue_refund")] }),
            )
            .send()
    };
    let before = "0000000000000000000000000000000a";
    assert_eq!(post(before).await.unwrap().status(), 200);

    let unauth = web
        .http
        .get(format!("{}/ui/stream", web.base))
        .send()
        .await
        .unwrap();
    assert_eq!(unauth.status(), 401);

    let cookie = web.session().await;
    let mut stream = web.get("/ui/stream", &cookie).await;
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    // The backlog first.
    let text = read_until(&mut stream, before, Duration::from_secs(10)).await;
    assert!(text.contains("event: ev\n"), "{text}");

    // Then a commit, pushed without asking again.
    let live = "0000000000000000000000000000000b";
    let posted = Instant::now();
    assert_eq!(post(live).await.unwrap().status(), 200);
    let text = read_until(&mut stream, live, Duration::from_secs(5)).await;
    let took = posted.elapsed();
    let line = text
        .lines()
        .find(|l| l.starts_with("data: ") && l.contains(live))
        .expect("data line");
    let ev: Value = serde_json::from_str(&line["data: ".len()..]).expect("one JSON envelope");
    assert_eq!(ev["org"], "acme", "the stored envelope, stamped: {ev}");
    assert_eq!(ev["rec"]["action"], "issue_refund");
    eprintln!("committed event streamed {took:?} after the POST began");

    // Resuming after the first event sends only what came later.
    let first_seq = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("id: "))
        .expect("an id line")
        .parse::<i64>()
        .unwrap()
        - 1;
    let mut resumed = web
        .http
        .get(format!("{}/ui/stream", web.base))
        .header("cookie", &cookie)
        .header("last-event-id", first_seq.to_string())
        .send()
        .await
        .unwrap();
    let text = read_until(&mut resumed, live, Duration::from_secs(10)).await;
    assert!(!text.contains(before), "{text}");

    // Shutdown ends open streams instead of waiting out the grace period.
    let t = Instant::now();
    web.running.shutdown().await.expect("shutdown");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    drop(stream);
    drop(resumed);
}

both_stores!(tools_figures_cover_the_last_hour);
async fn tools_figures_cover_the_last_hour(store: StoreKind) {
    let web = start(store).await;
    let admin = web.running.admin_client().unwrap();
    let key = admin.mint("acme", None).await.unwrap();
    let events: Vec<Value> = (0..4)
        .map(|i| event(&format!("{i:032x}"), "search"))
        .collect();
    let r = web
        .http
        .post(format!("{}/v1/events", web.base))
        .bearer_auth(&key.token)
        .json(
            &json!({ "v": 2, "sensor": { "version": "0.1.0", "transport": "stdio" },
                       "dropped": 0, "events": events }),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let cookie = web.session().await;
    let v = web.get_json("/ui/tools?org=acme", &cookie).await;
    let t = &v["tools"][0];
    assert_eq!(t["tool"], "search", "{v}");
    assert_eq!(t["calls"], 4);
    assert_eq!(t["perMinute"]["calls"][59], 4);
    assert_eq!(t["durMs"]["p99"], 1.25);
    let other = web.get_json("/ui/tools?org=other", &cookie).await;
    assert_eq!(other["tools"], json!([]));
    web.running.shutdown().await.expect("shutdown");
}

both_stores!(planted_canaries_reach_no_byte_the_live_view_serves);
/// Private values planted in a real sensor's call arguments (under innocent and guilty key
/// names) appear in none of the bytes the live view serves: the stream, the tools figures, the
/// keys and the sensors counters the page reads.
async fn planted_canaries_reach_no_byte_the_live_view_serves(store: StoreKind) {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};

    const JWT: &str = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjYW5hcnkifQ.c2lnbmF0dXJlY2FuYXJ5";
    let canaries = [
        "canary.person@example.org",
        "4242 4242 4242 4242",
        JWT,
        "sk_live_CANARY0123456789abcdef",
        "hunter2-canary-password",
    ];
    let web = start(store).await;
    let admin = web.running.admin_client().unwrap();
    let key = admin.mint("acme", None).await.unwrap();

    let fixture = std::path::Path::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
        .parent()
        .expect("target dir")
        .join("examples/report_fixture");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("BOUNDED_") {
            cmd.env_remove(&k);
        }
    }
    let mut child = cmd
        .env("BOUNDED_SENSOR_TOKEN", &key.token)
        .env("BOUNDED_INGEST_BASE", &web.base)
        .arg("--")
        .arg(fixture)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn wrapper (cargo build --examples first)");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let msgs = [
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": { "name": "canary", "version": "1" } } }),
        json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }),
        json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "issue_refund", "arguments": {
                "amount_cents": 4900,
                "customer_email": canaries[0], "note": format!("mail {}", canaries[0]),
                "card_number": canaries[1], "reason": format!("card {}", canaries[1]),
                "memo": canaries[2], "authToken": canaries[2],
                "api_key": canaries[3], "sku": canaries[3],
                "password": canaries[4], "description": canaries[4],
            } } }),
    ];
    for m in &msgs {
        writeln!(stdin, "{m}").expect("write");
        if m.get("id").is_some() {
            let mut line = String::new();
            stdout.read_line(&mut line).expect("answer");
        }
    }
    drop(stdin);
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .expect("wrapper exits");
    assert!(status.success());

    let cookie = web.session().await;
    let mut served = String::new();
    let mut stream = web.get("/ui/stream", &cookie).await;
    served.push_str(&read_until(&mut stream, "issue_refund", Duration::from_secs(10)).await);
    drop(stream);
    for path in ["/ui/tools", "/ui/keys", "/v1/admin/sensors", "/v1/rollups"] {
        let r = web
            .http
            .get(format!("{}{path}", web.base))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        served.push_str(&r.text().await.unwrap());
    }
    assert!(
        served.contains("4900"),
        "the allowed amount is shown: {served}"
    );
    for c in canaries {
        assert!(!served.contains(c), "{c} served by the live view: {served}");
    }
    web.running.shutdown().await.expect("shutdown");
}

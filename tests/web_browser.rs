//! The live view in a real browser: headless Chromium driven by chromedriver over W3C
//! WebDriver (JSON over HTTP on loopback; the few commands used are spoken directly with
//! reqwest, see [`Driver`]). One browser session walks every page: sign-in (a wrong secret
//! refused, the right one accepted), an event from the real wrapper around a fixture server
//! appearing without a reload, the filters, pause and resume, the stored envelope, the XSS
//! cases, the tools page, minting and revoking. A screenshot of each page is saved under
//! `target/web-screenshots/` for review.
//!
//! Needs `chromium` and `chromium-driver` (Debian; scripts/test-deps.sh installs them).
//! `BOUNDED_CHROMIUM` and `BOUNDED_CHROMEDRIVER` override the paths.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bounded_observe_mcp::ingest::{self, IngestConfig};
use serde_json::{json, Value};

/// Bound for page changes that do not depend on the live push (loaded 2-core machine).
const WAIT: Duration = Duration::from_secs(20);
/// The bound from a committed event to its row, without a reload.
const LIVE_WITHIN: Duration = Duration::from_secs(2);
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
const XSS_TOOL: &str = "<img src=x onerror=alert(1)>";
const XSS_OBO: &str = "\"><script>window.__xss=1;alert(2)</script>";
const ADMIN_SECRET: &str = "browser-test-admin-secret-0123456789abcdef";

fn tool_path(env: &str, default: &str) -> PathBuf {
    std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn screenshots_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .join("web-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

/// A chromedriver process and one browser session on it.
struct Driver {
    http: reqwest::Client,
    base: String,
    session: String,
    process: Child,
    _profile: tempfile::TempDir,
}

impl Driver {
    async fn start() -> Driver {
        let driver_bin = tool_path("BOUNDED_CHROMEDRIVER", "/usr/bin/chromedriver");
        let chromium = tool_path("BOUNDED_CHROMIUM", "/usr/bin/chromium");
        assert!(
            driver_bin.exists() && chromium.exists(),
            "{} and {} are needed (apt-get install chromium chromium-driver; \
             scripts/test-deps.sh does it)",
            driver_bin.display(),
            chromium.display()
        );
        let port = free_port();
        // Its own process group, which the browser it starts joins: dropping the driver (also
        // when a test panics) ends them all, so no Chromium outlives the test.
        let process = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spawn chromedriver");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        let base = format!("http://127.0.0.1:{port}");
        let up = Instant::now();
        while http.get(format!("{base}/status")).send().await.is_err() {
            assert!(up.elapsed() < WAIT, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir().expect("profile dir");
        // Without the background-networking switches Chromium dials out at start (component
        // updates, sync, QUIC probes), which a closed network answers by refusing.
        let args = vec![
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            "--window-size=1400,900".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "unhandledPromptBehavior": "ignore",
            "goog:chromeOptions": { "binary": chromium, "args": args },
        }}});
        let r: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .expect("new session")
            .json()
            .await
            .expect("json");
        let session = r["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no browser session: {r}"))
            .to_string();
        Driver {
            http,
            base,
            session,
            process,
            _profile: profile,
        }
    }

    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut req = self.http.request(method, url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r: Value = req
            .send()
            .await
            .expect("webdriver")
            .json()
            .await
            .expect("json");
        r["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    /// Runs `script` in the page and returns its value.
    async fn js(&self, script: &str) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
        .await
    }

    async fn find(&self, css: &str) -> String {
        let start = Instant::now();
        loop {
            let v = self
                .cmd(
                    reqwest::Method::POST,
                    "/element",
                    Some(json!({ "using": "css selector", "value": css })),
                )
                .await;
            if let Some(id) = v[ELEMENT].as_str() {
                return id.to_string();
            }
            assert!(start.elapsed() < WAIT, "no element {css}: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn click(&self, css: &str) {
        let id = self.find(css).await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{id}/click"),
            Some(json!({})),
        )
        .await;
    }

    async fn clear(&self, css: &str) {
        let id = self.find(css).await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{id}/clear"),
            Some(json!({})),
        )
        .await;
    }

    async fn type_in(&self, css: &str, text: &str) {
        let id = self.find(css).await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    /// Waits until `script` (an expression) is truthy in the page; how long it took.
    async fn wait_for(&self, script: &str, within: Duration) -> Duration {
        let start = Instant::now();
        loop {
            let v = self.js(&format!("return !!({script});")).await;
            if v == Value::Bool(true) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < within,
                "not true within {within:?}: {script} (last answer {v})"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits until the events table shows `rows` rows (the filters apply as they are typed).
    async fn wait_for_rows(&self, rows: usize) {
        self.wait_for(
            &format!("document.querySelectorAll('#events-body tr').length === {rows}"),
            WAIT,
        )
        .await;
    }

    /// The text of an open alert, if one is open.
    async fn alert_text(&self) -> Option<String> {
        let v = self.cmd(reqwest::Method::GET, "/alert/text", None).await;
        v.as_str().map(str::to_owned)
    }

    async fn screenshot(&self, name: &str) {
        let v = self.cmd(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("screenshot data"))
            .expect("base64");
        let path = screenshots_dir().join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        eprintln!("screenshot: {}", path.display());
    }

    /// Ends the browser session politely; dropping the driver then ends the processes.
    async fn quit(self) {
        let _ = self
            .http
            .delete(format!("{}/session/{}", self.base, self.session))
            .send()
            .await;
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.process.id()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.process.wait();
    }
}

/// The real wrapper around the fixture server in examples/, reporting to the ingest.
struct Sensor {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Sensor {
    fn start(base: &str, token: &str, on_behalf_of: &str) -> Sensor {
        Sensor::around("report_fixture", base, token, on_behalf_of)
    }

    /// The wrapper around `server`, one of the fixture servers in examples/.
    fn around(server: &str, base: &str, token: &str, on_behalf_of: &str) -> Sensor {
        let fixture = Path::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
            .parent()
            .expect("target dir")
            .join("examples")
            .join(server);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"));
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("BOUNDED_") {
                cmd.env_remove(&k);
            }
        }
        let mut child = cmd
            .env("BOUNDED_SENSOR_TOKEN", token)
            .env("BOUNDED_INGEST_BASE", base)
            .env("BOUNDED_ON_BEHALF_OF", on_behalf_of)
            .env("BOUNDED_FLUSH_MS", "100")
            .arg("--")
            .arg(fixture)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn wrapper (cargo build --examples first)");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut s = Sensor {
            child,
            stdin,
            stdout,
            next_id: 0,
        };
        s.request(
            "initialize",
            json!({ "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": { "name": "browser-test", "version": "1" } }),
        );
        writeln!(
            s.stdin,
            "{}",
            json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })
        )
        .expect("write");
        s.request("tools/list", json!({}));
        s
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let msg =
            json!({ "jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params });
        writeln!(self.stdin, "{msg}").expect("write request");
        self.stdin.flush().expect("flush");
        // Notifications (a server's `list_changed`) may come before the answer.
        loop {
            let mut line = String::new();
            self.stdout.read_line(&mut line).expect("read response");
            let v: Value = serde_json::from_str(&line).expect("response is JSON");
            if v.get("id").is_some() {
                return v;
            }
        }
    }

    fn call(&mut self, tool: &str) {
        let r = self.request(
            "tools/call",
            json!({ "name": tool, "arguments": { "amount_cents": 4900 } }),
        );
        assert!(r.get("result").is_some(), "{r}");
    }

    fn stop(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
    }
}

/// Rows in the live list whose tool cell is exactly `tool`.
fn rows_with_tool(tool: &str) -> String {
    format!(
        "[...document.querySelectorAll('#events-body td.tool')].filter(td => td.textContent === {}).length",
        serde_json::to_string(tool).expect("json")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_view_in_a_real_browser() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = IngestConfig::ephemeral(dir.path().join("ingest.db"));
    cfg.admin_secret = Some(ADMIN_SECRET.to_string());
    let running = ingest::start(cfg).await.expect("ingest starts");
    let base = running.base_url();
    let admin = running.admin_client().expect("admin");
    let key = admin
        .mint("acme", Some("browser sensor"))
        .await
        .expect("mint");

    let d = Driver::start().await;

    // Sign-in: a wrong secret is refused, the right one accepted.
    d.goto(&format!("{base}/")).await;
    d.wait_for("!document.getElementById('signin').hidden", WAIT)
        .await;
    d.type_in("#secret", "wrong-secret").await;
    d.click("#signin-btn").await;
    d.wait_for(
        "document.getElementById('signin-error').textContent.length > 0",
        WAIT,
    )
    .await;
    assert_eq!(
        d.js("return document.getElementById('live').hidden;").await,
        Value::Bool(true)
    );
    d.screenshot("signin").await;
    d.type_in("#secret", ADMIN_SECRET).await;
    d.click("#signin-btn").await;
    d.wait_for("!document.getElementById('live').hidden", WAIT)
        .await;
    d.wait_for(
        "document.getElementById('live-state').textContent === 'live'",
        WAIT,
    )
    .await;
    // The cookie is HttpOnly: the page's script cannot read it.
    assert_eq!(
        d.js("return document.cookie;").await,
        Value::String(String::new())
    );

    // An event from the real sensor shows up without a reload.
    d.js("window.__marker = 'same page'; return 1;").await;
    let mut sensor = Sensor::start(&base, &key.token, "acme-corp");
    sensor.call("issue_refund");
    let took = d
        .wait_for(
            &format!("{} === 1", rows_with_tool("issue_refund")),
            LIVE_WITHIN,
        )
        .await;
    eprintln!("sensor call to row in the page: {took:?}");
    assert_eq!(
        d.js("return window.__marker;").await,
        Value::String("same page".into()),
        "the page was not reloaded"
    );
    sensor.call("lookup_customer");
    d.wait_for(
        &format!("{} === 1", rows_with_tool("lookup_customer")),
        LIVE_WITHIN,
    )
    .await;
    let obo = d
        .js("return document.querySelector('#events-body td.obo').textContent;")
        .await;
    assert_eq!(obo, Value::String("acme-corp".into()));

    // Filters: by tool, then by a class no row has, then cleared.
    d.type_in("#f-tool", "lookup").await;
    d.wait_for_rows(1).await;
    assert_eq!(
        d.js(&format!("return {};", rows_with_tool("lookup_customer")))
            .await,
        json!(1)
    );
    d.clear("#f-tool").await;
    d.js(
        "const s = document.getElementById('f-class'); s.value = 'error'; \
          s.dispatchEvent(new Event('change')); return 1;",
    )
    .await;
    d.wait_for_rows(0).await;
    d.js(
        "const s = document.getElementById('f-class'); s.value = ''; \
          s.dispatchEvent(new Event('change')); return 1;",
    )
    .await;
    d.type_in("#f-org", "acme").await;
    d.wait_for_rows(2).await;
    d.clear("#f-org").await;
    d.type_in("#f-org", "other-org").await;
    d.wait_for_rows(0).await;
    d.clear("#f-org").await;
    d.js("document.getElementById('f-org').dispatchEvent(new Event('input')); return 1;")
        .await;
    d.wait_for_rows(2).await;
    d.type_in("#f-status", "500").await;
    d.wait_for_rows(0).await;
    d.clear("#f-status").await;
    d.type_in("#f-status", "200").await;
    d.wait_for_rows(2).await;
    d.clear("#f-status").await;
    d.type_in("#f-actor", "no-such-actor").await;
    d.wait_for_rows(0).await;
    d.clear("#f-actor").await;
    d.type_in("#f-actor", &format!("mcp:{}", key.key_id)).await;
    d.wait_for_rows(2).await;
    d.clear("#f-actor").await;
    d.js("document.getElementById('f-actor').dispatchEvent(new Event('input')); return 1;")
        .await;

    // Pause holds new events back; resume shows them.
    d.click("#pause").await;
    sensor.call("pause_probe");
    d.wait_for(
        "document.getElementById('live-state').textContent === 'paused (1 new)'",
        WAIT,
    )
    .await;
    assert_eq!(
        d.js(&format!("return {};", rows_with_tool("pause_probe")))
            .await,
        json!(0)
    );
    d.click("#pause").await;
    d.wait_for(&format!("{} === 1", rows_with_tool("pause_probe")), WAIT)
        .await;
    sensor.stop();

    // The XSS cases: a tool name and an onBehalfOf made of markup, through the real sensor.
    let mut hostile = Sensor::start(&base, &key.token, XSS_OBO);
    hostile.call(XSS_TOOL);
    d.wait_for(&format!("{} === 1", rows_with_tool(XSS_TOOL)), WAIT)
        .await;
    hostile.stop();
    let obo_cells = d
        .js("return [...document.querySelectorAll('#events-body td.obo')].map(td => td.textContent);")
        .await;
    assert!(
        obo_cells
            .as_array()
            .expect("cells")
            .contains(&Value::String(XSS_OBO.into())),
        "{obo_cells}"
    );
    // Give an injected handler time to fire, then look for any trace of it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(d.alert_text().await, None, "an alert opened");
    assert_eq!(
        d.js("return typeof window.__xss;").await,
        json!("undefined")
    );
    assert_eq!(
        d.js("return document.querySelectorAll('#events-body img, #events-body script').length;")
            .await,
        json!(0)
    );

    // A click opens the stored envelope.
    d.js("[...document.querySelectorAll('#events-body tr')]\
          .find(tr => tr.querySelector('td.tool').textContent === 'issue_refund').click(); return 1;")
        .await;
    d.wait_for("!document.getElementById('envelope-box').hidden", WAIT)
        .await;
    let envelope: Value = serde_json::from_str(
        d.js("return document.getElementById('envelope').textContent;")
            .await
            .as_str()
            .expect("text"),
    )
    .expect("the envelope is JSON");
    assert_eq!(envelope["rec"]["action"], "issue_refund");
    assert_eq!(envelope["org"], "acme");
    assert_eq!(envelope["sensor"], key.key_id.as_str());
    d.screenshot("live").await;
    d.click("#envelope-close").await;

    // Evidence for the tools page, through the real sensor: two failures that differ only in
    // an id (one fingerprint), then a catalog that changes mid-session (a definition drift).
    let mut drifting = Sensor::around("drift_server", &base, &key.token, "acme-corp");
    for n in [1, 2] {
        let r = drifting.request(
            "tools/call",
            json!({ "name": "boom", "arguments": { "n": n } }),
        );
        assert!(r.get("error").is_some(), "{r}");
    }
    drifting.request("tools/call", json!({ "name": "mutate", "arguments": {} }));
    drifting.request("tools/list", json!({}));
    drifting.stop();

    // Tools page.
    d.click("#nav-tools").await;
    d.wait_for(
        "document.querySelectorAll('#tools-list .tool').length >= 4",
        WAIT,
    )
    .await;
    let tools_text = d
        .js("return document.getElementById('tools-list').textContent;")
        .await;
    let tools_text = tools_text.as_str().expect("text");
    assert!(tools_text.contains("issue_refund") && tools_text.contains("p95"));
    assert!(tools_text.contains(XSS_TOOL), "the tool name as text");
    // A tool without errors has no groups to show, and says so; `boom` failed twice the same
    // way: one group of two.
    assert!(
        tools_text.contains("Error groups: not reported"),
        "{tools_text}"
    );
    let boom = d
        .js("return [...document.querySelectorAll('#tools-list .tool')]\
             .find(b => b.querySelector('h3').textContent === 'boom').textContent;")
        .await;
    let boom = boom.as_str().expect("a box for boom");
    assert!(
        boom.contains("Error groups by fingerprint:") && boom.contains(": 2 ×"),
        "{boom}"
    );
    // `/v1/tools` flags the definition the server replaced mid-session.
    d.wait_for(
        "[...document.querySelectorAll('#drift li')].some(li => li.textContent.includes('refund') \
         && li.textContent.includes('changed'))",
        WAIT,
    )
    .await;
    assert_eq!(
        d.js("return document.querySelectorAll('#tools-list svg.chart').length >= 4;")
            .await,
        json!(true)
    );
    assert_eq!(
        d.js("return document.querySelectorAll('#tools-list img').length;")
            .await,
        json!(0)
    );
    d.screenshot("tools").await;

    // Sensors and keys: mint through the page, then revoke with a confirmation.
    d.click("#nav-sensors").await;
    d.wait_for(
        "document.querySelectorAll('#keys-body tr').length === 1",
        WAIT,
    )
    .await;
    let row = d
        .js("return document.querySelector('#keys-body tr').textContent;")
        .await;
    assert!(
        row.as_str().expect("text").contains("stdio"),
        "transport shown: {row}"
    );
    d.type_in("#mint-org", "globex").await;
    d.type_in("#mint-name", "ci-runner").await;
    d.click("#mint-btn").await;
    d.wait_for("!document.getElementById('minted').hidden", WAIT)
        .await;
    let token = d
        .js("return document.getElementById('minted-token').textContent;")
        .await;
    let token = token.as_str().expect("token").to_string();
    let snippet = d
        .js("return document.getElementById('minted-snippet').textContent;")
        .await;
    let snippet: Value = serde_json::from_str(snippet.as_str().expect("text")).expect("JSON");
    assert_eq!(
        snippet["mcpServers"]["ci-runner"]["env"]["BOUNDED_SENSOR_TOKEN"],
        token.as_str()
    );
    assert_eq!(
        snippet["mcpServers"]["ci-runner"]["env"]["BOUNDED_INGEST_BASE"],
        base.as_str()
    );
    d.wait_for(
        "document.querySelectorAll('#keys-body tr').length === 2",
        WAIT,
    )
    .await;
    // The minted token works as a sensor token.
    let minted_id = token
        .split('.')
        .nth(1)
        .expect("token names its key")
        .to_string();
    let probe = reqwest::Client::new()
        .post(format!("{base}/v1/events"))
        .bearer_auth(&token)
        .json(
            &json!({ "v": 2, "sensor": { "version": "0.1.0", "transport": "http" },
                       "dropped": 0, "events": [] }),
        )
        .send()
        .await
        .expect("post");
    assert_eq!(probe.status(), 200, "the minted token is accepted");
    d.screenshot("sensors").await;

    let revoke_btn = format!("#keys-body tr[data-key='{minted_id}'] button.revoke");
    d.click(&revoke_btn).await;
    d.click(&format!(
        "#keys-body tr[data-key='{minted_id}'] button.confirm-revoke"
    ))
    .await;
    d.wait_for(
        &format!("document.querySelector(\"#keys-body tr[data-key='{minted_id}'] .revoked\")"),
        WAIT,
    )
    .await;
    let after = reqwest::Client::new()
        .post(format!("{base}/v1/events"))
        .bearer_auth(&token)
        .json(
            &json!({ "v": 2, "sensor": { "version": "0.1.0", "transport": "http" },
                       "dropped": 0, "events": [] }),
        )
        .send()
        .await
        .expect("post");
    assert_eq!(after.status(), 401, "revoked through the page");

    // Signing out ends the session: the page asks for the secret again and the API refuses.
    d.click("#signout").await;
    d.wait_for("!document.getElementById('signin').hidden", WAIT)
        .await;
    d.js("fetch('/v1/events').then(r => { window.__after = r.status; }); return 1;")
        .await;
    d.wait_for("window.__after === 401", WAIT).await;

    d.quit().await;
    running.shutdown().await.expect("shutdown");
}

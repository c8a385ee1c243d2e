//! Memory stays bounded when the HTTP proxy (`--http`) relays large tool results to slow
//! clients: 20 clients at once each call a tool whose result is 20 MB, as one JSON body or as
//! one SSE event, and read it slowly; the proxy runs as the real binary with `--ingest
//! file:PATH`, in front of an upstream served from this test process.
//!
//! What is asserted: every client gets its body byte for byte; one event per call with the
//! status the result's `isError` (in its last bytes) gives and the result's exact size in
//! `bytes.resp`; and the proxy's peak RSS (VmHWM, read while it is alive) stays under a
//! generous bound. The benchmark, not this test, holds the figure against its target.
//!
//! `LARGE_RESULTS_PROXY_BIN=<path>` runs another build of the proxy (a release build, another
//! commit's) under the same load, to compare figures; `--nocapture` prints them.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use http_body::{Frame, SizeHint};
use serde_json::Value;

/// Clients calling at once.
const CLIENTS: usize = 20;

/// Bytes of text in each result.
const RESULT_TEXT: usize = 20 * 1024 * 1024;

/// How a slow client reads: [`SLOW_READ`] bytes at a time, each read followed by
/// [`SLOW_PAUSE`] (about 6 MB/s). Every exchange is then in flight at once for seconds, each
/// body partly relayed, and the observer is never the bottleneck (a proxy that held whole
/// bodies reached 310 MiB here).
const SLOW_READ: usize = 1024 * 1024;
const SLOW_PAUSE: Duration = Duration::from_millis(150);

/// Peak RSS the proxy must stay under, debug build included. Generous on purpose: a proxy that
/// holds whole bodies for observation needs hundreds of MiB here.
const RSS_BOUND_KIB: u64 = 128 * 1024;

/// Pieces the upstream writes a result in.
const PIECE: usize = 256 * 1024;

/// Generous: the machine is small and shared.
const WAIT: Duration = Duration::from_secs(120);

/// Runs of the load before a test gives up on one where every call made its event.
const ATTEMPTS: u32 = 3;

/// Only one of these tests runs at a time: each measures a process's memory under a load that
/// takes most of the machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn bin() -> String {
    std::env::var("LARGE_RESULTS_PROXY_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_bounded-observe-mcp").to_string())
}

/// Peak resident set (VmHWM) of a live process, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status")
}

/// How the upstream answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Json,
    Sse,
}

/// A result's bytes, as the upstream sends them: a small head and tail around the shared text.
struct Result3 {
    head: Bytes,
    text: Bytes,
    tail: Bytes,
}

impl Result3 {
    /// The JSON-RPC message for call `id` (the `fail` tool's result has `isError: true`), in the
    /// order rmcp and the Python SDK write (`id` first) for even ids and the TypeScript SDK's
    /// (`id` last) for odd ones; as an SSE body, one `message` event after a progress one.
    fn new(id: u64, is_error: bool, text: &Bytes, answer: Answer) -> Result3 {
        let (mut head, mut tail) = if id.is_multiple_of(2) {
            (
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":""#
                ),
                format!(r#""}}],"isError":{is_error}}}}}"#),
            )
        } else {
            (
                r#"{"result":{"content":[{"type":"text","text":""#.to_string(),
                format!(r#""}}],"isError":{is_error}}},"jsonrpc":"2.0","id":{id}}}"#),
            )
        };
        if answer == Answer::Sse {
            head = format!(
                ": keep-alive\r\n\r\nevent: message\r\ndata: {{\"jsonrpc\":\"2.0\",\
                 \"method\":\"notifications/progress\",\"params\":{{\"progressToken\":{id},\
                 \"progress\":1}}}}\r\n\r\nevent: message\r\nid: {id}\r\ndata: {head}"
            );
            tail.push_str("\r\n\r\n");
        }
        Result3 {
            head: Bytes::from(head),
            text: text.clone(),
            tail: Bytes::from(tail),
        }
    }

    fn len(&self) -> usize {
        self.head.len() + self.text.len() + self.tail.len()
    }

    /// The JSON-RPC message's own length (for SSE: the `data` of its event).
    fn message_len(&self, answer: Answer) -> usize {
        match answer {
            Answer::Json => self.len(),
            Answer::Sse => {
                let head = std::str::from_utf8(&self.head).expect("utf8");
                let data = head.rfind("data: ").expect("data field") + "data: ".len();
                self.len() - data - "\r\n\r\n".len()
            }
        }
    }

    /// Whether `got` is the result's bytes from offset `at`.
    fn matches_at(&self, at: usize, got: &[u8]) -> bool {
        let mut at = at;
        let mut got = got;
        for part in [&self.head, &self.text, &self.tail] {
            if got.is_empty() {
                break;
            }
            if at >= part.len() {
                at -= part.len();
                continue;
            }
            let n = (part.len() - at).min(got.len());
            if part[at..at + n] != got[..n] {
                return false;
            }
            got = &got[n..];
            at = 0;
        }
        got.is_empty()
    }
}

/// A response body of known length, written in pieces: the shared text is never copied.
struct Pieces {
    frames: VecDeque<Bytes>,
    left: u64,
}

impl Pieces {
    fn of(r: &Result3) -> Pieces {
        let mut frames = VecDeque::new();
        frames.push_back(r.head.clone());
        let mut at = 0;
        while at < r.text.len() {
            let end = (at + PIECE).min(r.text.len());
            frames.push_back(r.text.slice(at..end));
            at = end;
        }
        frames.push_back(r.tail.clone());
        Pieces {
            frames,
            left: r.len() as u64,
        }
    }
}

impl http_body::Body for Pieces {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        Poll::Ready(this.frames.pop_front().map(|b| {
            this.left -= b.len() as u64;
            Ok(Frame::data(b))
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

#[derive(Clone)]
struct Upstream {
    text: Bytes,
    answer: Answer,
}

/// The upstream's one endpoint: a `tools/call` is answered with its 20 MB result.
async fn mcp(State(up): State<Upstream>, body: Bytes) -> Response {
    let Ok(req) = serde_json::from_slice::<Value>(&body) else {
        return bad_request();
    };
    let (Some(id), Some(tool)) = (req["id"].as_u64(), req["params"]["name"].as_str()) else {
        return bad_request();
    };
    let result = Result3::new(id, tool == "fail", &up.text, up.answer);
    let mut r = Response::new(Body::new(Pieces::of(&result)));
    let ct = match up.answer {
        Answer::Json => "application/json",
        Answer::Sse => "text/event-stream",
    };
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static(ct));
    r
}

fn bad_request() -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::BAD_REQUEST;
    r
}

/// Serves the upstream, answering with `text` in each result, on a runtime of its own; returns
/// its URL and the runtime (dropping it stops the server).
fn start_upstream(answer: Answer, text: Bytes) -> (String, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let up = Upstream { text, answer };
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = Router::new().route("/mcp", post(mcp)).with_state(up);
    rt.spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/mcp"), rt)
}

/// The proxy under test, observing into `sink`; killed and reaped on drop.
struct Proxy {
    child: Child,
    port: u16,
    stderr: Arc<Mutex<String>>,
}

impl Proxy {
    fn start(upstream: &str, sink: &Path) -> Proxy {
        let ingest = format!("file:{}", sink.display());
        let mut child = Command::new(bin())
            .env_clear()
            .env("BOUNDED_FLUSH_MS", "50")
            .args([
                "--http",
                "--upstream",
                upstream,
                "--ingest",
                &ingest,
                "--debug",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn proxy");
        let mut err = std::io::BufReader::new(child.stderr.take().expect("stderr"));
        let stderr = Arc::new(Mutex::new(String::new()));
        let collected = stderr.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut line = String::new();
            while err.read_line(&mut line).unwrap_or(0) > 0 {
                if let Some(rest) = line.strip_prefix("[observe-mcp] listening http://127.0.0.1:") {
                    let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    let _ = tx.send(port);
                }
                collected.lock().expect("lock").push_str(&line);
                line.clear();
            }
        });
        let port = rx
            .recv_timeout(WAIT)
            .expect("the proxy prints its listening line")
            .parse()
            .expect("port");
        Proxy {
            child,
            port,
            stderr,
        }
    }

    /// Sends SIGTERM and waits for the exit (the events are flushed first).
    fn stop(&mut self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + WAIT;
        while self.child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "the proxy did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The tool call `id` makes: every fourth one fails.
fn tool_of(id: u64) -> &'static str {
    if id % 4 == 3 {
        "fail"
    } else {
        "big"
    }
}

fn request_of(id: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{}","arguments":{{}}}}}}"#,
        tool_of(id)
    )
}

/// One slow client: posts call `id`, reads the answer's head, then its body in slow reads;
/// checks every byte against `want`.
fn slow_client(port: u16, id: u64, want: &Result3) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let body = request_of(id);
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send request");

    // The head, byte by byte up to the blank line: small, and nothing of the body is consumed.
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).expect("read head");
        head.push(b[0]);
    }
    let head = String::from_utf8(head).expect("head is text");
    assert!(head.starts_with("HTTP/1.1 200"), "call {id}: {head}");
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("call {id}: the length passes through: {head}"));
    assert_eq!(length, want.len(), "call {id}");

    let mut buf = vec![0u8; SLOW_READ];
    let mut at = 0;
    while at < length {
        let n = SLOW_READ.min(length - at);
        s.read_exact(&mut buf[..n])
            .unwrap_or_else(|e| panic!("call {id}: the body ended near {at} of {length}: {e}"));
        assert!(
            want.matches_at(at, &buf[..n]),
            "call {id}: bytes differ near {at}"
        );
        at += n;
        std::thread::sleep(SLOW_PAUSE);
    }
    let n = s.read(&mut buf).expect("read past the body");
    assert_eq!(n, 0, "call {id}: nothing after the body");
}

fn events_in(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .flat_map(|l| {
            let batch: Value = serde_json::from_str(l).expect("one batch per line");
            batch["events"].as_array().cloned().unwrap_or_default()
        })
        .collect()
}

/// A counter from a line of `--debug` totals on the proxy's stderr (0 if absent).
fn total(stderr: &str, line: &str, name: &str) -> u64 {
    let key = format!(" {name}=");
    stderr
        .lines()
        .filter(|l| l.contains(line))
        .find_map(|l| {
            let rest = &l[l.find(&key)? + key.len()..];
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Runs the load once with the upstream answering as `answer`; asserts the bodies, the memory
/// bound and that every event written is right. Returns whether every call made its event:
/// false only when the hand-off dropped messages (see [`twenty_slow_readers_of_20_mb`]).
fn run_once(answer: Answer, text: &Bytes) -> bool {
    let (upstream, rt) = start_upstream(answer, text.clone());
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = dir.path().join("events.jsonl");
    let mut proxy = Proxy::start(&upstream, &sink);
    let port = proxy.port;
    let clients: Vec<_> = (0..CLIENTS as u64)
        .map(|id| {
            let want = Result3::new(id, tool_of(id) == "fail", text, answer);
            std::thread::spawn(move || slow_client(port, id, &want))
        })
        .collect();
    for c in clients {
        c.join().expect("client");
    }
    let peak_kib = peak_rss_kib(proxy.child.id());
    proxy.stop();
    drop(rt);
    let stderr = proxy.stderr.lock().expect("lock").clone();
    eprintln!("{answer:?}: proxy peak RSS (VmHWM) {peak_kib} KiB");
    for l in stderr.lines().filter(|l| l.contains("totals")) {
        eprintln!("{l}");
    }
    assert!(
        peak_kib <= RSS_BOUND_KIB,
        "{answer:?}: the proxy peaked at {peak_kib} KiB (bound {RSS_BOUND_KIB} KiB)"
    );

    // Every event written names a call of the load, with its status and exact sizes.
    let events = events_in(&sink);
    let mut seen = Vec::new();
    for e in &events {
        let tool = e["rec"]["action"].as_str().expect("action");
        let want_status = if tool == "fail" { 500 } else { 200 };
        assert_eq!(e["status"], want_status, "{e}");
        let resp = e["bytes"]["resp"].as_u64().expect("bytes.resp");
        let req = e["bytes"]["req"].as_u64().expect("bytes.req");
        // Which call this is: one not yet matched whose tool, request and result sizes these are.
        let id = (0..CLIENTS as u64)
            .find(|&id| {
                tool_of(id) == tool
                    && request_of(id).len() as u64 == req
                    && Result3::new(id, tool == "fail", text, answer).message_len(answer) as u64
                        == resp
                    && !seen.contains(&id)
            })
            .unwrap_or_else(|| panic!("no call has these sizes: {e}"));
        seen.push(id);
    }
    let dropped = total(&stderr, "Observation channel totals", "dropped");
    let unobserved = total(&stderr, "Observer and reporter totals", "unobserved");
    if dropped > 0 {
        // Calls whose answers may have been dropped make no event, and are counted.
        assert_eq!(events.len() as u64 + unobserved, CLIENTS as u64, "{stderr}");
        return false;
    }
    assert_eq!(events.len(), CLIENTS, "{events:?}\nstderr: {stderr}");
    true
}

/// Runs the load until every call makes its event, at most [`ATTEMPTS`] times. The hand-off to
/// the observer drops rather than slow the relay: a run where the observer thread was kept off
/// the CPU long enough (a loaded shared machine) drops messages and is run again.
fn twenty_slow_readers_of_20_mb(answer: Answer) {
    let text = Bytes::from(
        // Letters only: valid inside a JSON string, and a shifted byte shows.
        (0..RESULT_TEXT)
            .map(|i| b'a' + (i % 26) as u8)
            .collect::<Vec<u8>>(),
    );
    for attempt in 1..=ATTEMPTS {
        if run_once(answer, &text) {
            return;
        }
        eprintln!("{answer:?}: attempt {attempt}: the hand-off dropped messages; again");
    }
    panic!("{answer:?}: the hand-off dropped messages in each of {ATTEMPTS} runs");
}

#[test]
fn twenty_slow_readers_of_20_mb_json_results_keep_the_proxy_small() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    twenty_slow_readers_of_20_mb(Answer::Json);
}

#[test]
fn twenty_slow_readers_of_20_mb_sse_results_keep_the_proxy_small() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    twenty_slow_readers_of_20_mb(Answer::Sse);
}

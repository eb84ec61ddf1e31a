//! `weft serve` over real HTTP: start the binary on a free loopback port with the default model
//! and talk to it with a tiny HTTP/1.1 client on `std::net::TcpStream`.
//!
//! Generation on lavapipe is slow (a few tokens a second), so requests ask for few tokens.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn model() -> Option<PathBuf> {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    if path.exists() {
        return Some(path);
    }
    if std::env::var("WEFT_REQUIRE_MODEL").is_ok_and(|v| v == "1") {
        panic!("{} is missing and WEFT_REQUIRE_MODEL=1: run `cargo xtask fetch-model`", path.display());
    }
    eprintln!("skipping: {} is missing (run `cargo xtask fetch-model`)", path.display());
    None
}

/// A running `weft serve`, killed on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
    key: Option<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Server {
    fn start(extra: &[&str]) -> Option<Server> {
        Some(Server::start_with(&model()?, extra))
    }

    fn start_with(model: &std::path::Path, extra: &[&str]) -> Server {
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["serve", "--port", &port.to_string(), "--model"])
            .arg(model)
            .args(extra)
            .env_remove("WEFT_API_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("weft serve starts");
        let key = extra.iter().position(|a| *a == "--api-key").map(|i| extra[i + 1].to_string());
        let mut server = Server { child, addr: SocketAddr::from(([127, 0, 0, 1], port)), key };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!("weft serve exited early: {status}");
            }
            if let Ok(r) = server.request("GET", "/health", None, &[]) {
                if r.status == 200 {
                    let health = r.json();
                    assert_eq!(health["status"], "ok", "{health}");
                    assert!(health["admission"]["max_num_seqs"].as_u64().unwrap() > 0, "{health}");
                    break;
                }
                assert_eq!(r.status, 503, "/health before the model is loaded: {}", r.body);
                assert!(r.json()["status"].is_string(), "{}", r.body);
            }
            assert!(Instant::now() < deadline, "weft serve did not get healthy in time");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        s
    }

    fn send_head(
        &self,
        s: &mut TcpStream,
        method: &str,
        path: &str,
        body_len: Option<usize>,
        headers: &[(&str, &str)],
    ) -> std::io::Result<()> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", self.addr);
        if let Some(n) = body_len {
            head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {n}\r\n"));
        }
        let has_auth = headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("authorization"));
        if let (Some(key), false) = (&self.key, has_auth) {
            head.push_str(&format!("Authorization: Bearer {key}\r\n"));
        }
        for (k, v) in headers {
            if !v.is_empty() {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes())
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        headers: &[(&str, &str)],
    ) -> std::io::Result<Reply> {
        let mut s = TcpStream::connect(self.addr)?;
        s.set_read_timeout(Some(Duration::from_secs(300)))?;
        self.send_head(&mut s, method, path, body.map(<[u8]>::len), headers)?;
        if let Some(b) = body {
            // A server that refuses a large body may answer and close before reading it all.
            let _ = s.write_all(b);
        }
        let mut raw = Vec::new();
        let mut reader = BufReader::new(s);
        match reader.read_to_end(&mut raw) {
            Ok(_) => {}
            Err(e) if !raw.is_empty() => eprintln!("(read ended with {e})"),
            Err(e) => return Err(e),
        }
        Ok(Reply::parse(&raw))
    }

    fn post(&self, path: &str, body: &Value) -> Reply {
        self.request("POST", path, Some(body.to_string().as_bytes()), &[]).unwrap()
    }

    fn metrics(&self) -> String {
        let r = self.request("GET", "/metrics", None, &[]).unwrap();
        assert_eq!(r.status, 200);
        r.body
    }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn parse(raw: &[u8]) -> Reply {
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete HTTP head");
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let mut lines = head.lines();
        let status = lines.next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let mut body = raw[split + 4..].to_vec();
        if headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked")) {
            body = dechunk(&body);
        }
        Reply { status, headers, body: String::from_utf8(body).expect("a UTF-8 body") }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The `data:` payloads of a server-sent-events body.
    fn events(&self) -> Vec<String> {
        self.body.split("\n\n").filter_map(|e| e.trim().strip_prefix("data:")).map(|d| d.trim().to_string()).collect()
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
    out
}

fn chat(content: &str, max_tokens: u64) -> Value {
    json!({"model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0})
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"))
}

#[test]
fn chat_streaming_models_and_metrics() {
    let Some(server) = Server::start(&[]) else { return };

    // Readiness: loaded and not draining.
    let ready = server.request("GET", "/ready", None, &[]).unwrap();
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(ready.json()["status"], "ready");

    let models = server.request("GET", "/v1/models", None, &[]).unwrap();
    assert_eq!(models.status, 200, "{}", models.body);
    assert_eq!(models.json()["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");

    // Non-streaming, greedy.
    let r = server.post("/v1/chat/completions", &chat("What is the capital of France?", 12));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(text.contains("Paris"), "{text:?}");
    assert!(matches!(v["choices"][0]["finish_reason"].as_str(), Some("stop" | "length")), "{v}");
    let usage = &v["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0);
    let completion_tokens = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=12).contains(&completion_tokens), "{usage}");
    assert_eq!(usage["total_tokens"].as_u64(), Some(usage["prompt_tokens"].as_u64().unwrap() + completion_tokens));

    // Streaming the same greedy request assembles the same text.
    let mut req = chat("What is the capital of France?", 12);
    req["stream"] = json!(true);
    req["stream_options"] = json!({"include_usage": true});
    let r = server.post("/v1/chat/completions", &req);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{}", r.body);
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, text);
    let finish = chunks.iter().filter_map(|c| c["choices"][0]["finish_reason"].as_str()).collect::<Vec<_>>();
    assert_eq!(finish, [v["choices"][0]["finish_reason"].as_str().unwrap()]);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"].as_u64(), Some(completion_tokens));

    // Completions, with a stop string.
    let r = server.post(
        "/v1/completions",
        &json!({"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": ["The capital of France is"], "max_tokens": 4, "temperature": 0, "stop": "\n"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert!(!v["choices"][0]["text"].as_str().unwrap().contains('\n'));

    let m = server.metrics();
    for name in [
        "weft_requests_finished_total",
        "weft_prompt_tokens_total",
        "weft_generation_tokens_total",
        "weft_time_to_first_token_seconds_bucket",
        "weft_inter_token_latency_seconds_sum",
        "weft_e2e_request_latency_seconds_count",
        "weft_request_queue_time_seconds_bucket",
        "weft_num_requests_running",
        "weft_num_requests_waiting",
        "weft_kv_blocks_used",
        "weft_kv_blocks_free",
        "weft_kv_blocks_cached",
        "weft_prefix_cache_hits_total",
        "weft_prefix_cache_misses_total",
        "weft_prefix_cache_evictions_total",
        "weft_preemptions_total",
    ] {
        assert!(m.contains(name), "{name} missing from /metrics:\n{m}");
    }
    // vLLM's names beside weft's, labelled with the served model (gateways and dashboards made
    // for vLLM read them).
    let labels = "{model_name=\"SmolLM2-135M-Instruct.Q4_1\",engine=\"0\"}";
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:generation_tokens_total",
    ] {
        assert!(m.contains(&format!("{name}{labels} ")), "{name} missing from /metrics:\n{m}");
    }
    assert_eq!(
        metric(&m, &format!("vllm:generation_tokens_total{labels}")),
        metric(&m, "weft_generation_tokens_total")
    );
    assert_eq!(metric(&m, &format!("vllm:e2e_request_latency_seconds_count{labels}")), 3.0);
    assert!(metric(&m, "weft_generation_tokens_total") >= (2 * completion_tokens) as f64);
    assert_eq!(metric(&m, "weft_e2e_request_latency_seconds_count"), 3.0);
    assert!(m.contains("weft_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3"), "{m}");
}

#[test]
fn bad_requests_get_json_errors() {
    let Some(server) = Server::start(&["--api-key", "sekrit"]) else { return };
    let good = chat("Hi", 1);
    let with = |f: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        f(&mut v);
        v.to_string().into_bytes()
    };
    let bias = |b: Value| with(&|v| v["logit_bias"] = b.clone());
    let long_prompt = json!({"prompt": "hello ".repeat(5000), "max_tokens": 1}).to_string().into_bytes();
    let huge = vec![b'a'; 10 << 20];
    let chat_path = "/v1/chat/completions";
    // (what, path, body, extra headers, status, the error's param)
    type Case<'a> = (&'a str, &'a str, Vec<u8>, Vec<(&'a str, &'a str)>, u16, Option<&'a str>);
    let cases: Vec<Case> = vec![
        ("malformed JSON", chat_path, b"{\"messages\": [".to_vec(), vec![], 400, None),
        ("not an object", chat_path, b"[1, 2]".to_vec(), vec![], 400, None),
        (
            "messages of the wrong type",
            chat_path,
            with(&|v| v["messages"] = json!("hi")),
            vec![],
            400,
            Some("messages"),
        ),
        (
            "temperature of the wrong type",
            chat_path,
            with(&|v| v["temperature"] = json!("hot")),
            vec![],
            400,
            Some("temperature"),
        ),
        ("stop of the wrong type", chat_path, with(&|v| v["stop"] = json!(7)), vec![], 400, Some("stop")),
        ("empty messages", chat_path, with(&|v| v["messages"] = json!([])), vec![], 400, Some("messages")),
        (
            "unknown role",
            chat_path,
            with(&|v| v["messages"][0]["role"] = json!("wizard")),
            vec![],
            400,
            Some("messages"),
        ),
        ("negative max_tokens", chat_path, with(&|v| v["max_tokens"] = json!(-5)), vec![], 400, Some("max_tokens")),
        ("n=17", chat_path, with(&|v| v["n"] = json!(17)), vec![], 400, Some("n")),
        // logit_bias: a key that is no token id, an id past the vocabulary (49152 tokens), a
        // bias out of range, a bias that is no number.
        ("logit_bias key", chat_path, bias(json!({"fifty": 5})), vec![], 400, Some("logit_bias")),
        ("logit_bias id", chat_path, bias(json!({"49152": 5})), vec![], 400, Some("logit_bias")),
        ("logit_bias range", chat_path, bias(json!({"50": 150})), vec![], 400, Some("logit_bias")),
        ("logit_bias value", chat_path, bias(json!({"50": "+5"})), vec![], 400, Some("logit_bias")),
        ("an unknown field", chat_path, with(&|v| v["frobnicate"] = json!(1)), vec![], 400, Some("frobnicate")),
        ("bad JSON to /tokenize", "/tokenize", b"{\"prompt\": ".to_vec(), vec![], 400, None),
        (
            "an unknown token id",
            "/detokenize",
            json!({"tokens": [1, 10_000_000]}).to_string().into_bytes(),
            vec![],
            400,
            Some("tokens"),
        ),
        (
            "temperature out of range",
            chat_path,
            with(&|v| v["temperature"] = json!(-1)),
            vec![],
            400,
            Some("temperature"),
        ),
        ("unknown model", chat_path, with(&|v| v["model"] = json!("gpt-4")), vec![], 404, Some("model")),
        ("prompt over the context", "/v1/completions", long_prompt, vec![], 400, Some("prompt")),
        ("a 10 MB body", chat_path, huge, vec![], 413, None),
        ("unknown route", "/v1/nothing-here", good.to_string().into_bytes(), vec![], 404, None),
        ("missing API key", chat_path, good.to_string().into_bytes(), vec![("Authorization", "")], 401, None),
        ("wrong API key", chat_path, good.to_string().into_bytes(), vec![("Authorization", "Bearer nope")], 401, None),
    ];
    for (what, path, body, headers, status, param) in cases {
        let r = server.request("POST", path, Some(&body), &headers).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.status, status, "{what}: {}", r.body);
        let v = r.json();
        let err = &v["error"];
        assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {v}");
        assert!(err["type"].is_string(), "{what}: {v}");
        assert!(err.get("param").is_some() && err.get("code").is_some(), "{what}: {v}");
        if let Some(p) = param {
            assert_eq!(err["param"], p, "{what}: {v}");
        }
    }
    // /health and /metrics need no key; /v1/models does.
    assert_eq!(server.request("GET", "/health", None, &[("Authorization", "")]).unwrap().status, 200);
    assert_eq!(server.request("GET", "/v1/models", None, &[("Authorization", "")]).unwrap().status, 401);
    // The server still answers.
    let r = server.post("/v1/chat/completions", &good);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 1);
    let m = server.metrics();
    assert_eq!(metric(&m, "weft_kv_blocks_used"), 0.0);
}

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_blocks() {
    let Some(server) = Server::start(&[]) else { return };
    let mut req = chat("Write a long story about a dragon.", 200);
    req["stream"] = json!(true);
    let body = req.to_string();
    let mut s = server.connect();
    server.send_head(&mut s, "POST", "/v1/chat/completions", Some(body.len()), &[]).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    // Read until the first generated text arrives, then hang up.
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended early");
        if line.contains("\"content\":\"") && !line.contains("\"content\":\"\"") {
            break;
        }
    }
    let m = server.metrics();
    assert!(metric(&m, "weft_kv_blocks_used") > 0.0, "{m}");
    drop(reader);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = server.metrics();
        if metric(&m, "weft_kv_blocks_used") == 0.0 {
            assert!(m.contains("weft_requests_finished_total{finished_reason=\"cancelled\"} 1"), "{m}");
            break;
        }
        assert!(Instant::now() < deadline, "KV blocks still used a minute after the client left:\n{m}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn concurrent_clients_get_their_own_answers() {
    let Some(server) = Server::start(&[]) else { return };
    let questions = ["What is the capital of France?", "What is 2+2?", "Name a colour.", "Say hello."];
    let solo = server.post("/v1/chat/completions", &chat(questions[0], 8)).json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let server = &server;
    let answers: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> =
            questions.iter().map(|q| scope.spawn(move || server.post("/v1/chat/completions", &chat(q, 8)))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .map(|r| {
                assert_eq!(r.status, 200, "{}", r.body);
                r.json()
            })
            .collect()
    });
    // Batch invariance: greedy output does not depend on the neighbours.
    assert_eq!(answers[0]["choices"][0]["message"]["content"].as_str().unwrap(), solo);
    for a in &answers {
        assert!(a["usage"]["completion_tokens"].as_u64().unwrap() >= 1, "{a}");
    }
    let ids: std::collections::HashSet<&str> = answers.iter().map(|a| a["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), questions.len());
}

/// The load: 32 clients at once, each with its own prompt, all answered in full, and a
/// sample of them identical to the same request sent alone (greedy, batch invariant).
#[test]
fn thirty_two_concurrent_clients_all_complete_correctly() {
    let Some(server) = Server::start(&[]) else { return };
    let body = |i: usize| serde_json::json!({ "prompt": format!("Item {i}: the"), "max_tokens": 4, "temperature": 0, "ignore_eos": true });
    let text = |v: &Value| v["choices"][0]["text"].as_str().unwrap().to_string();
    let server = &server;
    let replies: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..32).map(|i| scope.spawn(move || server.post("/v1/completions", &body(i)))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .map(|r| {
                assert_eq!(r.status, 200, "{}", r.body);
                r.json()
            })
            .collect()
    });
    for r in &replies {
        assert_eq!(r["usage"]["completion_tokens"].as_u64(), Some(4), "{r}");
    }
    for i in [0, 13, 31] {
        let alone = server.post("/v1/completions", &body(i)).json();
        assert_eq!(text(&replies[i]), text(&alone), "client {i}");
    }
}

#[test]
fn an_overfull_queue_answers_503_with_retry_after() {
    // One sequence at a time: with one running, 4 × 1 waiting fill the queue.
    let Some(server) = Server::start(&["--max-num-seqs", "1"]) else { return };
    let server = &server;
    let replies: Vec<Reply> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|i| scope.spawn(move || server.post("/v1/chat/completions", &chat(&format!("Count to {i}."), 1))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let refused: Vec<&Reply> = replies.iter().filter(|r| r.status == 503).collect();
    assert!(!refused.is_empty(), "no request was refused: {:?}", replies.iter().map(|r| r.status).collect::<Vec<_>>());
    for r in &refused {
        assert_eq!(r.header("retry-after"), Some("1"), "{}", r.body);
        assert!(r.json()["error"]["message"].as_str().unwrap().contains("overloaded"), "{}", r.body);
    }
    for r in replies.iter().filter(|r| r.status != 503) {
        assert_eq!(r.status, 200, "{}", r.body);
    }
    // Once the queue drains the server answers again.
    assert_eq!(server.post("/v1/chat/completions", &chat("Hi", 1)).status, 200);
}

/// `weft serve --spec-ngram` on the tiny model: answers as without speculation and counts
/// drafted and accepted tokens in /metrics.
#[test]
fn speculation_shows_in_metrics() {
    if weft::gpu::open_or_skip(Default::default()).unwrap().is_none() {
        return;
    }
    let c = weft::model::tiny::tiny_config();
    let w = weft::model::tiny::random_weights(&c, 21, weft::DType::Q8_0);
    let tiny = std::env::temp_dir().join(format!("weft-serve-spec-{}.gguf", std::process::id()));
    std::fs::write(&tiny, weft::model::tiny::gguf_bytes(&c, &w, weft::DType::Q8_0)).unwrap();
    let body = json!({"prompt": "one two one two one two", "max_tokens": 16, "temperature": 0, "ignore_eos": true});
    let plain = Server::start_with(&tiny, &["--kv-memory", "16MiB"]);
    let want = plain.post("/v1/completions", &body).json()["choices"][0]["text"].clone();
    drop(plain);
    let server = Server::start_with(&tiny, &["--kv-memory", "16MiB", "--spec-ngram"]);
    let r = server.post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], want);
    let m = server.metrics();
    let drafted = metric(&m, "weft_spec_drafted_tokens_total");
    let accepted = metric(&m, "weft_spec_accepted_tokens_total");
    assert!(drafted > 0.0 && accepted <= drafted, "{m}");
    assert!((metric(&m, "weft_spec_acceptance_rate") - accepted / drafted).abs() < 1e-9, "{m}");
    assert!(metric(&m, "weft_spec_mean_accepted_length") >= 1.0, "{m}");
    assert!(metric(&m, "weft_spec_verify_steps_total") > 0.0, "{m}");
    let _ = std::fs::remove_file(&tiny);
}

/// The tiny Qwen3 (its real chat template, `<think>` and `</think>` in its vocabulary) over
/// HTTP: `n: 3` seeded choices are three single requests' answers, whole and streamed; the
/// reasoning comes back as `reasoning_content` unless `enable_thinking: false` or
/// `--reasoning-parser none`; an unknown parser name stops the server at start.
#[test]
fn n_choices_and_reasoning_over_http() {
    if weft::gpu::open_or_skip(Default::default()).unwrap().is_none() {
        return;
    }
    let tiny = std::env::temp_dir().join(format!("weft-serve-qwen3-{}.gguf", std::process::id()));
    std::fs::write(&tiny, weft::model::tiny::qwen3_gguf(6, weft::DType::Q8_0)).unwrap();
    let server = Server::start_with(&tiny, &["--kv-memory", "16MiB", "--enable-prefix-cache"]);
    let ask = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 6, "ignore_eos": true,
                           "temperature": 1.0, "seed": 11});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    let singles: Vec<Value> = (0..3)
        .map(|i| {
            let r = server.post("/v1/chat/completions", &ask(json!({"seed": 11 + i})));
            assert_eq!(r.status, 200, "{}", r.body);
            r.json()["choices"][0]["message"]["reasoning_content"].clone()
        })
        .collect();
    assert!(singles.iter().all(Value::is_string), "{singles:?}");
    let r = server.post("/v1/chat/completions", &ask(json!({"n": 3})));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    for (i, want) in singles.iter().enumerate() {
        assert_eq!(v["choices"][i]["index"], i, "{v}");
        assert_eq!(&v["choices"][i]["message"]["reasoning_content"], want, "choice {i}: {v}");
        assert!(v["choices"][i]["message"]["content"].is_null(), "{v}");
    }
    assert_eq!(v["usage"]["completion_tokens"], 18, "{v}");
    // Streamed: each choice's reasoning deltas, by index, make its single answer.
    let r = server.post("/v1/chat/completions", &ask(json!({"n": 3, "stream": true})));
    assert_eq!(r.status, 200, "{}", r.body);
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut got = vec![String::new(); 3];
    let mut finishes = 0;
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        got[i].push_str(choice["delta"]["reasoning_content"].as_str().unwrap_or_default());
        assert!(choice["delta"]["content"].as_str().unwrap_or_default().is_empty(), "{e}");
        finishes += usize::from(!choice["finish_reason"].is_null());
    }
    assert_eq!(finishes, 3);
    for (i, want) in singles.iter().enumerate() {
        assert_eq!(got[i], want.as_str().unwrap(), "streamed choice {i}");
    }
    // Thinking off: the same kind of answer is all content.
    let r = server.post("/v1/chat/completions", &ask(json!({"chat_template_kwargs": {"enable_thinking": false}})));
    let m = &r.json()["choices"][0]["message"];
    assert!(m["reasoning_content"].is_null() && m["content"].is_string(), "{m}");
    // /tokenize renders with the kwargs too.
    let messages = json!([{"role": "user", "content": "2+2?"}]);
    let on = server.post("/tokenize", &json!({"messages": messages}));
    let off =
        server.post("/tokenize", &json!({"messages": messages, "chat_template_kwargs": {"enable_thinking": false}}));
    assert_eq!(off.json()["count"].as_u64().unwrap(), on.json()["count"].as_u64().unwrap() + 6, "{}", off.body);
    drop(server);

    let server = Server::start_with(&tiny, &["--kv-memory", "16MiB", "--reasoning-parser", "none"]);
    let r = server.post("/v1/chat/completions", &ask(json!({})));
    let m = &r.json()["choices"][0]["message"];
    assert!(m.get("reasoning_content").is_none() && m["content"].is_string(), "{m}");
    drop(server);

    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "--reasoning-parser", "granite", "--model"])
        .arg(&tiny)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("unknown reasoning parser \"granite\""), "{err}");
    assert!(err.contains("deepseek_r1, qwen3, none"), "{err}");
    let _ = std::fs::remove_file(&tiny);
}

/// The KV cache is sized as vLLM sizes it: `--gpu-memory-utilization` of the device by default
/// (on lavapipe, a CPU driver, 256 MiB: 65 536 blocks of the tiny model's f16 K and V), with
/// the dtype the device favours, shown in vLLM's `cache_config_info`; `--kv-memory` and
/// `--kv-cache-dtype` win; a cache that cannot hold one sequence of `--max-model-len` stops the
/// server at start, saying how many tokens fit and what to do; a utilization outside (0, 1] is
/// refused by the flag's parser.
#[test]
fn the_kv_cache_follows_the_device_and_max_model_len_must_fit() {
    let Some(ctx) = weft::gpu::open_or_skip(Default::default()).unwrap() else { return };
    let c = weft::model::tiny::tiny_config();
    let w = weft::model::tiny::random_weights(&c, 21, weft::DType::Q8_0);
    let tiny = std::env::temp_dir().join(format!("weft-serve-kv-{}.gguf", std::process::id()));
    std::fs::write(&tiny, weft::model::tiny::gguf_bytes(&c, &w, weft::DType::Q8_0)).unwrap();
    let info = |server: &Server| {
        let m = server.metrics();
        m.lines()
            .find(|l| l.starts_with("vllm:cache_config_info{"))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("{m}"))
    };
    let server = Server::start_with(&tiny, &["--gpu-memory-utilization", "0.5"]);
    let line = info(&server);
    let dtype = if ctx.features().shader_f16 { "f16" } else { "f32" };
    assert!(line.contains(&format!("cache_dtype=\"{dtype}\"")), "{line}");
    if ctx.plan().cpu_adapter() {
        let blocks = weft::gpu::CPU_DRIVER_KV_BYTES / (16 * if dtype == "f16" { 256 } else { 512 });
        assert!(line.contains(&format!("num_gpu_blocks=\"{blocks}\"")), "{line}");
    }
    drop(server);
    let server = Server::start_with(&tiny, &["--kv-memory", "1MiB", "--kv-cache-dtype", "f32"]);
    let line = info(&server);
    assert!(line.contains("num_gpu_blocks=\"128\"") && line.contains("cache_dtype=\"f32\""), "{line}");
    drop(server);
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "--port", "0", "--kv-memory", "256KiB", "--kv-cache-dtype", "f32", "--model"])
        .arg(&tiny)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("max_model_len 2048 does not fit the KV cache, which holds 512 tokens"), "{stderr}");
    assert!(stderr.contains("--max-model-len") && stderr.contains("--kv-cache-dtype f16"), "{stderr}");
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "--gpu-memory-utilization", "1.5", "--model"])
        .arg(&tiny)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("\"1.5\" is not a fraction of the GPU's memory"), "{stderr}");
    let _ = std::fs::remove_file(&tiny);
}

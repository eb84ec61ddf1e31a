"""Helpers for the deployment tests: `weft serve` replicas on loopback with the tiny random model,
streamed completions over plain `http.client` (status codes and headers stay visible), and
`/metrics` read with Prometheus' own text parser.

The tiny model (2 layers, byte-level vocabulary) generates a few hundred tokens a second on
lavapipe, so a request of a few hundred tokens stays in flight long enough to signal a replica
in the middle of it.
"""

import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("WEFT_BIN", ROOT / "target" / "release" / "weft"))

# Every vLLM name weft's /metrics carries, as samples are named (counters with `_total`,
# histograms by their `_count`); the endpoint picker's configuration may name only these.
VLLM_NAMES = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:lora_requests_info",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:request_queue_time_seconds_count",
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
]


def tiny_model():
    """The tiny random GGUF: $WEFT_TINY_MODEL (set by `cargo xtask test`), else written once
    under target/ with the `tiny_model` example."""
    given = os.environ.get("WEFT_TINY_MODEL")
    if given:
        return Path(given)
    path = ROOT / "target" / "server-tests" / "tiny.gguf"
    if not path.exists():
        subprocess.run(["cargo", "run", "--release", "--quiet", "--example", "tiny_model", "--", str(path)], cwd=ROOT, check=True)
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(model, *flags, env=None):
    """Start `weft serve` on `model` with `flags` (and the environment `env`, else this one's) on
    a free port and wait until /health answers 200; returns (process, base URL). Fails the test, saying what is missing, when the binary
    or the model is not there or the server exits or stays unhealthy for 120 s."""
    if not BIN.exists():
        pytest.fail(f"{BIN} is missing: build it with `cargo build --release -p weft-native` or set WEFT_BIN")
    if not Path(model).exists():
        pytest.fail(
            f"{model} is missing: `cargo xtask fetch-model` fetches the default model and "
            "`cargo run --release --example tiny_model -- PATH` writes the tiny ones"
        )
    port = free_port()
    proc = subprocess.Popen([str(BIN), "serve", "--model", str(model), "--port", str(port), *flags], env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"weft serve exited early with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    return proc, base
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("weft serve did not get healthy in 120 s")
        time.sleep(0.2)


def stop(proc):
    """End a server started by `serve`: SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Replica:
    """One `weft serve` process on a free loopback port; its stderr goes to `log`."""

    def __init__(self, log_dir, name, *args):
        if not BIN.exists():
            raise RuntimeError(f"{BIN} is missing: build it with `cargo build --release -p weft-native` or set WEFT_BIN")
        self.name = name
        self.port = free_port()
        self.log = Path(log_dir) / f"{name}.log"
        env = dict(os.environ)
        env.pop("WEFT_API_KEY", None)
        cmd = [str(BIN), "serve", "--model", str(tiny_model()), "--port", str(self.port), *args]
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited early with {self.proc.returncode}:\n{self.stderr()}")
            try:
                if get(self.port, "/ready")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} was not ready in {timeout} s:\n{self.stderr()}")

    def warm_up(self, prompt="warm up", max_tokens=4):
        """One request first: the first step compiles the shaders, which takes seconds."""
        return complete(self.port, prompt, max_tokens)

    def metrics(self):
        return scrape(self.port)

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout=60):
        return self.proc.wait(timeout=timeout)

    def stderr(self):
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def get(port, path):
    """(status, headers, body) of a GET."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
    finally:
        conn.close()


def scrape(port):
    """/metrics as {sample name: [(labels, value)]}, parsed by prometheus_client."""
    status, headers, body = get(port, "/metrics")
    assert status == 200, body
    assert headers["content-type"].startswith("text/plain; version=0.0.4"), headers
    samples = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def value(samples, name, **labels):
    """The value of the one sample of `name` whose labels include `labels`."""
    found = [v for (l, v) in samples.get(name, []) if all(l.get(k) == want for k, want in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {samples.get(name)}"
    return found[0]


def body(prompt, max_tokens, stream):
    b = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if stream:
        b.update(stream=True, stream_options={"include_usage": True})
    return json.dumps(b)


def complete(port, prompt, max_tokens):
    """A non-streaming completion: (status, headers, parsed body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/completions", body(prompt, max_tokens, False), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(r.read())
    finally:
        conn.close()


class Stream:
    """A streamed completion read on its own thread: status, headers, text, finish reason,
    usage, whether `[DONE]` came, and when the first text and the end arrived."""

    def __init__(self, port, prompt, max_tokens):
        self.port, self.prompt, self.max_tokens = port, prompt, max_tokens
        self.status = None
        self.headers = {}
        self.text = ""
        self.finish_reason = None
        self.usage = None
        self.done = False
        self.error = None
        self.started_at = time.monotonic()
        self.first_text_at = None
        self.ended_at = None
        self.first_text = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        try:
            conn.request("POST", "/v1/completions", body(self.prompt, self.max_tokens, True), {"Content-Type": "application/json"})
            r = conn.getresponse()
            self.status, self.headers = r.status, {k.lower(): v for k, v in r.getheaders()}
            if r.status != 200:
                self.text = r.read().decode()
                return
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    self.done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    self.error = chunk["error"]
                    continue
                if chunk.get("usage"):
                    self.usage = chunk["usage"]
                for c in chunk["choices"]:
                    if c["text"]:
                        self.text += c["text"]
                        if self.first_text_at is None:
                            self.first_text_at = time.monotonic()
                            self.first_text.set()
                    if c["finish_reason"]:
                        self.finish_reason = c["finish_reason"]
        except Exception as e:  # the test reports it with the rest
            self.error = repr(e)
        finally:
            self.ended_at = time.monotonic()
            self.first_text.set()
            conn.close()

    def join(self, timeout=300):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"stream of {self.prompt!r} still running after {timeout} s"
        return self

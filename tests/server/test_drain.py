"""Graceful drain of `weft serve`: SIGTERM while 8 streams run lets all 8 finish with their full
text while new requests get 503 and readiness turns false, then the process exits 0; with a
drain timeout shorter than the work the rest end as cancelled ("abort") and no KV block stays
used.
"""

import signal
import threading
import time

from replica import Replica, Stream, complete, get, scrape, value

# Long enough that no machine finishes it inside the drain windows below: the tiny model decodes
# 8 sequences at about a millisecond a step on lavapipe.
MAX_TOKENS = 1000
# The most a prompt here leaves of the tiny model's 2048-token context, rounded down.
LONGEST = 2000


def prompt(i):
    return f"Stream {i}: once upon a time"


def timeline(t0, events):
    return "\n".join(f"  {t - t0:+7.3f}s  {what}" for t, what in sorted(events))


def test_sigterm_lets_streams_finish_and_refuses_new_requests(tmp_path):
    replica = Replica(tmp_path, "drain", "--max-num-seqs", "8", "--drain-timeout", "60")
    try:
        replica.wait_ready()
        # The warm-up is stream 0 alone: its text is what stream 0 must still get in full.
        status, _, alone = replica.warm_up(prompt(0), MAX_TOKENS)
        assert status == 200, alone
        streams = [Stream(replica.port, prompt(i), MAX_TOKENS) for i in range(8)]
        for s in streams:
            assert s.first_text.wait(60), vars(s)
        t0 = time.monotonic()
        replica.signal(signal.SIGTERM)
        events = [(t0, "SIGTERM")]

        # Readiness turns false at once; liveness stays true.
        deadline = t0 + 5
        while get(replica.port, "/ready")[0] == 200:
            assert time.monotonic() < deadline, "/ready still 200 five seconds after SIGTERM"
            time.sleep(0.005)
        events.append((time.monotonic(), "/ready answers 503"))
        status, _, ready = get(replica.port, "/ready")
        assert status == 503 and '"draining"' in ready, ready
        assert get(replica.port, "/health")[0] == 200
        # New requests are refused with a Retry-After while the streams still run.
        for i in range(3):
            status, headers, refused = complete(replica.port, f"late {i}", 4)
            assert status == 503, refused
            assert headers.get("retry-after") == "1", headers
            assert "shutting down" in refused["error"]["message"], refused
            events.append((time.monotonic(), f"new request {i} refused: 503"))
        assert any(s.ended_at is None for s in streams), "the streams ended before the refusals were checked"

        for i, s in enumerate(streams):
            s.join()
            assert (s.status, s.error, s.done, s.finish_reason) == (200, None, True, "length"), vars(s)
            assert s.usage["completion_tokens"] == MAX_TOKENS, s.usage
            assert s.ended_at > t0
            events.append((s.ended_at, f"stream {i} complete ({MAX_TOKENS} tokens)"))
        assert streams[0].text == alone["choices"][0]["text"]
        assert replica.wait_exit(30) == 0, replica.stderr()
        events.append((time.monotonic(), "exit 0"))
        log = replica.stderr()
        assert "SIGTERM: draining" in log and "8 in flight at the signal, 0 cancelled" in log, log
        print(f"\ndrain timeline (SIGTERM, 8 streams of {MAX_TOKENS} tokens):\n{timeline(t0, events)}")
    finally:
        replica.stop()


def test_drain_timeout_cancels_the_rest_and_frees_their_blocks(tmp_path):
    max_tokens = LONGEST
    replica = Replica(tmp_path, "timeout", "--max-num-seqs", "8", "--kv-memory", "4MiB", "--drain-timeout", "0.5")
    try:
        replica.wait_ready()
        replica.warm_up()
        total_blocks = int(replica.metrics()["vllm:cache_config_info"][0][0]["num_gpu_blocks"])

        # Scrape as fast as possible until the server is gone; keep the last answer.
        last = {}

        def scraper():
            while True:
                try:
                    last["metrics"] = scrape(replica.port)
                    last["at"] = time.monotonic()
                except OSError:
                    if replica.proc.poll() is not None:
                        return

        streams = [Stream(replica.port, prompt(i), max_tokens) for i in range(8)]
        for s in streams:
            assert s.first_text.wait(60), vars(s)
        watcher = threading.Thread(target=scraper, daemon=True)
        watcher.start()
        t0 = time.monotonic()
        replica.signal(signal.SIGTERM)
        for s in streams:
            s.join()
        assert replica.wait_exit(30) == 0, replica.stderr()
        exited = time.monotonic()
        watcher.join(10)

        reasons = [s.finish_reason for s in streams]
        aborted = [s for s in streams if s.finish_reason == "abort"]
        assert aborted and set(reasons) <= {"abort", "length"}, reasons
        for s in streams:
            assert (s.status, s.error, s.done) == (200, None, True), vars(s)
        for s in aborted:
            assert s.usage["completion_tokens"] < max_tokens, s.usage
            assert s.ended_at - t0 >= 0.45, "cancelled before the drain timeout"
        assert exited - t0 < 10
        log = replica.stderr()
        # The server's own last look, after the cancellations: nothing runs, no block is held.
        # (A scrape that lands between the cancellations and the exit, a millisecond or two,
        # is rare; the one that does must say the same.)
        assert f"{len(aborted)} cancelled at the drain timeout; at exit 0 running, 0 waiting, KV blocks in use 0 of {total_blocks}" in log, log
        m = last["metrics"]
        labels = {"model_name": "tiny", "engine": "0"}
        assert value(m, "weft_draining") == 1
        seen_aborts = value(m, "vllm:request_success_total", finished_reason="abort", **labels)
        if seen_aborts == len(aborted):
            assert value(m, "vllm:kv_cache_usage_perc", **labels) == 0
            assert value(m, "vllm:num_requests_running", **labels) == 0
            assert value(m, "weft_kv_blocks_used") == 0
        events = [(t0, "SIGTERM (--drain-timeout 0.5)"), (exited, "exit 0"), (last["at"], f"last /metrics scrape: {seen_aborts:.0f} aborted")]
        events += [(s.ended_at, f"stream {i}: {s.finish_reason} after {s.usage['completion_tokens']} tokens") for i, s in enumerate(streams)]
        print(f"\ndrain timeline (timeout 0.5 s, 8 streams of {max_tokens} tokens):\n{timeline(t0, events)}")
    finally:
        replica.stop()


def test_a_second_signal_exits_at_once(tmp_path):
    replica = Replica(tmp_path, "twice", "--drain-timeout", "60")
    try:
        replica.wait_ready()
        replica.warm_up()
        stream = Stream(replica.port, prompt(0), LONGEST)
        assert stream.first_text.wait(60), vars(stream)
        replica.signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while get(replica.port, "/ready")[0] == 200:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        t0 = time.monotonic()
        replica.signal(signal.SIGINT)
        # Killed by the signal, as the shell says it: 128 + SIGINT's number.
        assert replica.wait_exit(10) == 128 + signal.SIGINT, replica.stderr()
        assert time.monotonic() - t0 < 2
        stream.join()
        assert stream.finish_reason is None and not stream.done, vars(stream)
        assert "SIGINT again: exiting now" in replica.stderr()
    finally:
        replica.stop()

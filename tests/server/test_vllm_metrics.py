"""vLLM's metric names on `weft serve`'s /metrics, read with Prometheus' own text parser while 8
streams run: the gauges move and come back to idle, the counters equal the requests' own usage.

The replica runs 4 sequences at a time over a 128-block KV pool with the prefix cache on, and
every prompt starts with the same 45 bytes (2 full blocks of 16 tokens with the byte-level
tiny model), so running, waiting, KV usage and prefix-cache hits all have something to show.
"""

import threading
import time

from replica import VLLM_NAMES, Replica, Stream, scrape, value

MODEL = "weft-tiny"
PREFIX = "The quick brown fox jumps over the lazy dog. "
MAX_TOKENS = 400
LABELS = {"model_name": MODEL, "engine": "0"}


def test_vllm_metrics_during_eight_streams(tmp_path):
    replica = Replica(tmp_path, "metrics", "--served-model-name", MODEL, "--max-num-seqs", "4", "--kv-memory", "1MiB", "--kv-cache-dtype", "f32", "--enable-prefix-cache")
    try:
        replica.wait_ready()
        status, _, warm = replica.warm_up(PREFIX + "warm up", MAX_TOKENS)
        assert status == 200, warm
        idle = replica.metrics()
        for name in VLLM_NAMES:
            assert name in idle, f"{name} missing from /metrics: {sorted(idle)}"
        info = idle["vllm:cache_config_info"][0][0]
        assert info["block_size"] == "16" and info["num_gpu_blocks"] == "128" and info["cache_dtype"] == "f32", info
        lora = idle["vllm:lora_requests_info"][0][0]
        assert lora == {"max_lora": "0", "running_lora_adapters": "", "waiting_lora_adapters": ""}, lora
        assert abs(value(idle, "vllm:lora_requests_info") - time.time()) < 60
        assert value(idle, "vllm:kv_cache_usage_perc", **LABELS) == 0

        # Scrape every 20 ms while 8 streams run.
        seen = []
        stop = threading.Event()

        def scraper():
            while not stop.is_set():
                m = scrape(replica.port)
                seen.append(tuple(value(m, n, **LABELS) for n in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")))
                time.sleep(0.02)

        watcher = threading.Thread(target=scraper, daemon=True)
        watcher.start()
        streams = [Stream(replica.port, f"{PREFIX}{i}: request", MAX_TOKENS) for i in range(8)]
        for s in streams:
            s.join()
        stop.set()
        watcher.join(30)
        for s in streams:
            assert (s.status, s.error, s.done, s.finish_reason) == (200, None, True, "length"), vars(s)
            assert s.usage["completion_tokens"] == MAX_TOKENS, s.usage

        running = [r for (r, _, _) in seen]
        waiting = [w for (_, w, _) in seen]
        usage = [u for (_, _, u) in seen]
        assert max(running) == 4, running  # --max-num-seqs
        assert max(waiting) >= 1, waiting
        assert 0 < max(usage) <= 1, usage
        end = replica.metrics()
        assert value(end, "vllm:num_requests_running", **LABELS) == 0
        assert value(end, "vllm:num_requests_waiting", **LABELS) == 0
        assert value(end, "vllm:kv_cache_usage_perc", **LABELS) == 0

        # The counters are the requests' own usage, the warm-up included.
        usages = [warm["usage"]] + [s.usage for s in streams]
        num_requests = len(usages)
        prompt_tokens = sum(u["prompt_tokens"] for u in usages)
        generated = sum(u["completion_tokens"] for u in usages)
        assert value(end, "vllm:prompt_tokens_total", **LABELS) == prompt_tokens
        assert value(end, "vllm:generation_tokens_total", **LABELS) == generated
        assert value(end, "vllm:request_success_total", finished_reason="length", **LABELS) == num_requests
        for reason in ("stop", "abort", "error"):
            assert value(end, "vllm:request_success_total", finished_reason=reason, **LABELS) == 0
        for h in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
            assert value(end, f"vllm:{h}_seconds_count", **LABELS) == num_requests
            assert value(end, f"vllm:{h}_seconds_bucket", le="+Inf", **LABELS) == num_requests
        assert value(end, "vllm:inter_token_latency_seconds_count", **LABELS) == generated - num_requests
        e2e = value(end, "vllm:e2e_request_latency_seconds_sum", **LABELS)
        assert 0 < e2e < sum(s.ended_at - s.started_at for s in streams) + 60
        # Prefix cache, in tokens: each stream found the warm-up's 2 full blocks of the prefix.
        assert value(end, "vllm:num_preemptions_total", **LABELS) == 0
        assert value(end, "vllm:prefix_cache_queries_total", **LABELS) == prompt_tokens
        assert value(end, "vllm:prefix_cache_hits_total", **LABELS) == 8 * 32
        print(f"\nmetrics: running max {max(running)}, waiting max {max(waiting)}, KV usage max {max(usage):.3f} over {len(seen)} scrapes")
    finally:
        replica.stop()


def test_an_f16_kv_cache_holds_twice_the_blocks(tmp_path):
    replica = Replica(tmp_path, "f16", "--kv-memory", "1MiB", "--kv-cache-dtype", "f16")
    try:
        replica.wait_ready()
        status, _, reply = replica.warm_up(PREFIX, 8)
        assert status == 200 and reply["usage"]["completion_tokens"] == 8, reply
        info = replica.metrics()["vllm:cache_config_info"][0][0]
        assert info["num_gpu_blocks"] == "256" and info["cache_dtype"] == "f16", info
    finally:
        replica.stop()

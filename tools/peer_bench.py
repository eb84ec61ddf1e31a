#!/usr/bin/env python3
"""The peer's side of `cargo xtask bench --peer`: llama.cpp, through llama-cpp-python's low-level
API, on the same GGUF file and the same workload as `weft bench`, printing one JSON object.

Run it with the python of a venv where llama-cpp-python is installed (xtask keeps two outside the
repository: one built with -DGGML_VULKAN=on, one CPU-only build). On a Vulkan build set
GGML_VK_VISIBLE_DEVICES=0, or ggml skips a CPU-type Vulkan device such as lavapipe and runs on
the CPU without a word; --expect vulkan makes this script fail instead when no Vulkan device
took the layers.

The workload, as `weft bench` runs it (native/src/bench.rs): prompts of --prompt-len distinct
token ids (id 1000 + (serial * 7919 + i) mod (vocab - 1000), as weft makes them), greedy
(llama.cpp's greedy sampler), end of sequence ignored, exactly --gen-len tokens generated per
sequence. What is measured, each a median over --repeats:

- prefill_tok_s: a lone prompt decoded as one batch; prompt tokens over the time until its
  first sampled token (weft: prefill_tok_s, from a lone prompt's time to first token).
- decode_tok_s_batch1: that sequence then generates the rest of its --gen-len tokens one step
  at a time; 1 / the median time between tokens (weft: decode_tok_s_per_seq at concurrency 1).
  decode_tok_s_batch1_mean is tokens over time.
- aggregate_tok_s: --seqs sequences with distinct prompts, all prefilled together (batches of
  up to n_batch tokens, several sequences per batch), then decoded together, one llama_batch
  of --seqs tokens per step, until each has --gen-len tokens; all generated tokens over the
  wall time from the start of the prefill to the last token (weft: aggregate_tok_s, which also
  includes admitting the prompts). aggregate_decode_tok_s leaves the prefill out: the tokens
  after each sequence's first over the time of the decode steps.
- peak_rss_mib: the process's peak resident memory (ru_maxrss), the Python interpreter
  included (about 20 MiB).

The context holds all sequences at once (a unified KV cache of seqs * (prompt + gen) cells,
rounded up to 256), n_batch 2048, n_ubatch 512, flash attention as llama.cpp decides by
default, --threads CPU threads (default: every core).
"""

import argparse
import ctypes
import json
import os
import re
import resource
import statistics
import sys
import time

import llama_cpp as L


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the GGUF file")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=128)
    p.add_argument("--seqs", type=int, default=16, help="sequences decoded together for aggregate_tok_s")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--n-gpu-layers", type=int, default=999, help="layers to offload (0: CPU only)")
    p.add_argument("--expect", choices=["vulkan", "cpu"], help="fail unless the layers ran on this kind of device")
    p.add_argument("--label", default="llama.cpp", help="the name this run goes by in the JSON")
    p.add_argument("--verbose", action="store_true", help="pass llama.cpp's log through to stderr")
    a = p.parse_args()
    if min(a.prompt_len, a.gen_len, a.seqs, a.repeats, a.threads) < 1:
        p.error("--prompt-len, --gen-len, --seqs, --repeats and --threads must be at least 1")
    return a


# llama.cpp's log, kept to find which device took the layers (and shown when something fails).
LOG = []
# The command line, read once in main (the log callback needs --verbose).
ARGS = None


@L.llama_log_callback
def on_log(level, text, user_data):
    line = text.decode("utf-8", "replace") if text else ""
    LOG.append(line)
    if ARGS.verbose:
        sys.stderr.write(line)


def fail(message):
    sys.stderr.write("".join(LOG[-40:]))
    sys.exit(f"peer_bench: {message}")


class Runner:
    """One model and one context sized for the largest run."""

    def __init__(self, args):
        self.args = args
        L.llama_log_set(on_log, ctypes.c_void_p(0))
        L.llama_backend_init()
        mparams = L.llama_model_default_params()
        mparams.n_gpu_layers = args.n_gpu_layers
        started = time.perf_counter()
        self.model = L.llama_model_load_from_file(args.model.encode(), mparams)
        if not self.model:
            fail(f"llama.cpp could not load {args.model}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        cells = args.seqs * (args.prompt_len + args.gen_len)
        cparams = L.llama_context_default_params()
        cparams.n_ctx = (cells + 255) // 256 * 256
        cparams.n_batch = 2048
        cparams.n_ubatch = 512
        cparams.n_seq_max = args.seqs
        cparams.kv_unified = True
        cparams.n_threads = args.threads
        cparams.n_threads_batch = args.threads
        cparams.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            fail("llama.cpp could not create a context")
        self.load_s = time.perf_counter() - started
        self.n_batch = cparams.n_batch
        self.batch = L.llama_batch_init(max(self.n_batch, args.seqs), 0, 1)
        self.sampler = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        L.llama_sampler_chain_add(self.sampler, L.llama_sampler_init_greedy())
        self.serial = 0

    def device(self):
        """Which device took the layers, from llama.cpp's log while loading."""
        text = "".join(LOG)
        used = re.findall(r"using device (\S+) \(([^)]*\)?)\)", text)
        offloaded = re.findall(r"offloaded (\d+)/(\d+) layers to GPU", text)
        name = ", ".join(f"{dev} ({desc})" for dev, desc in used) or "CPU"
        return name, (f"{offloaded[-1][0]}/{offloaded[-1][1]}" if offloaded else "0")

    def prompt(self):
        """Distinct token ids, as weft bench makes them."""
        usable = max(self.n_vocab - 1000, 1)
        offset = self.serial * 7919
        self.serial += 1
        return [1000 + (offset + i) % usable for i in range(self.args.prompt_len)]

    def clear(self):
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        L.llama_sampler_reset(self.sampler)

    def decode(self, entries):
        """One llama_decode of (token, position, sequence, wants logits) entries."""
        b = self.batch
        for i, (token, pos, seq, logits) in enumerate(entries):
            b.token[i] = token
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if logits else 0
        b.n_tokens = len(entries)
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            fail(f"llama_decode returned {rc}")

    def sample(self, index):
        return L.llama_sampler_sample(self.sampler, self.ctx, index)

    def run(self, seqs, prompt_len, gen_len):
        """Prefill `seqs` prompts together, then decode them together; returns the start, each
        sequence's token arrival times, and when the decode steps started."""
        self.clear()
        prompts = [self.prompt()[:prompt_len] for _ in range(seqs)]
        arrivals = [[] for _ in range(seqs)]
        last = [0] * seqs
        start = time.perf_counter()
        # Prefill: the prompts back to back, cut into batches of n_batch tokens; a sequence's
        # last prompt token asks for logits, and its first token is sampled from them.
        entries = [(tok, pos, s, pos == prompt_len - 1) for s, p in enumerate(prompts) for pos, tok in enumerate(p)]
        for at in range(0, len(entries), self.n_batch):
            chunk = entries[at : at + self.n_batch]
            self.decode(chunk)
            for i, (_, _, s, wants) in enumerate(chunk):
                if wants:
                    last[s] = self.sample(i)
                    arrivals[s].append(time.perf_counter())
        decode_start = time.perf_counter()
        for step in range(1, gen_len):
            self.decode([(last[s], prompt_len + step - 1, s, True) for s in range(seqs)])
            for s in range(seqs):
                last[s] = self.sample(s)
                arrivals[s].append(time.perf_counter())
        return start, arrivals, decode_start


def measure(runner, args):
    # Warm up: pipelines compile and buffers grow on the first batches of each shape.
    runner.run(1, min(8, args.prompt_len), 2)
    runner.run(args.seqs, min(8, args.prompt_len), 2)
    figures = []
    for _ in range(args.repeats):
        start, (times,), _ = runner.run(1, args.prompt_len, args.gen_len)
        gaps = [b - a for a, b in zip(times, times[1:])]
        prefill = args.prompt_len / (times[0] - start)
        decode_median = 1 / statistics.median(gaps) if gaps else 0.0
        decode_mean = len(gaps) / (times[-1] - times[0]) if gaps else 0.0
        start, arrivals, decode_start = runner.run(args.seqs, args.prompt_len, args.gen_len)
        end = max(t[-1] for t in arrivals)
        generated = sum(len(t) for t in arrivals)
        aggregate = generated / (end - start)
        after_first = generated - args.seqs
        aggregate_decode = after_first / (end - decode_start) if after_first else 0.0
        figures.append((prefill, decode_median, decode_mean, aggregate, aggregate_decode))
    med = [statistics.median(f[i] for f in figures) for i in range(5)]
    device, offloaded = runner.device()
    return {
        "engine": args.label,
        "llama_cpp_python": L.__version__,
        "gpu_offload_supported": bool(L.llama_supports_gpu_offload()),
        "device": device,
        "layers_offloaded": offloaded,
        "model": os.path.basename(args.model),
        "threads": args.threads,
        "repeats": args.repeats,
        "prompt_len": args.prompt_len,
        "gen_len": args.gen_len,
        "seqs": args.seqs,
        "load_s": runner.load_s,
        "prefill_tok_s": med[0],
        "decode_tok_s_batch1": med[1],
        "decode_tok_s_batch1_mean": med[2],
        "aggregate_tok_s": med[3],
        "aggregate_decode_tok_s": med[4],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main():
    global ARGS
    ARGS = parse_args()
    runner = Runner(ARGS)
    device, offloaded = runner.device()
    on_gpu = offloaded not in ("0", "") and not offloaded.startswith("0/")
    if ARGS.expect == "vulkan" and not (on_gpu and "Vulkan" in device):
        fail(
            f"the layers did not go to a Vulkan device (device: {device}, offloaded: {offloaded}); "
            "is this a Vulkan build, and is GGML_VK_VISIBLE_DEVICES=0 set?"
        )
    if ARGS.expect == "cpu" and on_gpu:
        fail(f"expected a CPU run, but {offloaded} layers went to {device}")
    print(json.dumps(measure(runner, ARGS), indent=2))


if __name__ == "__main__":
    main()

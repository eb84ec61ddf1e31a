"""`weft serve --lora-modules`: the tiny random Llama of `tests/fixtures/lora/` with its three
PEFT adapters (`tools/make_lora_fixtures.py`), through the official OpenAI client. A request's
`model` selects the adapter; each answer's text is peft's greedy tokens (up to the first
reference near-tie) as the server's own /detokenize spells them, for requests alone and for
the base model and three adapters at once over two slots (an adapter evicted and reloaded);
/v1/models lists the adapters with their parent; an unknown model is a 404; /metrics carries
vLLM's `vllm:lora_requests_info`. Served with `--pooling last`, /v1/embeddings runs the adapter
its `model` names too.
"""

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from replica import scrape, serve, stop

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "lora"
BASE = "tiny-llama"
ADAPTERS = ["alpha", "beta", "gamma"]
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())


@pytest.fixture(scope="module")
def server():
    modules = [f"{name}={FIXTURE / name}" for name in ADAPTERS]
    proc, base = serve(FIXTURE / "hf", "--served-model-name", BASE, "--lora-modules", *modules, "--max-loras", "2", "--max-lora-rank", "8", "--pooling", "last")
    try:
        yield base, openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=300, max_retries=0)
    finally:
        stop(proc)


def detokenize(base, tokens):
    req = urllib.request.Request(base + "/detokenize", data=json.dumps({"tokens": tokens}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())["prompt"]


def expected_text(base, model, p):
    """peft's greedy text for `model` on prompt `p`, up to the first near-tie."""
    ref = EXPECTED["models"]["base" if model == BASE else model]["prompts"][p]
    sure = next((i for i, m in enumerate(ref["greedy_margins"]) if m < 1e-3), len(ref["greedy_ids"]))
    return ref["prompt_ids"], detokenize(base, ref["greedy_ids"][:sure])


def complete(client, model, prompt_ids):
    r = client.completions.create(model=model, prompt=prompt_ids, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    assert r.model == model
    return r.choices[0].text


def test_models_lists_each_adapter_with_its_parent(server):
    _, client = server
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {BASE, *ADAPTERS}
    assert models[BASE].model_extra["parent"] is None
    for name in ADAPTERS:
        assert models[name].model_extra["parent"] == BASE


def test_model_selects_the_adapter(server):
    base, client = server
    for model in [BASE, *ADAPTERS]:
        prompt, want = expected_text(base, model, 0)
        assert complete(client, model, prompt).startswith(want), model


def test_base_and_three_adapters_at_once_over_two_slots(server):
    base, client = server
    runs = [(model, p) for p in (1, 2) for model in [BASE, *ADAPTERS]]
    got = [None] * len(runs)

    def run(i, model, p):
        got[i] = complete(client, model, expected_text(base, model, p)[0])

    threads = [threading.Thread(target=run, args=(i, m, p)) for i, (m, p) in enumerate(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (model, p), text in zip(runs, got):
        assert text is not None and text.startswith(expected_text(base, model, p)[1]), (model, p, text)
    info = scrape(int(base.rsplit(":", 1)[1]))["vllm:lora_requests_info"][0][0]
    assert info == {"max_lora": "2", "running_lora_adapters": "", "waiting_lora_adapters": ""}, info


def test_an_unknown_model_is_not_found(server):
    _, client = server
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="delta", prompt=[1, 2, 3], max_tokens=2)


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_runtime_loading_is_off_without_the_flag(server):
    base, _ = server
    assert post(base, "/v1/load_lora_adapter", {"lora_name": "delta", "lora_path": str(FIXTURE / "alpha")})[0] == 404


def test_load_and_unload_lora_adapter():
    proc, base = serve(FIXTURE / "hf", "--served-model-name", BASE, "--allow-runtime-lora-updating", "--max-lora-rank", "8")
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=300, max_retries=0)
        status, text = post(base, "/v1/load_lora_adapter", {"lora_name": "delta", "lora_path": str(FIXTURE / "alpha")})
        assert status == 200 and "delta" in text, text
        assert {m.id for m in client.models.list().data} == {BASE, "delta"}
        prompt, want = expected_text(base, "alpha", 1)
        assert complete(client, "delta", prompt).startswith(want)
        for bad in [FIXTURE / "missing", FIXTURE / "hf"]:
            status, text = post(base, "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": str(bad)})
            assert status == 400 and "adapter_config.json" in text, text
        status, text = post(base, "/v1/load_lora_adapter", {"lora_name": "delta", "lora_path": str(FIXTURE / "beta")})
        assert status == 400 and "already" in text, text
        assert post(base, "/v1/unload_lora_adapter", {"lora_name": "delta"})[0] == 200
        assert post(base, "/v1/unload_lora_adapter", {"lora_name": "delta"})[0] == 404
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="delta", prompt=prompt, max_tokens=2)
    finally:
        stop(proc)


def test_embeddings_run_the_adapter_their_model_names(server):
    _, client = server
    ids = EXPECTED["models"]["base"]["prompts"][0]["prompt_ids"]
    embed = lambda model: client.embeddings.create(model=model, input=[ids])  # noqa: E731
    plain, alpha, again = embed(BASE), embed("alpha"), embed("alpha")
    assert (plain.model, alpha.model) == (BASE, "alpha")
    a, b = plain.data[0].embedding, alpha.data[0].embedding
    cosine = sum(x * y for x, y in zip(a, b))  # both L2-normalised
    assert cosine < 0.999, f"the adapter changed nothing (cosine {cosine})"
    assert again.data[0].embedding == b, "the same adapter gives the same vector"
    with pytest.raises(openai.NotFoundError) as e:
        embed("delta")
    assert "delta" in str(e.value)

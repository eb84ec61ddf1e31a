"""`weft serve` against the official OpenAI Python client.

Run by `cargo xtask test` (which makes a venv at target/pyvenv with `openai`, `pytest` and the
other tests' packages), or by hand:

    WEFT_BIN=target/release/weft WEFT_MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf \
        target/pyvenv/bin/python -m pytest tests/server

(the deployment tests beside this file use the tiny model: WEFT_TINY_MODEL, or one they write).

Generation on a software GPU (lavapipe) is slow, so every request asks for a few tokens only.
"""

import json
import os
import urllib.request
from pathlib import Path

import openai
import pytest

from replica import serve, stop

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("WEFT_BIN", ROOT / "target" / "release" / "weft"))
MODEL = Path(os.environ.get("WEFT_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
MODEL_ID = MODEL.stem
API_KEY = "test-key"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server():
    env = dict(os.environ)
    env.pop("WEFT_API_KEY", None)
    proc, base = serve(MODEL, "--api-key", API_KEY, env=env)
    try:
        yield base
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=API_KEY, timeout=300, max_retries=0)


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]


def test_chat_non_streaming_and_streaming_agree(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=12, temperature=0)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    stream = client.chat.completions.create(
        model=MODEL_ID, messages=QUESTION, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    pieces, finish, usage, roles = [], [], None, []
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish.append(c.finish_reason)
    assert roles == ["assistant"]
    assert "".join(pieces) == choice.message.content
    assert finish == [choice.finish_reason]
    assert usage is not None and usage.completion_tokens == r.usage.completion_tokens
    assert usage.prompt_tokens == r.usage.prompt_tokens


def test_completions_and_stop_strings(client):
    r = client.completions.create(model=MODEL_ID, prompt="One, two, three, four,", max_tokens=6, temperature=0)
    assert r.object == "text_completion"
    assert r.id.startswith("cmpl-")
    text = r.choices[0].text
    assert text
    assert r.usage.completion_tokens <= 6
    # Stop at the first comma of the same greedy continuation (" five, six, ..."): the text
    # before it, without the comma.
    assert "," in text
    s = client.completions.create(model=MODEL_ID, prompt="One, two, three, four,", max_tokens=6, temperature=0, stop=[","])
    assert s.choices[0].text == text.split(",")[0]
    assert s.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=MODEL_ID, prompt="One, two, three, four,", max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text


def test_seed_reproducibility(client):
    kwargs = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=6, temperature=0.8, seed=1234)
    a = client.chat.completions.create(**kwargs)
    b = client.chat.completions.create(**kwargs)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_logprobs(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=2, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-3


def test_errors(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=2, n=17)
    assert "n" == e.value.body.get("param")
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=QUESTION, max_tokens=2)
    bad = openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    # /metrics needs no key and counts what happened.
    with urllib.request.urlopen(server + "/metrics") as r:
        text = r.read().decode()
    assert "weft_generation_tokens_total" in text
    with urllib.request.urlopen(server + "/health") as r:
        assert json.loads(r.read())["status"] == "ok"

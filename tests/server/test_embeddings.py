"""`/v1/embeddings` against the official OpenAI Python client, on the tiny Qwen3 embedding
fixture (tests/fixtures/qwen3_embedding, `tools/make_embedding_fixtures.py`): the client's
`embeddings.create` (which asks for base64 and decodes it) gives sentence-transformers'
vectors (cosine >= 0.999, the tolerance of tests/embeddings.rs), floats and token-id inputs
give the same, `dimensions` truncates and renormalises, and bad requests are 400s naming
their field.
"""

import json
import math
import urllib.request
from pathlib import Path

import openai
import pytest

from replica import ROOT, serve, stop

FIXTURE = ROOT / "tests" / "fixtures" / "qwen3_embedding"
MODEL = FIXTURE / "model.gguf"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())["inputs"]


@pytest.fixture(scope="module")
def client():
    proc, base = serve(MODEL, "--max-num-seqs", "8")
    try:
        yield openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=120, max_retries=0), base
    finally:
        stop(proc)


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_embeddings_match_sentence_transformers(client):
    c, _ = client
    r = c.embeddings.create(model=MODEL.stem, input=[e["text"] for e in EXPECTED])
    assert r.object == "list" and r.model == MODEL.stem
    assert [d.index for d in r.data] == list(range(len(EXPECTED)))
    for d, e in zip(r.data, EXPECTED):
        assert len(d.embedding) == len(e["embedding"])
        assert cosine(d.embedding, e["embedding"]) >= 0.999, e["text"]
    assert r.usage.prompt_tokens == sum(len(e["ids"]) for e in EXPECTED)
    assert r.usage.total_tokens == r.usage.prompt_tokens

    floats = c.embeddings.create(model=MODEL.stem, input=EXPECTED[0]["text"], encoding_format="float")
    ids = c.embeddings.create(model=MODEL.stem, input=EXPECTED[0]["ids"])
    assert floats.data[0].embedding == pytest.approx(r.data[0].embedding, abs=1e-7)
    assert ids.data[0].embedding == pytest.approx(r.data[0].embedding, abs=1e-7)

    short = c.embeddings.create(model=MODEL.stem, input=EXPECTED[0]["text"], dimensions=16)
    assert len(short.data[0].embedding) == 16
    assert cosine(short.data[0].embedding, r.data[0].embedding[:16]) > 0.99999


def post(base, body):
    req = urllib.request.Request(base + "/v1/embeddings", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_bad_requests_name_their_field(client):
    _, base = client
    for body, param in [
        ({"input": "a", "dimensions": 65}, "dimensions"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": []}, "input"),
        ({"input": "a", "temperature": 1}, "temperature"),
    ]:
        status, answer = post(base, body)
        assert status == 400, answer
        assert answer["error"]["param"] == param, answer

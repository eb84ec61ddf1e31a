"""`/v1/embeddings` against the official OpenAI Python client, on the tiny Qwen3 embedding
fixture (tests/fixtures/qwen3_embedding, `tools/make_embedding_fixtures.py`): the client's
`embeddings.create` (which asks for base64 and decodes it) gives sentence-transformers'
vectors (cosine >= 0.999, the tolerance of tests/embeddings.rs), floats and token-id inputs
give the same, `dimensions` truncates and renormalises, and bad requests are 400s naming
their field; and on the tiny BERT encoder fixture (tests/fixtures/bert_embedding, bge's CLS
pooling): the same agreement, an input longer than a step's token budget refused as a 400
naming max_num_batched_tokens (the others of the request unaffected in later requests), and a
chat completion refused as a 400 pointing to /v1/embeddings.
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
BERT = ROOT / "tests" / "fixtures" / "bert_embedding"
BERT_MODEL = BERT / "model.gguf"
BERT_EXPECTED = json.loads((BERT / "expected.json").read_text())["inputs"]
# A step of 20 tokens: the fixture's inputs are 6, 16, 9 and 21 tokens long.
BERT_BUDGET = 20


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


@pytest.fixture(scope="module")
def bert():
    proc, base = serve(BERT_MODEL, "--max-num-seqs", "8", "--max-num-batched-tokens", str(BERT_BUDGET))
    try:
        yield openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=120, max_retries=0)
    finally:
        stop(proc)


def test_bert_embeddings_match_sentence_transformers(bert):
    fits = [e for e in BERT_EXPECTED if len(e["ids"]) <= BERT_BUDGET]
    assert len(fits) == 3
    r = bert.embeddings.create(model=BERT_MODEL.stem, input=[e["text"] for e in fits])
    for d, e in zip(r.data, fits):
        assert cosine(d.embedding, e["embedding"]) >= 0.999, e["text"]
    assert r.usage.prompt_tokens == sum(len(e["ids"]) for e in fits)
    ids = bert.embeddings.create(model=BERT_MODEL.stem, input=fits[0]["ids"])
    assert ids.data[0].embedding == pytest.approx(r.data[0].embedding, abs=1e-7)


def test_bert_refuses_a_prompt_past_one_step_and_generation(bert):
    long = next(e for e in BERT_EXPECTED if len(e["ids"]) > BERT_BUDGET)
    with pytest.raises(openai.BadRequestError) as err:
        bert.embeddings.create(model=BERT_MODEL.stem, input=[BERT_EXPECTED[0]["text"], long["text"]])
    assert "max_num_batched_tokens" in str(err.value) and err.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as err:
        bert.chat.completions.create(model=BERT_MODEL.stem, messages=[{"role": "user", "content": "hello"}])
    assert "/v1/embeddings" in str(err.value)
    r = bert.embeddings.create(model=BERT_MODEL.stem, input=BERT_EXPECTED[0]["text"])
    assert cosine(r.data[0].embedding, BERT_EXPECTED[0]["embedding"]) >= 0.999

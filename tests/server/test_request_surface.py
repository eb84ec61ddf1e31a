"""`weft serve`'s request surface on the tiny model: every request field honoured or refused
(through the official OpenAI client), `n` choices, vLLM's /tokenize and /detokenize,
`--chat-template FILE` and `--cors-origin`; and on the tiny Qwen3 (`tiny_model` writes it
beside the tiny model as `<name>-qwen3.gguf`: Qwen3's real chat template, `<think>` and
`</think>` in its vocabulary), reasoning separated into `reasoning_content` and
`chat_template_kwargs`.

    WEFT_BIN=target/release/weft WEFT_TINY_MODEL=target/tiny.gguf \\
        target/pyvenv/bin/python -m pytest tests/server/test_request_surface.py

The tiny model's vocabulary is GPT-2's 256 byte tokens, one merge ("ĠĠ", two spaces) and three
special tokens (257 <|endoftext|>, 258 <|im_start|>, 259 <|im_end|>); it adds no BOS.
"""

import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from replica import serve, stop

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("WEFT_BIN", ROOT / "target" / "release" / "weft"))
TINY = Path(os.environ.get("WEFT_TINY_MODEL", ROOT / "target" / "tiny.gguf"))
QWEN3 = TINY.with_name(TINY.stem + "-qwen3.gguf")
ASK = [{"role": "user", "content": "hi"}]
TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)








def _call(base, method, path, body=None, headers=None):
    """(status, headers, body) of one request; `body` is a dict (sent as JSON) or raw bytes."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def _json(base, path, body, headers=None):
    status, _, raw = _call(base, "POST", path, body, headers)
    return status, json.loads(raw)


@pytest.fixture(scope="module")
def plain():
    proc, base = serve(TINY)
    try:
        yield base, openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=300, max_retries=0)
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def custom(tmp_path_factory):
    """--chat-template, two --cors-origin and an API key."""
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(TEMPLATE)
    proc, base = serve(
        TINY,
        "--chat-template", str(template),
        "--cors-origin", "http://a.test",
        "--cors-origin", "http://b.test:8080/",
        "--api-key", "k",
    )
    try:
        yield base
    finally:
        stop(proc)


# ---------------------------------------------------------------------------------------------
# Request fields.


def _refused(call, param):
    with pytest.raises(openai.BadRequestError) as e:
        call()
    err = e.value.body
    err = err.get("error", err)
    assert err["param"] == param, err
    assert param in err["message"], err
    return err["message"]


def test_unsupported_fields_are_refused_by_name(plain):
    _, client = plain
    chat = lambda **kw: client.chat.completions.create(model=TINY.stem, messages=ASK, max_tokens=2, **kw)  # noqa: E731
    text = lambda **kw: client.completions.create(**{"model": TINY.stem, "prompt": "hi", "max_tokens": 2, **kw})  # noqa: E731
    assert "1 to 16 choices" in _refused(lambda: chat(n=17), "n")
    _refused(lambda: chat(n=0), "n")
    # logit_bias is honoured (test_honoured_fields); values it cannot be are refused.
    assert "outside the vocabulary" in _refused(lambda: chat(logit_bias={"260": -100}), "logit_bias")
    assert "between -100 and 100" in _refused(lambda: text(logit_bias={"50": 101}), "logit_bias")
    assert "not a token id" in _refused(lambda: text(logit_bias={"a": 5}), "logit_bias")
    assert "must be a number" in _refused(lambda: chat(logit_bias={"50": "up"}), "logit_bias")
    assert "at most 300" in _refused(lambda: chat(logit_bias={str(t): 1 for t in range(301)}), "logit_bias")
    _refused(lambda: chat(reasoning_effort="low"), "reasoning_effort")
    _refused(lambda: chat(modalities=["text", "audio"]), "modalities")
    _refused(lambda: text(suffix="end"), "suffix")
    _refused(lambda: text(echo=True), "echo")
    _refused(lambda: text(best_of=2), "best_of")
    assert "unknown field" in _refused(lambda: chat(extra_body={"frobnicate": True}), "frobnicate")
    assert "max_tokens is 2" in _refused(lambda: chat(max_completion_tokens=3), "max_completion_tokens")
    _refused(lambda: text(prompt=["a", "b"]), "prompt")
    _refused(lambda: text(extra_body={"stop_token_ids": [1, 99999]}), "stop_token_ids")
    _refused(lambda: text(prompt=[1, 99999]), "prompt")
    # Asking for nothing weft cannot do is fine; the metadata fields are accepted and ignored.
    r = chat(n=1, logit_bias={}, modalities=["text"], user="u", metadata={"a": "b"}, store=True,
             service_tier="auto", prompt_cache_key="k", safety_identifier="s")
    assert r.usage.completion_tokens <= 2


def test_honoured_fields(plain):
    _, client = plain
    greedy = dict(model=TINY.stem, max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    long = client.completions.create(prompt="hello", **greedy)
    assert (long.usage.completion_tokens, long.choices[0].finish_reason) == (5, "length")
    # Every id stops: the first token ends the answer.
    stop_all = dict(greedy, extra_body={"ignore_eos": True, "stop_token_ids": list(range(260)), "priority": -5})
    short = client.completions.create(prompt="hello", **stop_all)
    assert (short.usage.completion_tokens, short.choices[0].finish_reason) == (1, "stop")
    # A prompt of token ids is that prompt.
    ids = [ord(c) for c in "hello"]
    by_ids = client.completions.create(prompt=ids, **greedy)
    assert by_ids.choices[0].text == long.choices[0].text
    assert by_ids.usage.prompt_tokens == 5
    assert client.completions.create(prompt=[ids], **greedy).choices[0].text == long.choices[0].text
    # logit_bias: +100 forces "a" (token 97, as ids are bytes), sampled too; with -100 on "a" and
    # +100 on "b", "b".
    forced = client.completions.create(prompt="hello", logit_bias={"97": 100}, **greedy)
    assert forced.choices[0].text == "aaaaa"
    r = client.chat.completions.create(model=TINY.stem, messages=ASK, max_tokens=3, temperature=0.7, seed=1,
                                       logit_bias={"97": 100}, extra_body={"ignore_eos": True})
    assert r.choices[0].message.content == "aaa"
    banned = client.completions.create(prompt="hello", logit_bias={"97": -100, "98": 100}, **greedy)
    assert banned.choices[0].text == "bbbbb"
    # max_completion_tokens is max_tokens.
    r = client.chat.completions.create(model=TINY.stem, messages=ASK, max_completion_tokens=3, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
    # include_usage: a last chunk with no choices and the usage.
    chunks = list(client.chat.completions.create(model=TINY.stem, messages=ASK, max_tokens=3, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
    assert all(c.usage is None for c in chunks[:-1])
    _refused(lambda: client.chat.completions.create(model=TINY.stem, messages=ASK, max_tokens=1,
                                                    stream_options={"include_usage": True}), "stream_options")


# ---------------------------------------------------------------------------------------------
# Reasoning (the tiny Qwen3).


@pytest.fixture(scope="module")
def qwen3():
    proc, base = serve(QWEN3, "--kv-memory", "16MiB")
    try:
        yield base, openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=300, max_retries=0)
    finally:
        stop(proc)


def test_reasoning_content(qwen3):
    """Qwen3 thinks by default: the random model never writes </think>, so its whole answer is
    reasoning, whole and streamed alike; with enable_thinking false it is all content."""
    base, client = qwen3
    kw = dict(model=QWEN3.stem, messages=ASK, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    r = client.chat.completions.create(**kw)
    m = r.choices[0].message
    reasoning = m.model_extra["reasoning_content"]
    assert isinstance(reasoning, str) and reasoning and m.content is None, m
    streamed = list(client.chat.completions.create(stream=True, **kw))
    deltas = [c.choices[0].delta for c in streamed if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == ""
    off = dict(kw, extra_body={"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}})
    m = client.chat.completions.create(**off).choices[0].message
    assert m.model_extra["reasoning_content"] is None and isinstance(m.content, str), m
    # The prompt differs exactly as Qwen3's template says.
    _, on_tokens = _json(base, "/tokenize", {"messages": ASK})
    _, off_tokens = _json(base, "/tokenize", {"messages": ASK, "chat_template_kwargs": {"enable_thinking": False},
                                              "return_token_strs": True})
    assert off_tokens["tokens"][:-6] == on_tokens["tokens"]
    assert off_tokens["token_strs"][-6:] == ["<think>", "Ċ", "Ċ", "</think>", "Ċ", "Ċ"]
    assert "chat_template_kwargs" in _refused(
        lambda: client.chat.completions.create(**dict(kw, extra_body={"chat_template_kwargs": {"tools": []}})),
        "chat_template_kwargs")
    assert "expected an object" in _refused(
        lambda: client.chat.completions.create(**dict(kw, extra_body={"chat_template_kwargs": True})),
        "chat_template_kwargs")


def test_structured_output_applies_after_thinking(qwen3):
    """With thinking off the constraint holds from the first token; with thinking on it waits for
    </think>, which the random model never writes, so nothing constrained comes back as content."""
    _, client = qwen3
    kw = dict(model=QWEN3.stem, messages=ASK, max_tokens=8, temperature=0)
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}
    no_thinking = {"chat_template_kwargs": {"enable_thinking": False}}
    off = client.chat.completions.create(response_format=fmt, extra_body=no_thinking, **kw)
    int(off.choices[0].message.content)
    on = client.chat.completions.create(response_format=fmt, extra_body={"ignore_eos": True}, **kw)
    assert on.choices[0].message.content is None and on.choices[0].message.model_extra["reasoning_content"]


def test_reasoning_parser_flag(tmp_path):
    proc, base = serve(QWEN3, "--kv-memory", "16MiB", "--reasoning-parser", "none")
    try:
        status, r = _json(base, "/v1/chat/completions", {"messages": ASK, "max_tokens": 2})
        assert status == 200 and "reasoning_content" not in r["choices"][0]["message"], r
    finally:
        stop(proc)
    out = subprocess.run([str(BIN), "serve", "--reasoning-parser", "granite", "--model", str(QWEN3)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "unknown reasoning parser" in out.stderr and "qwen3" in out.stderr, out.stderr


# ---------------------------------------------------------------------------------------------
# n choices.


def test_n_seeded_choices_are_single_requests(qwen3):
    """Choice i of a seeded request is the single request seeded seed + i, whole and streamed,
    chat and text; the usage counts the prompt once. (On the tiny Qwen3 with thinking off: the
    tiny model's chat answers are newlines whatever the seed.)"""
    _, client = qwen3
    kw = dict(model=QWEN3.stem, max_tokens=6, temperature=1.0,
              extra_body={"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}})
    singles = [client.chat.completions.create(messages=ASK, seed=5 + i, **kw) for i in range(3)]
    want = [s.choices[0].message.content for s in singles]
    assert len(set(want)) > 1, want
    r = client.chat.completions.create(messages=ASK, seed=5, n=3, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.message.content for c in r.choices] == want
    assert r.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert r.usage.completion_tokens == 18
    got = ["", "", ""]
    finished = set()
    chunks = list(client.chat.completions.create(messages=ASK, seed=5, n=3, stream=True,
                                                 stream_options={"include_usage": True}, **kw))
    for c in chunks[:-1]:
        for choice in c.choices:
            got[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
    assert got == want and finished == {0, 1, 2}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 18
    kw = dict(kw, extra_body={"ignore_eos": True})
    texts = [client.completions.create(prompt="hello", seed=9 + i, **kw).choices[0].text for i in range(2)]
    assert texts[0] != texts[1]
    r = client.completions.create(prompt="hello", seed=9, n=2, **kw)
    assert [c.text for c in r.choices] == texts


# ---------------------------------------------------------------------------------------------
# /tokenize and /detokenize.


def test_tokenize_and_detokenize(plain):
    base, client = plain
    status, v = _json(base, "/tokenize", {"model": TINY.stem, "prompt": "hi   there", "return_token_strs": True})
    assert status == 200, v
    # GPT-2's pre-tokenizer leaves the last space to the word; the two before it are the merge.
    assert v["token_strs"] == ["h", "i", "ĠĠ", "Ġ", "t", "h", "e", "r", "e"]
    assert v["tokens"] == [ord("h"), ord("i"), 256] + [ord(c) for c in " there"]
    assert v["count"] == 9 and v["max_model_len"] > 0
    status, v = _json(base, "/detokenize", {"model": TINY.stem, "tokens": v["tokens"]})
    assert (status, v) == (200, {"prompt": "hi   there"})

    status, v = _json(base, "/tokenize", {"messages": ASK})
    assert status == 200 and v["token_strs"] is None, v
    _, text = _json(base, "/detokenize", {"tokens": v["tokens"]})
    assert text["prompt"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # The same tokens a chat completion's prompt is.
    r = client.chat.completions.create(model=TINY.stem, messages=ASK, max_tokens=1)
    assert r.usage.prompt_tokens == v["count"]
    _, v = _json(base, "/tokenize", {"messages": ASK, "add_generation_prompt": False})
    _, text = _json(base, "/detokenize", {"tokens": v["tokens"]})
    assert text["prompt"] == "<|im_start|>user\nhi<|im_end|>\n"


@pytest.mark.parametrize(
    "path,body,status,param,needle",
    [
        ("/tokenize", b'{"prompt": ', 400, None, "not valid JSON"),
        ("/tokenize", b"[1]", 400, None, "JSON object"),
        ("/tokenize", {"model": "gpt-4", "prompt": "a"}, 404, "model", "does not exist"),
        ("/tokenize", {"prompt": "a", "messages": ASK}, 400, "messages", "not both"),
        ("/tokenize", {}, 400, None, "needs a prompt"),
        ("/tokenize", {"prompt": ["a"]}, 400, "prompt", "expected a string"),
        ("/tokenize", {"prompt": "a", "add_generation_prompt": True}, 400, "add_generation_prompt", "unknown"),
        ("/tokenize", {"messages": ASK, "continue_final_message": True}, 400, "continue_final_message", "remove"),
        ("/detokenize", b"{", 400, None, "not valid JSON"),
        ("/detokenize", {"tokens": [104, 260]}, 400, "tokens", "token id 260 is outside the vocabulary (ids 0 to 259)"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens", "not a token id"),
        ("/detokenize", {"tokens": "104"}, 400, "tokens", "a list of token ids"),
        ("/detokenize", {}, 400, "tokens", "missing"),
    ],
)
def test_tokenize_errors(plain, path, body, status, param, needle):
    base, _ = plain
    got, headers, raw = _call(base, "POST", path, body)
    err = json.loads(raw)["error"]
    assert got == status, err
    assert err["param"] == param and needle in err["message"], err
    assert err["type"] == "invalid_request_error"


# ---------------------------------------------------------------------------------------------
# --chat-template and --cors-origin.


def test_chat_template_file_replaces_the_models(custom):
    key = {"Authorization": "Bearer k"}
    status, v = _json(custom, "/tokenize", {"messages": ASK}, key)
    assert status == 200, v
    _, text = _json(custom, "/detokenize", {"tokens": v["tokens"]}, key)
    assert text["prompt"] == "[user]hi[assistant]"
    client = openai.OpenAI(base_url=custom + "/v1", api_key="k", timeout=300, max_retries=0)
    r = client.chat.completions.create(model=TINY.stem, messages=ASK, max_tokens=1)
    assert r.usage.prompt_tokens == len("[user]hi[assistant]") == v["count"]
    # The key guards the token endpoints too.
    assert _call(custom, "POST", "/tokenize", {"prompt": "a"})[0] == 401


def test_bad_chat_template_or_origin_stops_at_start(tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for %}")
    for flags, needle in [
        (["--chat-template", str(bad)], "does not parse"),
        (["--chat-template", str(tmp_path / "missing.jinja")], "cannot read --chat-template"),
        (["--cors-origin", "localhost:5173"], "is not an origin"),
    ]:
        r = subprocess.run([str(BIN), "serve", "--model", str(TINY), "--port", "0", *flags],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and needle in r.stderr, (flags, r.stderr)


def test_cors_preflight_and_headers(custom, plain):
    preflight = {"Origin": "http://a.test", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    # Answered before the API key is asked for (browsers send none in a preflight).
    status, headers, _ = _call(custom, "OPTIONS", "/v1/chat/completions", headers=preflight)
    assert status == 204
    assert headers["access-control-allow-origin"] == "http://a.test"
    assert "POST" in headers["access-control-allow-methods"]
    assert headers["access-control-allow-headers"] == "authorization, content-type"
    assert "origin" in headers["vary"].lower()
    # The second origin was given with a trailing slash; browsers send none.
    status, headers, _ = _call(custom, "OPTIONS", "/tokenize", headers=dict(preflight, Origin="http://b.test:8080"))
    assert status == 204 and headers["access-control-allow-origin"] == "http://b.test:8080"
    status, headers, raw = _call(custom, "OPTIONS", "/tokenize", headers=dict(preflight, Origin="http://evil.test"))
    assert status == 403 and "access-control-allow-origin" not in headers
    assert "--cors-origin http://evil.test" in json.loads(raw)["error"]["message"]
    # Answers to an allowed origin say so, errors included; others do not.
    auth = {"Authorization": "Bearer k"}
    status, headers, _ = _call(custom, "POST", "/tokenize", {"prompt": "a"}, dict(auth, Origin="http://a.test"))
    assert status == 200 and headers["access-control-allow-origin"] == "http://a.test"
    status, headers, _ = _call(custom, "POST", "/tokenize", {"prompt": "a"}, {"Origin": "http://a.test"})
    assert status == 401 and headers["access-control-allow-origin"] == "http://a.test"
    status, headers, _ = _call(custom, "POST", "/tokenize", {"prompt": "a"}, dict(auth, Origin="http://evil.test"))
    assert status == 200 and "access-control-allow-origin" not in headers
    assert "origin" in headers["vary"].lower(), "a cache must tell the origins apart"
    # Without --cors-origin: no CORS at all.
    base, _ = plain
    status, headers, _ = _call(base, "OPTIONS", "/v1/chat/completions", headers=preflight)
    assert status == 405 and "access-control-allow-origin" not in headers
    status, headers, _ = _call(base, "POST", "/tokenize", {"prompt": "a"}, {"Origin": "http://a.test"})
    assert status == 200 and "access-control-allow-origin" not in headers


def test_cors_any_origin(tmp_path):
    proc, base = serve(TINY, "--cors-origin", "*")
    try:
        preflight = {"Origin": "http://anywhere.test", "Access-Control-Request-Method": "POST"}
        status, headers, _ = _call(base, "OPTIONS", "/v1/completions", headers=preflight)
        assert status == 204 and headers["access-control-allow-origin"] == "*"
        assert "content-type" in headers["access-control-allow-headers"]
        status, headers, _ = _call(base, "GET", "/v1/models", headers={"Origin": "http://x.test"})
        assert status == 200 and headers["access-control-allow-origin"] == "*"
    finally:
        stop(proc)

"""Structured output and tool calling through `weft serve`, with the official OpenAI client.

Most tests run weft's tiny random model (`WEFT_TINY_MODEL`, written by
`cargo run --release --example tiny_model -- PATH`; `cargo xtask test` does it): whatever a
random model would say, the token masks force valid output, and it is fast on a software GPU.
One short check runs the default model (`WEFT_MODEL`).

    WEFT_BIN=target/release/weft WEFT_TINY_MODEL=target/tiny.gguf \\
        WEFT_MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf target/pyvenv/bin/python -m pytest tests/server
"""

import concurrent.futures
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated, List, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from replica import serve, stop

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("WEFT_BIN", ROOT / "target" / "release" / "weft"))
TINY = Path(os.environ.get("WEFT_TINY_MODEL", ROOT / "target" / "tiny.gguf"))
MODEL = Path(os.environ.get("WEFT_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
ASK = [{"role": "user", "content": "Answer in JSON."}]








@pytest.fixture(scope="module")
def tiny():
    proc, base = serve(TINY)
    try:
        yield base, openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=300, max_retries=0), TINY.stem
    finally:
        stop(proc)


def create(tiny, **kwargs):
    _, client, model = tiny
    kwargs.setdefault("messages", ASK)
    kwargs.setdefault("max_tokens", 400)
    return client.chat.completions.create(model=model, **kwargs)


# Twenty JSON schemas of increasing difficulty. A random model must finish each within the
# token limit, so strings are bounded.
S = {"type": "string", "maxLength": 6}
SCHEMAS = [
    {"type": "boolean"},
    {"type": "integer", "minimum": 0, "maximum": 9},
    {"enum": ["red", "green", "blue"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {"type": "object", "properties": {"name": S}, "required": ["name"], "additionalProperties": False},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 18, "maximum": 99}}, "required": ["age"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 5}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"color": {"enum": ["red", "green"]}, "size": {"enum": [1, 2, 3]}},
     "required": ["color", "size"], "additionalProperties": False},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}, "required": ["code"],
     "additionalProperties": False},
    {"type": "object", "properties": {"when": {"type": "string", "pattern": "^20[0-9]{2}-(0[1-9]|1[0-2])$"}},
     "required": ["when"], "additionalProperties": False},
    {"type": "object", "properties": {"inner": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -5,
     "maximum": 5}}, "required": ["x"], "additionalProperties": False}}, "required": ["inner"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}}, "required": ["tags"],
     "additionalProperties": False},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 3}, {"enum": ["none"]}]},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "boolean"}, {"type": "null"}, {"const": "x"}]}},
     "required": ["v"], "additionalProperties": False},
    {"type": "object", "properties": {"price": {"type": "number", "minimum": 0, "maximum": 10, "multipleOf": 0.5}},
     "required": ["price"], "additionalProperties": False},
    {"type": "object", "properties": {"a": S, "b": {"type": "integer", "minimum": 1, "maximum": 3}, "c": {"type": "boolean"}},
     "required": ["a", "b", "c"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9}},
     "required": ["id"], "additionalProperties": False}, "minItems": 1, "maxItems": 3},
    {"$defs": {"p": {"type": "object", "properties": {"x": {"enum": [0, 1]}, "y": {"enum": [0, 1]}}, "required": ["x", "y"],
     "additionalProperties": False}}, "type": "object", "properties": {"from": {"$ref": "#/$defs/p"}, "to": {"$ref": "#/$defs/p"}},
     "required": ["from", "to"], "additionalProperties": False},
    {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1, "maximum": 100},
     "label": {"type": "string", "minLength": 2, "maxLength": 4, "pattern": "^[a-z]+$"}}, "required": ["kind", "r", "label"],
     "additionalProperties": False},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"name": S, "roles": {"type": "array", "items":
     {"enum": ["admin", "dev", "ops"]}, "minItems": 1, "maxItems": 2}}, "required": ["name", "roles"],
     "additionalProperties": False}, "active": {"type": "boolean"}, "score": {"anyOf": [{"type": "integer", "minimum": 0,
     "maximum": 10}, {"type": "null"}]}}, "required": ["user", "active", "score"], "additionalProperties": False},
]


def schema_format(i, schema):
    return {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 11}, {"temperature": 1.0, "seed": 12}])
@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_json_schemas_validate(tiny, i, sampling):
    r = create(tiny, response_format=schema_format(i, SCHEMAS[i]), **sampling)
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), SCHEMAS[i])


class Weather(BaseModel):
    city: Literal["Paris", "Oslo", "Lima"]
    rain: bool
    hours: List[Annotated[int, Field(ge=0, le=23)]] = Field(max_length=2)


def test_parse_returns_a_pydantic_object(tiny):
    _, client, model = tiny
    r = client.chat.completions.parse(model=model, messages=ASK, response_format=Weather, max_tokens=400, temperature=0)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Weather)
    assert len(parsed.hours) <= 2


def test_json_object(tiny):
    r = create(tiny, response_format={"type": "json_object"}, max_tokens=1000, temperature=1.0, seed=3)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")


def test_regex_choice_and_grammars(tiny):
    r = create(tiny, extra_body={"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}}, temperature=0)
    text = r.choices[0].message.content
    assert len(text) == 6 and text[:3].isdigit() and text[3] == "-", text
    r = create(tiny, extra_body={"guided_choice": ["alpha", "beta", "gamma"]}, temperature=1.0, seed=5)
    assert r.choices[0].message.content in ("alpha", "beta", "gamma")
    assert r.choices[0].finish_reason == "stop"
    r = create(tiny, extra_body={"guided_regex": "(yes|no)!"}, temperature=0)
    assert r.choices[0].message.content in ("yes!", "no!")
    gbnf = 'root ::= item ("," item){0,2}\nitem ::= [a-c] [0-9]'
    r = create(tiny, extra_body={"grammar": gbnf}, temperature=1.0, seed=9)
    items = r.choices[0].message.content.split(",")
    assert 1 <= len(items) <= 3 and all(len(x) == 2 and x[0] in "abc" and x[1].isdigit() for x in items), items
    lark = 'start: "<" NAME ">"\nNAME: /[a-z]{1,5}/'
    r = create(tiny, extra_body={"structured_outputs": {"grammar": lark}}, temperature=0)
    text = r.choices[0].message.content
    assert text.startswith("<") and text.endswith(">") and 3 <= len(text) <= 7, text


def test_streamed_constrained_output_matches(tiny):
    kwargs = dict(response_format=schema_format(7, SCHEMAS[7]), temperature=1.0, seed=21)
    whole = create(tiny, **kwargs).choices[0].message.content
    pieces, finish = [], None
    for chunk in create(tiny, stream=True, **kwargs):
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            finish = c.finish_reason or finish
    assert "".join(pieces) == whole
    assert finish == "stop"


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                       "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": False},
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {},
             "additionalProperties": False}}}


def _check_call(call):
    assert call.type == "function"
    assert call.id.startswith("call_")
    if call.function.name == "get_weather":
        jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])
    else:
        assert call.function.name == "get_time"
        assert json.loads(call.function.arguments) == {}


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip(tiny, stream):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    kwargs = dict(messages=messages, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice=named, temperature=0)
    if stream:
        calls, finish, content = {}, None, []
        for chunk in create(tiny, stream=True, **kwargs):
            for c in chunk.choices:
                for d in c.delta.tool_calls or []:
                    entry = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                    entry["id"] = d.id or entry["id"]
                    if d.function and d.function.name:
                        entry["name"] += d.function.name
                    if d.function and d.function.arguments:
                        entry["arguments"] += d.function.arguments
                if c.delta.content:
                    content.append(c.delta.content)
                finish = c.finish_reason or finish
        assert "".join(content).strip() == ""
        assert finish == "stop"  # a named function, as OpenAI answers
        assert list(calls) == [0]
        call_id, name, arguments = calls[0]["id"], calls[0]["name"], calls[0]["arguments"]
    else:
        r = create(tiny, **kwargs)
        message = r.choices[0].message
        assert r.choices[0].finish_reason == "stop"
        assert message.content is None
        assert len(message.tool_calls) == 1
        _check_call(message.tool_calls[0])
        call_id, name, arguments = message.tool_calls[0].id, message.tool_calls[0].function.name, message.tool_calls[0].function.arguments
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER_TOOL["function"]["parameters"])

    messages += [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function",
                                                                "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": '{"temperature": 21}'},
    ]
    final = create(tiny, messages=messages, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="none", max_tokens=8, temperature=0)
    assert final.choices[0].message.tool_calls is None
    assert final.choices[0].finish_reason in ("stop", "length")
    assert isinstance(final.choices[0].message.content, str)


def test_required_tool_choice_calls_some_tool(tiny):
    r = create(tiny, messages=[{"role": "user", "content": "Help."}], tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="required",
               parallel_tool_calls=False, temperature=1.0, seed=4)
    assert r.choices[0].finish_reason == "tool_calls"
    assert len(r.choices[0].message.tool_calls) == 1
    _check_call(r.choices[0].message.tool_calls[0])


def test_sixteen_requests_half_constrained_leave_the_others_alone(tiny):
    def request(i):
        kwargs = dict(messages=[{"role": "user", "content": f"Request number {i}."}], temperature=0.8, seed=100 + i)
        if i % 2 == 0:
            kwargs.update(response_format=schema_format(i, SCHEMAS[3 + i % 8]))
        else:
            kwargs.update(max_tokens=10 + i)
        return create(tiny, **kwargs).choices[0].message.content

    solo = [request(i) for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(request, range(16)))
    for i in range(1, 16, 2):
        assert together[i] == solo[i], f"unconstrained request {i} changed in a batch with constrained ones"
    for i in range(0, 16, 2):
        jsonschema.validate(json.loads(together[i]), SCHEMAS[3 + i % 8])


BAD = [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}), "response_format"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5,
                                                                                            "maximum": 1}}}), "response_format"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "response_format"),
    (dict(response_format={"type": "xml"}), "response_format"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "http://example.com/s"}}}),
     "response_format"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array",
                                                                                            "uniqueItems": True}}}),
     "response_format"),
    (dict(extra_body={"structured_outputs": {"regex": "[a-z"}}), "structured_outputs"),
    (dict(extra_body={"structured_outputs": {"regex": "a", "choice": ["a"]}}), "structured_outputs"),
    (dict(extra_body={"guided_regex": "(?<=a)b"}), "guided_regex"),
    (dict(extra_body={"guided_choice": []}), "guided_choice"),
    (dict(extra_body={"guided_choice": "yes"}), "guided_choice"),
    (dict(extra_body={"guided_json": "{not json"}), "guided_json"),
    (dict(extra_body={"guided_grammar": "start: undefined_rule"}), "guided_grammar"),
    (dict(extra_body={"grammar": "root ::= [abc"}), "grammar"),
    (dict(extra_body={"grammar": "expr ::= \"a\""}), "grammar"),
    (dict(extra_body={"grammar": "root ::= \"a\" | ( \"b\""}), "grammar"),
    (dict(extra_body={"grammar": "root ::= " + " | ".join(f'"{i}"' for i in range(40000))}), "grammar"),
    (dict(response_format={"type": "json_object"}, extra_body={"guided_regex": "a"}), "guided_regex"),
    (dict(tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "bad name"}}]), "tools"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties":
                                                                                 {"a": {"type": "strnig"}}}}}],
          tool_choice="required"), "tools"),
    (dict(tools=[WEATHER_TOOL], tool_choice="required", response_format={"type": "json_object"}), "tool_choice"),
]


@pytest.mark.parametrize("kwargs,param", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_constraints_are_400s_naming_the_field(tiny, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        create(tiny, max_tokens=4, **kwargs)
    assert e.value.body.get("param") == param, e.value.body
    assert e.value.body.get("message")


def test_the_server_keeps_serving_after_bad_constraints(tiny):
    base, _, _ = tiny
    r = create(tiny, extra_body={"guided_choice": ["still here"]}, temperature=0)
    assert r.choices[0].message.content == "still here"
    with urllib.request.urlopen(base + "/metrics") as m:
        text = m.read().decode()
    assert "weft_token_mask_seconds" in text


class Capital(BaseModel):
    city: Literal["Paris", "London", "Berlin"]


def test_the_default_model_answers_a_schema():
    """The one real-model check: a BPE vocabulary of 49k tokens under a schema."""
    proc, base = serve(MODEL)
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=300, max_retries=0)
        r = client.chat.completions.parse(
            model=MODEL.stem, messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
            response_format=Capital, max_tokens=16, temperature=0)
        assert r.choices[0].message.parsed == Capital(city="Paris")
    finally:
        stop(proc)

"""`api.protocol`: the one OpenAI request parser (strict for servers, lenient for the gateway) and the SSE encoder."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.api.protocol import MAX_INT, BadRequest, parse_call, parse_json, parse_request, sse
from fairserve.api.tokens import MESSAGE_TOKENS, estimate_tokens
from fairserve.gateway.admission.footprint import DEFAULT_MAX_TOKENS, Footprint
from fairserve.gateway.http.body import BodyError, parse_body, upstream_body

pytestmark = pytest.mark.unit

MSG = [{"role": "user", "content": "hello there"}]


def refusal(body: dict, chat: bool, strict: bool) -> BadRequest:
    with pytest.raises(BadRequest) as e:
        parse_request(body, chat, strict=strict)
    return e.value


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize(
    "body,chat,param,words",
    [
        ({"prompt": "a", "max_tokens": 0}, False, "max_tokens", "must be >= 1"),
        ({"prompt": "a", "max_tokens": "8"}, False, "max_tokens", "must be an integer"),
        ({"prompt": "a", "max_tokens": True}, False, "max_tokens", "must be an integer"),
        ({"prompt": "a", "max_tokens": 2.5}, False, "max_tokens", "must be an integer"),
        ({"prompt": "a", "max_tokens": MAX_INT + 1}, False, "max_tokens", "too large"),
        ({"prompt": "a", "max_tokens": 10**30}, False, "max_tokens", "too large"),
        ({"messages": MSG, "max_completion_tokens": 10**400}, True, "max_completion_tokens", "too large"),
        ({"prompt": "a", "n": 0}, False, "n", "must be >= 1"),
        ({"prompt": "a", "n": 10**20}, False, "n", "too large"),
        ({"prompt": "a", "stream": "yes"}, False, "stream", "must be a boolean"),
        ({"prompt": "a", "stream_options": {"include_usage": True}}, False, "stream_options", "only allowed"),
        ({"prompt": "a", "stream": True, "stream_options": 3}, False, "stream_options", "must be an object"),
        ({"prompt": "a", "ignore_eos": 1}, False, "ignore_eos", "must be a boolean"),
        ({"prompt": {"a": 1}}, False, "prompt", "'prompt' must be"),
        ({"max_tokens": 3}, False, "prompt", "Missing required parameter: 'prompt'"),
        ({"messages": []}, True, "messages", "non-empty array"),
        ({"messages": [{"content": "x"}]}, True, "messages[0]", "string 'role'"),
        ({"messages": [{"role": "user", "content": 5}]}, True, "messages[0].content", "string or an array"),
        ({"messages": [{"role": "user", "content": [{"text": 5}]}]}, True, "messages[0].content", "'text'"),
        ({"prompt": "a", "model": 3}, False, "model", "must be a string"),
    ],
)
def test_one_set_of_rules_and_messages_in_both_modes(body, chat, param, words, strict):
    e = refusal({"model": "m", **body} if "model" not in body else body, chat, strict)
    assert (e.param, words in e.message) == (param, True), e.message
    assert len(e.message) < 120  # a huge number is cut, not repeated


def test_what_only_the_strict_mode_refuses():
    for body, param in (
        ({"prompt": [1, 2]}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "a", "n": 2}, "n"),
    ):
        assert refusal(body, False, strict=True).param == param
        assert parse_request({"model": "m", **body}, False, strict=False).prompt_tokens >= 1
    assert refusal({"prompt": "a", "n": 2}, False, strict=True).message == "Only n=1 is supported."
    assert refusal({"prompt": "a"}, False, strict=False).param == "model"  # a proxy must name the model
    assert parse_call({"prompt": "a"}, False).model is None


def test_lenient_mode_counts_every_prompt_and_keeps_n():
    r = parse_request(
        {"model": "m", "prompt": ["abcdefgh", [1, 2, 3], 7], "n": 3, "max_tokens": 5, "x": {}}, False, strict=False
    )
    assert (r.prompt_tokens, r.n, r.max_tokens) == (2 + 3 + 1, 3, 5)
    chat = parse_request(
        {
            "model": "m",
            "messages": MSG,
            "max_tokens": 9,
            "max_completion_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        True,
        strict=False,
    )
    assert (chat.max_tokens, chat.stream, chat.include_usage) == (4, True, True)
    assert chat.prompt_tokens == estimate_tokens("hello there") + MESSAGE_TOKENS  # one message: its markers


def test_parse_call_defaults():
    call = parse_call({"prompt": ""}, False)
    assert (call.prompt_tokens, call.max_tokens, call.stream) == (1, 16, False)
    assert parse_call({"messages": MSG}, True).max_tokens == 256
    assert parse_call({"messages": MSG}, True, default_max_tokens=40).max_tokens == 40
    assert parse_call({"prompt": ["xy"], "max_tokens": 3, "ignore_eos": True}, False).prompt == "xy"


def test_gateway_parse_body_refuses_huge_integers_and_passes_bytes_through():
    for huge in (b"1" + b"0" * 30, b"1" + b"0" * 400, b"2147483648"):
        with pytest.raises(BodyError, match="too large"):
            parse_body(b'{"model": "m", "prompt": "a", "max_tokens": ' + huge + b"}", "completions")
    raw = b'{"model":"m","prompt":[[1,2],[3]],"logit_bias":{"5":1},"n":2}'
    parsed = parse_body(raw, "completions")
    assert parsed.footprint == Footprint(3, DEFAULT_MAX_TOKENS, 4) and parsed.max_tokens is None
    assert upstream_body(parsed) == raw[:-1] + b',"max_tokens":512}'  # the default, sent
    bounded = b'{"model":"m","prompt":"a","max_tokens":7}'
    assert upstream_body(parse_body(bounded, "completions")) == bounded
    with pytest.raises(BodyError):
        parse_body(b"{not json", "chat")


def test_parse_json():
    assert parse_json(b'{"a": NaN}')["a"] != 0  # json's extensions, where orjson refuses
    for bad in (b"{x", b"\xff", b'{"a": ' + b"1" * 5000 + b"}", b"[" * 100_000):
        with pytest.raises(BadRequest):
            parse_json(bad)


SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(doc=JSON)
def test_sse_is_one_compact_event_that_decodes_to_the_value(doc):
    event = sse(doc)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n") == 2
    assert json.loads(event[6:-2]) == doc


def test_sse_falls_back_for_what_orjson_refuses():
    assert sse({"a": 10**30, "b": "\ud800"}) == b'data: {"a":1000000000000000000000000000000,"b":"\\ud800"}\n\n'
    assert sse({"t": "é", "n": [1, None]}) == 'data: {"t":"é","n":[1,null]}\n\n'.encode()

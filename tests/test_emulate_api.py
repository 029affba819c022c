"""The emulator's model ids, /v1/embeddings, /v1/responses, /tokenize and /detokenize, through the official client."""

from __future__ import annotations

import contextlib
import math

import httpx
import openai
import pytest

from fairserve.api.embeddings import vector
from fairserve.api.server import running_server
from fairserve.api.tokenize import text_of, token_ids
from fairserve.api.tokens import MESSAGE_TOKENS, OUTPUT_PIECE, estimate_tokens
from fairserve.emulate import EmulatorConfig, create_app
from fairserve.emulate.cli import add_parser, config_from_args

pytestmark = pytest.mark.integration

PROMPT = "The quick brown fox jumps over the lazy dog, twice."  # 13 estimated tokens


@contextlib.contextmanager
def emulator(**config):
    app = create_app(EmulatorConfig(time_scale=50, **config))
    with running_server(app) as url:
        yield url, app.state.emulator, openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def test_named_models_are_served_and_others_are_404():
    with emulator(models=("llama-8b", "llama-70b"), loras=("sql-lora",)) as (url, em, client):
        listed = {m.id: m.model_dump().get("parent") for m in client.models.list()}
        assert listed == {"llama-8b": None, "llama-70b": None, "sql-lora": "llama-8b"}
        assert client.completions.create(model="sql-lora", prompt=PROMPT, max_tokens=2).model == "sql-lora"
        with pytest.raises(openai.NotFoundError) as e:
            client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=2)
        assert e.value.code == "model_not_found" and "llama-8b" in e.value.message
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="gpt-4", input="x")
        r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
        assert r.json()["model"] == "llama-8b"  # no model named: the first one
        assert em.outcomes["finished"] == 2  # the 404s never reached the engine


def test_without_named_models_any_model_is_accepted():
    with emulator() as (_, _em, client):
        assert [m.id for m in client.models.list()] == ["fairserve-emulated"]
        assert client.completions.create(model="whatever", prompt=PROMPT, max_tokens=1).model == "whatever"


def test_embeddings_float_and_base64_through_the_client():
    with emulator(models=("e5",)) as (_, em, client):
        r = client.embeddings.create(model="e5", input=[PROMPT, "hi"])  # the client asks for base64 and decodes it
        assert [d.index for d in r.data] == [0, 1] and r.model == "e5"
        assert r.usage.prompt_tokens == estimate_tokens(PROMPT) + estimate_tokens("hi")
        assert r.data[0].embedding == pytest.approx(vector(PROMPT, 32), abs=1e-6)  # float32 round trip
        assert math.isclose(sum(v * v for v in r.data[1].embedding), 1.0, rel_tol=1e-5)
        f = client.embeddings.create(model="e5", input=[[1, 2, 3]], encoding_format="float", dimensions=8)
        assert len(f.data[0].embedding) == 8 and f.usage.prompt_tokens == 3
        assert em.prompt_tokens_total == r.usage.prompt_tokens + 3  # each ran as a prefill in the engine
        with pytest.raises(openai.BadRequestError) as e:
            client.embeddings.create(model="e5", input=[], encoding_format="float")
        assert e.value.body["param"] == "input"


def test_responses_streamed_and_not_through_the_client():
    with emulator() as (_, em, client):
        r = client.responses.create(model="m", input=PROMPT, instructions="Be brief.", max_output_tokens=5)
        assert r.status == "completed" and r.output_text == OUTPUT_PIECE * 5
        # NOTE: the instructions and the input, each a templated message with its role markers
        assert (r.usage.input_tokens, r.usage.output_tokens) == (
            estimate_tokens("Be brief.\n" + PROMPT) + 2 * MESSAGE_TOKENS,
            5,
        )
        messages = [{"role": "user", "content": [{"type": "input_text", "text": PROMPT}]}]
        events = list(client.responses.create(model="m", input=messages, max_output_tokens=4, stream=True))
        kinds = [e.type for e in events]
        assert kinds[:4] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
        assert kinds.count("response.output_text.delta") == 4 and kinds[-1] == "response.completed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        done = events[-1].response
        assert done.output_text == OUTPUT_PIECE * 4 and (done.usage.input_tokens, done.usage.output_tokens) == (
            estimate_tokens(PROMPT) + MESSAGE_TOKENS,
            4,
        )
        assert em.generation_tokens_total == 9
        for field in ("previous_response_id", "background"):
            with pytest.raises(openai.BadRequestError) as e:
                client.responses.create(model="m", input="x", **{field: "resp_1" if field[0] == "p" else True})
            assert e.value.body["param"] == field and "stateless" in e.value.message


def test_tokenize_and_detokenize_round_trip():
    text = "Grüße, world: 🙂 tokens"
    assert text_of(token_ids(text)) == text and len(token_ids(text)) == estimate_tokens(text)
    with emulator(models=("m",)) as (url, em, _):
        t = httpx.post(url + "/tokenize", json={"model": "m", "prompt": PROMPT}).json()
        assert t["count"] == estimate_tokens(PROMPT) == len(t["tokens"])
        chat = httpx.post(url + "/tokenize", json={"messages": [{"role": "user", "content": PROMPT}]}).json()
        assert chat["tokens"] == t["tokens"]
        d = httpx.post(url + "/detokenize", json={"model": "m", "tokens": t["tokens"]}).json()
        assert d == {"prompt": PROMPT}
        assert httpx.post(url + "/tokenize", json={"model": "x", "prompt": "a"}).status_code == 404
        bad = httpx.post(url + "/detokenize", json={"tokens": ["a"]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
        assert em.outcomes["finished"] == 0  # never reached the engine


def test_cli_models_and_their_errors():
    import argparse

    parser = argparse.ArgumentParser()
    emulate = add_parser(parser.add_subparsers())
    args = emulate.parse_args(["--model", "a", "--model", "b", "--lora", "l"])
    assert config_from_args(args).served == ("a", "b", "l")
    for argv, message in ((["--lora", "l"], "need a base model"), (["--model", "a", "--model", "a"], "distinct")):
        with pytest.raises(ValueError, match=message):
            config_from_args(emulate.parse_args(argv))

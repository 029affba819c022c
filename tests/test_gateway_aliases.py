"""Model aliases: `aliases = { "gpt-4o" = "llama-3-8b" }` routes, serves and logs a request that names the alias as
the model's, through the official `openai` client; a model that is no alias goes as it is."""

from __future__ import annotations

import json

import openai
import pytest
from support.gateway import KEYS, FakeBackend, serve

pytestmark = pytest.mark.integration


def test_a_request_for_an_alias_is_served_as_the_model_it_names(tmp_path):
    fake, log = FakeBackend(), tmp_path / "usage.jsonl"
    options = {"models": ["llama-3-8b"]}
    with serve(fake, backend_options=options, aliases={"gpt-4o": "llama-3-8b"}, usage_log=str(log)) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key=KEYS["alice"], max_retries=0)
        done = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert done.choices[0].message.content
        stream = client.completions.create(model="gpt-4o", prompt="hello", max_tokens=2, stream=True)
        assert "".join(c.choices[0].text for c in stream if c.choices)
        # the control: a model that is no alias goes as it is (one pool: its backend answers for it)
        client.completions.create(model="gpt-5", prompt="hello", max_tokens=2)
    assert [b["model"] for b in fake.bodies] == ["llama-3-8b", "llama-3-8b", "gpt-5"]  # what the backend saw
    served = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["model"] for r in served if r["outcome"] == "ok"] == ["llama-3-8b", "llama-3-8b", "gpt-5"]


def test_an_alias_of_an_alias_is_one_clear_error():
    from fairserve.gateway.settings.config import build_config

    with pytest.raises(ValueError, match="'a' names 'b', which is an alias itself"):
        build_config({"backends": [{"url": "http://x:1"}], "aliases": {"a": "b", "b": "m"}})

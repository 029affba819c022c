"""The emulator's prefix cache through HTTP with the official `openai` client: a second chat request with the same
system prompt finds its blocks, and /metrics says so with vLLM's counters."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fairserve.api.server import running_server
from fairserve.emulate import EmulatorConfig, create_app

pytestmark = pytest.mark.integration


def counters(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_shared_system_prompt_is_found_in_the_cache_and_counted():
    system = "You are a careful assistant. " * 80  # 2,320 characters: 36 blocks of 16 tokens
    config = EmulatorConfig(time_scale=50, engine_mode="paged", prefix_cache=True, kv_tokens=8_000)
    app = create_app(config)
    with running_server(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        for question in ("What is a block?", "And a prefix?"):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
            client.chat.completions.create(model="m", messages=messages, max_tokens=4)
        c = counters(url)
        em = app.state.emulator
    assert c["vllm:prefix_cache_queries_total"] == em.prompt_tokens_total > 1_000
    # the second request found the system prompt's whole blocks: 36 of them
    assert c["vllm:prefix_cache_hits_total"] == 36 * 16

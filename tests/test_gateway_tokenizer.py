"""A configured Hugging Face tokenizer (local tokenizer.json) counts the tokens the gateway charges."""
from __future__ import annotations

import pytest
from test_gateway_support import HTTP, FakeBackend, admin_tenants, auth, serve

from fairserve.api.tokens import estimate_tokens, token_counter
from fairserve.gateway import build_config

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture
def word_tokenizer(tmp_path):
    """A word-level tokenizer: one token per whitespace-separated word (so it differs from the 4-chars rule)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "tok": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_token_counter(word_tokenizer):
    count = token_counter(f"hf:{word_tokenizer}")
    assert count("hello there general kenobi") == 4 != estimate_tokens("hello there general kenobi")
    assert count("") == 0
    assert token_counter("") is estimate_tokens is token_counter("estimate")
    for bad, msg in [("hf:/no/such.json", "not found"), ("tiktoken:x", "unknown tokenizer")]:
        with pytest.raises(ValueError, match=msg):
            token_counter(bad)


def test_gateway_charges_the_tokenizers_count(word_tokenizer):
    backend = FakeBackend()
    backend.report_usage = False            # nothing to correct the count with: the tokenizer's count stands
    prompt = "alpha beta gamma delta epsilon zeta"          # 6 words, 36 characters (9 by the estimate)
    with serve(backend, tokenizer=f"hf:{word_tokenizer}") as base:
        body = {"model": "m", "prompt": prompt, "max_tokens": 3}
        assert HTTP.post(base + "/v1/completions", json=body, headers=auth("alice")).status_code == 200
        # prompt 6 tokens (w_p = 1) + 3 output pieces " tok", one word each (w_q = 2)
        assert admin_tenants(base)["alice"]["service"] == 6 + 2 * 3


def test_bad_tokenizer_is_a_config_error(tmp_path):
    base = {"backends": [{"url": "http://127.0.0.1:9"}], "tenants": [{"name": "a", "api_keys": ["k"]}]}
    with pytest.raises(ValueError, match="tokenizer"):
        build_config({**base, "tokenizer": f"hf:{tmp_path / 'missing.json'}"})

"""A configured tokenizer counts the tokens the gateway charges: a Hugging Face tokenizer (local tokenizer.json) or
a tiktoken encoding with a local `.tiktoken` ranks file. Nothing is downloaded (the tiktoken tests forbid it)."""

from __future__ import annotations

import base64
import hashlib
import socket

import pytest
from support.gateway import HTTP, FakeBackend, admin_tenants, auth, serve

from fairserve.api import tokens
from fairserve.api.tokens import estimate_tokens, token_counter
from fairserve.cli import main
from fairserve.gateway import build_config

pytestmark = pytest.mark.integration


@pytest.fixture
def word_tokenizer(tmp_path):
    """A word-level tokenizer: one token per whitespace-separated word (so it differs from the 4-chars rule)."""
    pytest.importorskip("tokenizers")
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
    for bad, msg in [("hf:/no/such.json", "not found"), ("spm:x", "unknown tokenizer")]:
        with pytest.raises(ValueError, match=msg):
            token_counter(bad)


def test_gateway_charges_the_tokenizers_count(word_tokenizer):
    backend = FakeBackend()
    backend.report_usage = False  # nothing to correct the count with: the tokenizer's count stands
    prompt = "alpha beta gamma delta epsilon zeta"  # 6 words, 36 characters (9 by the estimate)
    with serve(backend, tokenizer=f"hf:{word_tokenizer}") as base:
        body = {"model": "m", "prompt": prompt, "max_tokens": 3}
        assert HTTP.post(base + "/v1/completions", json=body, headers=auth("alice")).status_code == 200
        # prompt 6 tokens (w_p = 1) + 3 output pieces " tok", one word each (w_q = 2)
        assert admin_tenants(base)["alice"]["service"] == 6 + 2 * 3


def test_bad_tokenizer_is_a_config_error(tmp_path):
    base = {"backends": [{"url": "http://127.0.0.1:9"}], "tenants": [{"name": "a", "api_keys": ["k"]}]}
    with pytest.raises(ValueError, match="tokenizer"):
        build_config({**base, "tokenizer": f"hf:{tmp_path / 'missing.json'}"})


# --- tiktoken -------------------------------------------------------------------------------------------------------

MERGES = [b"he", b"ll", b"hell", b"hello", b" w", b"or", b" t", b"ok", b" tok"]  # ranks 256, 257, ...


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to reach beyond loopback, or to have tiktoken fetch or even look up a file, fails the test.
    Returns tiktoken; `tiktoken.real` holds the stubbed functions."""
    tiktoken = pytest.importorskip("tiktoken")
    import tiktoken_ext.openai_public

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    loopback = ("127.0.0.1", "::1", "localhost", None)
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, *a, **k: real_getaddrinfo(host, *a, **k) if host in loopback else refuse(host),
    )
    monkeypatch.setattr(
        socket.socket,
        "connect",
        lambda self, addr: (
            real_connect(self, addr) if not isinstance(addr, tuple) or addr[0] in loopback else refuse(addr)
        ),
    )
    tiktoken.real = {}
    for target in (tiktoken.load, tiktoken_ext.openai_public):
        for name in ("read_file", "read_file_cached", "load_tiktoken_bpe"):
            if hasattr(target, name):
                tiktoken.real.setdefault(name, getattr(target, name))
                monkeypatch.setattr(target, name, refuse)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # and no stray cache of the machine's
    return tiktoken


@pytest.fixture
def bpe_file(tmp_path, no_network):
    """A synthetic `.tiktoken` ranks file: the 256 single bytes, then a few merges."""
    ranks = [bytes([b]) for b in range(256)] + MERGES
    path = tmp_path / "tiny.tiktoken"
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for r, t in enumerate(ranks)))
    return path


def test_tiktoken_counts_exactly(bpe_file):
    count = token_counter(f"tiktoken:cl100k_base@{bpe_file}")
    assert count("hello") == 1  # h e l l o -> he ll o -> hell o -> hello
    assert count("hello world") == 5 != estimate_tokens("hello world")  # hello | " w" "or" "l" "d"
    assert count(" tok tok") == 2
    assert count("12345") == 5  # cl100k splits digits in threes: 123 | 45, no merges
    assert count("héllo") == 5  # h, the two bytes of é, ll, o
    assert count("<|endoftext|>") == len("<|endoftext|>")  # special-token text in a prompt is ordinary text
    assert count("") == 0
    # every encoding's split pattern works with the file's ranks
    for name in ("r50k_base", "p50k_base", "o200k_base"):
        assert token_counter(f"tiktoken:{name}@{bpe_file}")("hello") == 1


def test_tiktoken_matches_tiktokens_own_encoding(bpe_file, no_network):
    """The same file through tiktoken's own constructor (load_tiktoken_bpe stubbed to this file) counts the same."""
    import tiktoken_ext.openai_public as public

    ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in bpe_file.read_bytes().splitlines())}
    seen = {}
    for name, (pat, file, sha) in tokens.TIKTOKEN_ENCODINGS.items():

        def stub(url, expected_hash=None, name=name):
            seen[name] = (url, expected_hash)
            return dict(ranks)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(public, "load_tiktoken_bpe", stub)
            ctor = public.ENCODING_CONSTRUCTORS[name]()
        assert ctor["pat_str"] == pat, f"{name}: pattern differs from tiktoken's"
        assert seen[name] == (tokens.TIKTOKEN_BLOB + file, sha), f"{name}: file or hash differs from tiktoken's"
        theirs = no_network.Encoding(
            name, pat_str=ctor["pat_str"], mergeable_ranks=ctor["mergeable_ranks"], special_tokens={}
        )
        ours = token_counter(f"tiktoken:{name}@{bpe_file}")
        for text in ("hello world", "it's 2024, héllo\n\n  tok", "don't STOP"):
            assert ours(text) == len(theirs.encode_ordinary(text))


def test_tiktoken_from_its_cache(bpe_file, tmp_path, monkeypatch, no_network):
    """ "tiktoken:NAME" reads the file where tiktoken caches it (checked against tiktoken's own cache lookup)."""
    data = bpe_file.read_bytes()
    pat, file, _ = tokens.TIKTOKEN_ENCODINGS["cl100k_base"]
    monkeypatch.setitem(tokens.TIKTOKEN_ENCODINGS, "cl100k_base", (pat, file, hashlib.sha256(data).hexdigest()))
    for var, other in (("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"), ("DATA_GYM_CACHE_DIR", "TIKTOKEN_CACHE_DIR")):
        cache = tmp_path / var
        monkeypatch.delenv(other, raising=False)
        monkeypatch.setenv(var, str(cache))
        with pytest.raises(ValueError, match="not in tiktoken's cache.*never downloads.*@PATH"):
            token_counter("tiktoken:cl100k_base")
        cache.mkdir()
        tokens.tiktoken_cached_file("cl100k_base").write_bytes(data)
        assert token_counter("tiktoken:cl100k_base")("hello world") == 5
        # tiktoken's own cache lookup finds the same file (its read_file, the download, still refuses)
        assert no_network.real["read_file_cached"](tokens.TIKTOKEN_BLOB + file) == data
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", "")
    with pytest.raises(ValueError, match="cache is off"):
        token_counter("tiktoken:cl100k_base")


def test_gateway_charges_the_tiktoken_count(bpe_file):
    backend = FakeBackend()
    backend.report_usage = False  # nothing to correct the count with: the tokenizer's count stands
    prompt = "hello world hello world"  # hello | " w" or l d | " " hello | " w" or l d: 11 (6 by the estimate)
    with serve(backend, tokenizer=f"tiktoken:cl100k_base@{bpe_file}") as base:
        body = {"model": "m", "prompt": prompt, "max_tokens": 3}
        assert HTTP.post(base + "/v1/completions", json=body, headers=auth("alice")).status_code == 200
        # prompt 11 tokens (w_p = 1) + 3 output pieces " tok", one token each (w_q = 2)
        assert admin_tenants(base)["alice"]["service"] == 11 + 2 * 3


def bad_specs(tmp_path, bpe_file):
    not_bpe = tmp_path / "tokenizer.json"
    not_bpe.write_text('{"model": {"type": "BPE"}}\n')
    few = tmp_path / "few.tiktoken"
    few.write_bytes(b"".join(base64.b64encode(bytes([b])) + b" %d\n" % b for b in range(200)))
    dup = tmp_path / "dup.tiktoken"
    dup.write_bytes(bpe_file.read_bytes() + base64.b64encode(b"xyz") + b" 3\n")
    return [
        ("tiktoken:cl200k_base", "unknown tiktoken encoding 'cl200k_base': one of r50k_base"),
        (f"tiktoken:gpt2@{bpe_file}", "unknown tiktoken encoding 'gpt2'"),
        (f"tiktoken:cl100k_base@{tmp_path / 'missing.tiktoken'}", "tiktoken file not found"),
        (f"tiktoken:cl100k_base@{tmp_path}", "tiktoken file not found"),
        (f"tiktoken:cl100k_base@{not_bpe}", "tokenizer.json:1: not a tiktoken ranks file"),
        (f"tiktoken:cl100k_base@{few}", "56 of the 256 single bytes have no rank"),
        (f"tiktoken:cl100k_base@{dup}", "two tokens share a rank"),
        ("tiktoken:cl100k_base", 'tiktoken\'s cache is off.*never downloads it: use "tiktoken:ENCODING@PATH"'),
    ]


def test_bad_tiktoken_specs(tmp_path, bpe_file):
    for spec, msg in bad_specs(tmp_path, bpe_file):
        with pytest.raises(ValueError, match=msg):
            token_counter(spec)


def test_bad_tiktoken_spec_one_error_line_exit_2(tmp_path, bpe_file, capsys):
    for spec, _msg in bad_specs(tmp_path, bpe_file):
        assert main(["gateway", "--tenant", "a:k", "--backend", "http://127.0.0.1:9", "--tokenizer", spec]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("fairserve: error:") and "tiktoken" in err[0], (spec, err)


def test_another_encodings_published_file_is_refused(bpe_file, monkeypatch):
    pat, file, _ = tokens.TIKTOKEN_ENCODINGS["o200k_base"]
    monkeypatch.setitem(
        tokens.TIKTOKEN_ENCODINGS, "o200k_base", (pat, file, hashlib.sha256(bpe_file.read_bytes()).hexdigest())
    )  # as if it were o200k's
    with pytest.raises(ValueError, match="is tiktoken's o200k_base.tiktoken file, not cl100k_base's"):
        token_counter(f"tiktoken:cl100k_base@{bpe_file}")
    assert token_counter(f"tiktoken:o200k_base@{bpe_file}")("hello") == 1


def test_corrupt_cached_file_is_refused(bpe_file, tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    tokens.tiktoken_cached_file("o200k_base").write_bytes(bpe_file.read_bytes())  # not the published file
    with pytest.raises(ValueError, match="cached o200k_base file .* is corrupt"):
        token_counter("tiktoken:o200k_base")

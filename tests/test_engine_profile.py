"""Profile files of measured engines (`sim/engine_profile.py`): the schema, the fit recovering a known model, and
`--profile PATH` wherever a preset is taken."""

from __future__ import annotations

import json

import pytest

from fairserve.sim.engine_profile import EngineProfile, load_engine_profile
from fairserve.sim.latency import LinearLatency, default_kv_tokens, get_latency_model
from fairserve.sim.profile_fit import ProfileRow

pytestmark = pytest.mark.unit

TRUE = LinearLatency(
    "true",
    prefill_fixed_s=0.004,
    prefill_per_token_s=2e-5,
    decode_fixed_s=0.003,
    decode_per_seq_s=1e-4,
    decode_per_context_token_s=3e-7,
)
GRID = [(p, o, b) for p in (32, 128, 512) for o in (8, 32) for b in (1, 4, 16)]


def rows_of(model: LinearLatency) -> tuple[ProfileRow, ...]:
    """The rows an engine running exactly `model` would give (decode at the average context, as the fit reads it)."""
    out = []
    for p, o, b in GRID:
        row = ProfileRow(p, o, b, 0.0, 0.0)
        out.append(ProfileRow(p, o, b, model.prefill_s([p] * b), model.decode_step_s(b, row.context_tokens)))  # type: ignore[arg-type]
    return tuple(out)


def profile(**kw) -> EngineProfile:
    return EngineProfile(kv_tokens=kw.pop("kv_tokens", 4096), rows=rows_of(TRUE), **kw)


def test_the_fit_recovers_the_model_that_made_the_rows():
    fit = profile().latency()
    for name in ("prefill_fixed_s", "prefill_per_token_s", "decode_fixed_s", "decode_per_seq_s"):
        assert getattr(fit, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    assert fit.decode_per_context_token_s == pytest.approx(TRUE.decode_per_context_token_s, rel=1e-6)
    assert max(abs(e["prefill_err"]) + abs(e["decode_err"]) for e in profile().errors()) < 1e-9


def test_a_written_profile_reads_back_and_serves_as_a_preset(tmp_path):
    path = tmp_path / "cpu.json"
    profile(engine={"kind": "vllm", "model": "tiny"}, block_tokens=16, max_num_seqs=8).write(path)
    data = json.loads(path.read_text())
    assert data["fairserve_profile"] == 1 and data["kv_tokens"] == 4096 and len(data["rows"]) == len(GRID)
    assert data["latency"]["decode_per_seq_s"] == pytest.approx(1e-4, rel=1e-6)
    back = load_engine_profile(path)
    assert back.rows == rows_of(TRUE) and back.engine["kind"] == "vllm" and back.max_num_seqs == 8
    model = get_latency_model(str(path))
    assert model.name == "cpu" and model.decode_step_s(4, 1000) == pytest.approx(TRUE.decode_step_s(4, 1000))
    assert default_kv_tokens(str(path)) == 4096


def test_an_edited_file_is_read_again(tmp_path):
    path = tmp_path / "p.json"
    profile().write(path)
    assert default_kv_tokens(str(path)) == 4096
    data = json.loads(path.read_text())
    data["kv_tokens"] = 9999
    path.write_text(json.dumps(data, indent=2))  # NOTE: another size, so the change is seen within one mtime tick
    assert default_kv_tokens(str(path)) == 9999


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("fairserve_profile"), "not a fairserve profile"),
        (lambda d: d.update(kv_tokens=0), "kv_tokens"),
        (lambda d: d.update(rows=d["rows"][:2]), "at least 3 rows"),
        (lambda d: d["rows"][1].pop("prefill_s"), r"rows\[1\]"),
        (lambda d: d["rows"][0].update(decode_step_s=-1), "seconds > 0"),
        (lambda d: [r.update(output_len=1) for r in d["rows"]], "decode steps"),
    ],
)
def test_a_bad_profile_is_one_clear_error(tmp_path, edit, message):
    path = tmp_path / "bad.json"
    profile().write(path)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message) as e:
        get_latency_model(str(path))
    assert "bad.json" in str(e.value)


def test_a_missing_file_says_so():
    with pytest.raises(ValueError, match="No such file"):
        get_latency_model("/nonexistent/engine.json")

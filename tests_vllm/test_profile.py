"""`fairserve profile --engine vllm` on vLLM's CPU build (the tier's tiny model), a short grid: the file it writes
reads back as a `--profile`, its rows are the engine's own (its pool, batch cap and prefill budget), and the
simulator runs from it with the engine's limits."""

from __future__ import annotations

import json

from fairserve.cli import main
from fairserve.sim import engine_config, get_latency_model


def test_a_short_profile_of_vllm_serves_as_the_simulators_preset(model_dir, tmp_path, capsys):
    out = tmp_path / "vllm-cpu.json"
    rc = main(
        ["profile", "--engine", "vllm", "--model", str(model_dir), "--max-num-seqs", "4", "--prompts", "32,256",
         "--batches", "1,4", "--output", "8", "--repeats", "1", "--engine-arg", "max_model_len=512",
         "--engine-arg", 'dtype="float32"', "--engine-arg", "enforce_eager=true", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0, capsys.readouterr().err[-2000:]
    data = json.loads(out.read_text())
    assert data["engine"]["kind"] == "vllm" and data["engine"]["version"].startswith("0.")
    assert data["max_num_seqs"] == 4 and data["kv_tokens"] % data["block_tokens"] == 0
    assert [(r["prompt_len"], r["batch_size"]) for r in data["rows"]] == [(32, 1), (32, 4), (256, 1), (256, 4)]
    model = get_latency_model(str(out))
    # more tokens take longer to prefill; a decode step costs something
    assert model.prefill_s([256] * 4) > model.prefill_s([32]) > 0 and model.decode_step_s(1, 40) > 0
    cfg = engine_config(str(out), mode="paged")
    assert (cfg.kv_tokens, cfg.running_max, cfg.batch_max_tokens) == (
        data["kv_tokens"],
        4,
        data["max_batched_tokens"],
    )
    assert "| 256 | 4 |" in capsys.readouterr().out  # the fit's table, a row per measured shape

"""bench.generation end to end on a micro random checkpoint: batched greedy equals one at a time, and the
transformers-generate baseline (--hf-generate) is timed on the same prompts and reported as a ratio."""

import json

import pytest

from bench import generation


def test_bench_reports_batches_and_the_hf_generate_baseline(tmp_path):
    out = tmp_path / "gen.json"
    status = generation.main(["--build-random", str(tmp_path / "micro"), "--micro", "--batch", "1,4",
                              "--prompts", "4", "--max-new-tokens", "8", "--hf-generate", "--json", str(out)])
    report = json.loads(out.read_text())
    assert status == 0 and [r["batch"] for r in report["rows"]] == [1, 4]
    for row in report["rows"]:
        assert row["identical_to_alone"] == row["turns"] == 4
        assert row["hf_generate_tokens_per_s"] > 0
        assert row["vs_hf_generate"] == round(row["tokens_per_s"] / row["hf_generate_tokens_per_s"], 2)


def test_hf_generate_needs_the_transformers_backend(capsys):
    with pytest.raises(SystemExit) as exit_info:
        generation.main(["--checkpoint", "x", "--backend", "vllm", "--hf-generate"])
    assert exit_info.value.code == 2 and "--hf-generate" in capsys.readouterr().err

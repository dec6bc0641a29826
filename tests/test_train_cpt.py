"""Stage 1 (train_cpt.py): packing without cross-document leakage, a few steps that lower the held-out
loss, resume after a crash, and clear failures on bad input. Micro model (vocab 512, 2 layers of 32)."""

import json
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch
from datasets import Dataset, DatasetDict

import train_cpt
from nanocomposer.model import build_base
from nanocomposer.model_io import load_model, load_tokenizer
from nanocomposer.packing import document_separator_id, pack_documents
from tests.conftest import assert_merged_lora_checkpoint

pytestmark = pytest.mark.slow  # heavy: `make test-fast` leaves it out (tests/README.md)

STDLIB = Path(sysconfig.get_paths()["stdlib"])
STDLIB_FILES = ["abc.py", "bisect.py", "colorsys.py", "copy.py", "fnmatch.py", "glob.py", "heapq.py",
                "keyword.py", "opcode.py", "shlex.py", "string.py", "textwrap.py", "this.py", "token.py"]


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    """A micro base model and a small corpus (train: 11 stdlib files, validation: 3)."""
    root = tmp_path_factory.mktemp("micro_cpt")
    src = root / "src"
    src.mkdir()
    texts = []
    for name in STDLIB_FILES:
        shutil.copy(STDLIB / name, src / name)
        texts.append((STDLIB / name).read_text(encoding="utf-8"))
    DatasetDict({"train": Dataset.from_dict({"text": texts[:11]}),
                 "validation": Dataset.from_dict({"text": texts[11:]})}).save_to_disk(str(root / "corpus"))
    (root / "corpus" / "manifest.json").write_text('{"builder": "test", "documents": 14}')
    build_base(root / "base", src, vocab_size=512, hidden=32, layers=2, heads=2, context=256)
    return root


def cpt_args(micro: Path, runs_dir: Path, *extra: str):
    return train_cpt.make_parser().parse_args_and_config([
        "--model_name_or_path", str(micro / "base"), "--dataset_path", str(micro / "corpus"),
        "--runs_dir", str(runs_dir), "--run", "t", "--block_size", "64", "--max_eval_blocks", "8",
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "8", "--max_steps", "6",
        "--learning_rate", "1e-2", "--lr_scheduler_type", "constant", "--seed", "0",
        "--eval_strategy", "steps", "--eval_steps", "100", "--eval_on_start", "true",
        "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
        "--dataloader_pin_memory", "false", *extra,
    ])


def test_packing_fills_blocks_and_restarts_positions(micro):
    tokenizer = load_tokenizer(str(micro / "base"))
    sep = document_separator_id(tokenizer, None)
    texts = ["def f():\n    return 1\n", "x = [i for i in range(10)]\n" * 5, "import os\n"]
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) + 1 for t in texts]
    block_size = 16
    blocks, stats = pack_documents(Dataset.from_dict({"text": texts}), tokenizer, block_size, sep)
    assert stats["tokens"] == sum(lengths)
    assert stats["blocks"] == sum(lengths) // block_size and stats["tokens_kept"] == stats["blocks"] * block_size
    starts = set()  # stream offsets where a document starts
    offset = 0
    for n in lengths:
        starts.add(offset)
        offset += n
    for b, row in enumerate(blocks):
        assert len(row["input_ids"]) == len(row["position_ids"]) == len(row["labels"]) == block_size
        for i, (pos, label, tok) in enumerate(zip(row["position_ids"], row["labels"], row["input_ids"])):
            stream = b * block_size + i
            segment_start = i == 0 or stream in starts
            assert (pos == 0) == segment_start
            assert label == (-100 if segment_start else tok)
            if not segment_start:
                assert pos == row["position_ids"][i - 1] + 1


def test_packed_document_logits_equal_unpacked(micro):
    """Block-causal attention: a document's logits do not depend on the document packed before it."""
    tokenizer = load_tokenizer(str(micro / "base"))
    sep = document_separator_id(tokenizer, None)
    first, second = "class A:\n    pass\n", "def g(x):\n    return x * 2\n"
    n_first = len(tokenizer(first, add_special_tokens=False)["input_ids"]) + 1
    n_second = len(tokenizer(second, add_special_tokens=False)["input_ids"]) + 1
    blocks, _ = pack_documents(Dataset.from_dict({"text": [first, second]}), tokenizer, n_first + n_second, sep)
    assert len(blocks) == 1
    packed = blocks.with_format("torch")[0]
    model_args = train_cpt.make_parser().parse_args_and_config(["--model_name_or_path", str(micro / "base")])[2]
    model = load_model(model_args, None)
    model.eval()
    with torch.no_grad():
        packed_logits = model(input_ids=packed["input_ids"][None], position_ids=packed["position_ids"][None]).logits
        alone = model(input_ids=packed["input_ids"][None, n_first:]).logits
        leaky = model(input_ids=packed["input_ids"][None]).logits  # plain causal: the second doc sees the first
    torch.testing.assert_close(packed_logits[:, n_first:], alone, atol=1e-5, rtol=1e-5)
    assert (leaky[:, n_first:] - alone).abs().max() > 1e-3  # the check above is not vacuous


def test_few_steps_lower_eval_loss_and_write_outputs(micro, tmp_path):
    metrics = train_cpt.main(*cpt_args(micro, tmp_path))
    assert metrics["global_step"] == 6
    assert metrics["final_eval_loss"] < metrics["initial_eval_loss"] - 0.1
    out = tmp_path / "t" / "cpt"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "config.yaml", "README.md"):
        assert (out / name).is_file(), name
    config = (out / "config.yaml").read_text()
    assert "git_commit:" in config and "block_size: 64" in config
    assert "final_eval_loss" in (out / "README.md").read_text()
    assert json.loads((out / "train_results.json").read_text())["global_step"] == 6
    evals = [log for log in json.loads((out / "trainer_state.json").read_text())["log_history"] if "eval_loss" in log]
    assert [log["step"] for log in evals] == [0, 6]  # eval_on_start, then the final one


def test_size_sweep_tables_real_runs_and_says_which_it_skipped(micro, tmp_path, capsys):
    from bench import size_sweep

    train_cpt.main(*cpt_args(micro, tmp_path, "--eval_steps", "3", "--copy_eval_probes", "4"))
    out = tmp_path / "t" / "cpt"
    run = size_sweep.read_run(out)
    assert all({"eval_loss", "eval_copy_accuracy", "eval_repeat_copy_accuracy"} <= set(e) for e in run["evals"].values())
    total, body = run["params"], run["non_embedding"]
    assert (run["layers"], run["width"], run["heads"], run["vocab"], run["steps"]) == (2, 32, 2, 512, 6)
    assert total - body == 512 * 32 and set(run["evals"]) == {0, 3, 6} and run["s_per_step"] > 0
    (tmp_path / "crashed").mkdir()
    other = shutil.copytree(out, tmp_path / "other")  # a run whose results lack the training time
    (other / "train_results.json").write_text('{"global_step": 6}')
    size_sweep.main([str(out), str(tmp_path / "crashed"), str(other), "--out", str(tmp_path / "sweep.md")])
    text = (tmp_path / "sweep.md").read_text()
    assert f"| 2 x 32 (2), 512 | {total / 1e6:.1f} M ({body / 1e6:.1f} M) |" in text
    assert "| step 0 | step 3 | step 6 |" in text
    copy = run["evals"][6]["eval_copy_accuracy"]
    assert f"| {100 * copy:.1f}% ({run['evals'][6]['eval_loss']:.2f}) |" in text
    assert "Skipped: " in text and "crashed/config.json: missing" in text and "lacks 'train_seconds'" in text
    with pytest.raises(SystemExit):
        size_sweep.main([str(tmp_path / "crashed")])
    assert "no run could be read" in capsys.readouterr().err


@pytest.mark.parametrize("warmup", [(), ("--copy_warmup_steps", "3")], ids=["code", "copy_warmup"])
def test_resume_after_crash_reaches_same_step_and_loss(micro, tmp_path, monkeypatch, warmup):
    saving = ("--save_strategy", "steps", "--save_steps", "2", *warmup)
    reference = train_cpt.main(*cpt_args(micro, tmp_path / "reference", *saving))

    original_step = train_cpt.PackedCausalLMTrainer.training_step
    calls = {"n": 0}

    def crash_on_fifth_step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:  # after checkpoint-4 was written
            raise KeyboardInterrupt("simulated kill")
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(train_cpt.PackedCausalLMTrainer, "training_step", crash_on_fifth_step)
    with pytest.raises(KeyboardInterrupt):
        train_cpt.main(*cpt_args(micro, tmp_path / "crashed", *saving))
    monkeypatch.setattr(train_cpt.PackedCausalLMTrainer, "training_step", original_step)
    assert (tmp_path / "crashed" / "t" / "cpt" / "checkpoint-4").is_dir()

    with pytest.raises(SystemExit, match="--resume"):  # no silent restart over a crashed run
        train_cpt.main(*cpt_args(micro, tmp_path / "crashed", *saving))
    resumed = train_cpt.main(*cpt_args(micro, tmp_path / "crashed", *saving, "--resume", "true"))
    assert resumed["global_step"] == reference["global_step"] == 6
    assert resumed["initial_eval_loss"] == pytest.approx(reference["initial_eval_loss"])
    assert resumed["final_eval_loss"] == pytest.approx(reference["final_eval_loss"], abs=1e-3)


def test_wandb_is_offline_by_default_and_gets_the_manifest(micro, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))  # nothing outside tmp_path
    train_cpt.main(*cpt_args(micro, tmp_path, "--report_to", "wandb", "--max_steps", "2"))
    out = tmp_path / "t" / "cpt"
    run_id = (out / "wandb_run_id.txt").read_text()
    offline_runs = list((out / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(offline_runs) == 1 and (offline_runs[0] / f"run-{run_id}.wandb").is_file()
    assert (out / "data_manifest.json").read_text() == (micro / "corpus" / "manifest.json").read_text()


def test_unknown_recipe_key_names_key_and_file(tmp_path, capsys):
    recipe = tmp_path / "cpt.yaml"
    recipe.write_text("learning_rate: 1.0e-3\nlerning_rate: 2.0e-3\n")
    with pytest.raises(SystemExit) as exit_info:
        train_cpt.make_parser().parse_args_and_config(["--config", str(recipe)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert str(recipe) in err and "'lerning_rate'" in err and "did you mean 'learning_rate'" in err


def test_cli_overrides_recipe(tmp_path):
    recipe = tmp_path / "cpt.yaml"
    recipe.write_text("learning_rate: 1.0e-3\nblock_size: 128\n")
    script_args, training_args, _ = train_cpt.make_parser().parse_args_and_config(
        ["--config", str(recipe), "--block_size", "32"])
    assert script_args.block_size == 32 and training_args.learning_rate == 1e-3


@pytest.mark.parametrize("bad", ["missing", "not_a_model"])
def test_bad_model_path_fails_before_training(micro, tmp_path, bad):
    path = tmp_path / bad
    if bad == "not_a_model":
        path.mkdir()
        (path / "weights.txt").write_text("no config.json here")
    with pytest.raises(SystemExit, match=f"model_name_or_path {path}"):
        train_cpt.main(*cpt_args(micro, tmp_path, "--model_name_or_path", str(path)))


def test_missing_dataset_fails_clearly(micro, tmp_path):
    with pytest.raises(SystemExit, match="no dataset_dict.json"):
        train_cpt.main(*cpt_args(micro, tmp_path, "--dataset_path", str(tmp_path / "nowhere")))


def test_lora_cpt_trains_and_saves_a_merged_checkpoint(micro, tmp_path):
    metrics = train_cpt.main(*cpt_args(micro, tmp_path, "--use_peft", "true", "--lora_r", "8", "--lora_alpha", "16",
                                       "--lora_target_modules", "q_proj", "v_proj", "--learning_rate", "2e-2"))
    assert metrics["final_eval_loss"] < metrics["initial_eval_loss"]
    assert_merged_lora_checkpoint(tmp_path / "t" / "cpt", micro / "base")


def test_copy_warmup_rows_come_first_then_every_code_block(micro, tmp_path, monkeypatch):
    """copy_warmup_steps: that many steps of repeated random runs lead the (seed-shuffled) code blocks."""
    seen = []
    original = train_cpt.PackedCausalLMTrainer.compute_loss

    def recording(self, model, inputs, *args, **kwargs):
        if model.training:  # not the evaluation batches
            seen.append(inputs["input_ids"].tolist())
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(train_cpt.PackedCausalLMTrainer, "compute_loss", recording)
    metrics = train_cpt.main(*cpt_args(micro, tmp_path, "--copy_warmup_steps", "2", "--max_steps", "4",
                                       "--eval_on_start", "false"))
    assert metrics["global_step"] == 4 and len(seen) == 4
    for batch in seen[:2]:  # warm-up rows: each run is followed by itself
        for row in batch:
            run = row[:row.index(0)] if 0 in row else []
            assert len(run) >= 8 and run[:len(run) // 2] == run[len(run) // 2:]
    tokenizer = load_tokenizer(str(micro / "base"))
    corpus = "".join((STDLIB / name).read_text(encoding="utf-8") for name in STDLIB_FILES[:11])
    for row in seen[2] + seen[3]:  # then code: every block is a slice of the train documents
        assert all(piece in corpus for piece in tokenizer.decode(row).split("<|endoftext|>"))
    assert "copy_warmup_blocks: 8" in (tmp_path / "t" / "cpt" / "config.yaml").read_text()


def test_copy_warmup_needs_a_vocabulary_above_the_reserved_ids():
    from nanocomposer.copy_warmup import copy_warmup_blocks

    with pytest.raises(ValueError, match="leaves none above id 100"):
        copy_warmup_blocks(2, 16, 90, 0)
    rows = copy_warmup_blocks(3, 40, 300, 0)
    assert len(rows) == 3 and rows[0]["labels"][0] == -100 and rows[0]["position_ids"] == list(range(40))


def test_copy_replay_spreads_repeated_runs_through_the_code_after_the_warmup():
    from types import SimpleNamespace

    block = 24
    code = Dataset.from_dict({"input_ids": [[7] * block for _ in range(30)],
                              "position_ids": [list(range(block))] * 30, "labels": [[-100] + [7] * (block - 1)] * 30})
    script_args = SimpleNamespace(copy_warmup_steps=2, copy_replay_fraction=0.25, block_size=block)
    training_args = SimpleNamespace(per_device_train_batch_size=2, gradient_accumulation_steps=1, world_size=1, seed=0,
                                    train_sampling_strategy="random")
    rows, stats = train_cpt.arrange_copy_rows(code, script_args, training_args, vocab_size=300)
    assert stats == {"copy_warmup_blocks": 4, "copy_replay_blocks": 10}  # 10 of the 40 rows after the warm-up
    assert training_args.train_sampling_strategy == "sequential" and len(rows) == 44
    is_copy = [row[0] != 7 for row in rows["input_ids"]]
    assert is_copy[:4] == [True] * 4 and sum(is_copy[4:]) == 10
    # spread, not a block at either end
    replay_positions = [i for i, copy in enumerate(is_copy[4:]) if copy]
    assert replay_positions[0] < 20 and replay_positions[-1] >= 20
    # the warm-up is the same rows with or without replay (a run with replay 0 is the earlier recipe)
    plain, _ = train_cpt.arrange_copy_rows(code, SimpleNamespace(copy_warmup_steps=2, copy_replay_fraction=0.0,
                                                                  block_size=block), training_args, vocab_size=300)
    assert plain["input_ids"][:4] == rows["input_ids"][:4] and len(plain) == 34


@pytest.mark.parametrize("bad", ["1.0", "-0.1"])
def test_copy_replay_fraction_out_of_range_is_refused(bad):
    from nanocomposer.config import ArgumentError

    with pytest.raises(ArgumentError, match="copy_replay_fraction"):
        train_cpt.CPTArguments(copy_replay_fraction=float(bad))


def test_document_separator_may_be_the_unknown_token(micro):
    """SmolLM2's <|endoftext|> is also its unk token (id 0): it is still a real separator; a missing one fails."""
    from nanocomposer.config import ConfigError

    tokenizer = load_tokenizer(str(micro / "base"))
    endoftext = tokenizer.get_vocab()["<|endoftext|>"]
    tokenizer.unk_token = "<|endoftext|>"
    assert tokenizer.unk_token_id == endoftext and document_separator_id(tokenizer, None) == endoftext
    with pytest.raises(ConfigError, match="not a token"):
        document_separator_id(tokenizer, "<|no_such_token|>")

"""Stage 2 (train_sft.py): assistant-only labels, truncation reported, a few steps that lower the loss,
the post-training harness check, and clear failures. Micro model (vocab 512, 2 layers of 32)."""

import json
import re
import shutil
import sysconfig
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict
from trl import SFTTrainer

import train_sft
from nanocomposer.model import build_base
from nanocomposer.model_io import load_model, load_tokenizer
from tests.conftest import assert_merged_lora_checkpoint

pytestmark = pytest.mark.slow  # heavy: `make test-fast` leaves it out (tests/README.md)

STDLIB = Path(sysconfig.get_paths()["stdlib"])
TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "submit", "description": "Finish.", "parameters": {
        "type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}}},
]


def call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def trajectory(i: int) -> dict:
    """One row as data/build_sft.py writes it: parallel calls, prose + call, tool results, submit."""
    return {
        "messages": [
            {"role": "system", "content": "You are a coding agent. Call submit when done."},
            {"role": "user", "content": f"Fix bug #{i} in calc/ops.py."},
            {"role": "assistant", "content": "", "tool_calls": [call("read_file", path="calc/ops.py"),
                                                                 call("read_file", path=f"tests/test_{i}.py")]},
            {"role": "tool", "name": "read_file", "content": f"def add(a, b):\n    return a - b  # {i}\n"},
            {"role": "tool", "name": "read_file", "content": "def test_add():\n    assert add(2, 3) == 5\n"},
            {"role": "assistant", "content": "add subtracts.", "tool_calls": [call("submit", summary=f"fixed {i}")]},
            {"role": "tool", "name": "submit", "content": "Submitted."},
        ],
        "tools": json.dumps(TOOLS),
        "task_id": f"task-{i}", "family": "fix_bug", "tier": "micro",
    }


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    """A micro base model (tokenizer trained on a few stdlib files) and a small SFT DatasetDict."""
    root = tmp_path_factory.mktemp("micro_sft")
    src = root / "src"
    src.mkdir()
    for name in ("abc.py", "bisect.py", "copy.py", "fnmatch.py", "heapq.py", "shlex.py", "textwrap.py"):
        shutil.copy(STDLIB / name, src / name)
    build_base(root / "base", src, vocab_size=512, hidden=32, layers=2, heads=2, context=1024)
    DatasetDict({"train": Dataset.from_list([trajectory(i) for i in range(6)]),
                 "validation": Dataset.from_list([trajectory(i) for i in range(6, 8)])}
                ).save_to_disk(str(root / "sft"))
    return root


def sft_args(micro: Path, runs_dir: Path, *extra: str):
    return train_sft.make_parser().parse_args_and_config([
        "--config", "recipes/tiny/sft.yaml",
        "--model_name_or_path", str(micro / "base"), "--dataset_path", str(micro / "sft"),
        "--runs_dir", str(runs_dir), "--run", "t", "--max_length", "1024", "--max_steps", "8",
        "--learning_rate", "1e-2", "--lr_scheduler_type", "constant", "--warmup_steps", "0",
        "--eval_steps", "100", "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
        "--disable_tqdm", "true", *extra,
    ])


def test_only_assistant_bodies_are_trained(micro, tmp_path):
    """Trained tokens are exactly the assistant bodies with their <|im_end|>: no system, user or tool token."""
    _, training_args, model_args = sft_args(micro, tmp_path)
    training_args.output_dir = str(tmp_path / "out")
    tokenizer = load_tokenizer(model_args.model_name_or_path)
    dataset = Dataset.from_list([trajectory(i) for i in range(4)]).select_columns(["messages", "tools"])
    trainer = SFTTrainer(model=load_model(model_args, training_args), args=training_args, train_dataset=dataset,
                         eval_dataset=dataset, processing_class=tokenizer)
    trained_runs = []
    for row in trainer.train_dataset:  # packed rows (bfd), as the recipe trains
        run = []
        for token, label in zip(row["input_ids"], row["labels"]):
            assert label in (-100, token)
            if label != -100:
                run.append(token)
            elif run:
                trained_runs.append(tokenizer.decode(run))
                run = []
        if run:
            trained_runs.append(tokenizer.decode(run))
    expected = []
    for row in dataset:
        text = tokenizer.apply_chat_template(row["messages"], tools=json.loads(row["tools"]), tokenize=False)
        expected += re.findall(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", text, flags=re.DOTALL)
    assert len(expected) == 2 * len(dataset)
    assert sorted(trained_runs) == sorted(expected)
    assert not any("<tool_response>" in run or "<|im_start|>" in run for run in trained_runs)


def test_truncation_is_reported(micro):
    tokenizer = load_tokenizer(str(micro / "base"))
    dataset = Dataset.from_list([trajectory(i) for i in range(3)])
    full = train_sft.truncation_report(dataset, tokenizer, None, "all")
    assert full["truncated"] == 0 and full["assistant_tokens_lost_fraction"] == 0
    longest = max(dataset, key=lambda row: len(row["messages"][1]["content"]))
    up_to_last_assistant = tokenizer.apply_chat_template(longest["messages"][:-1], tools=TOOLS, tokenize=True,
                                                         return_dict=True)["input_ids"]
    cut = len(up_to_last_assistant) - 3  # inside the last assistant turn of the longest row
    report = train_sft.truncation_report(dataset, tokenizer, cut, "cut")
    assert 1 <= report["truncated"] <= 3
    assert 0 < report["assistant_tokens_lost_fraction"] < 1 and report["no_assistant_tokens_left"] == 0


def test_max_length_that_leaves_nothing_to_train_fails(micro, tmp_path):
    with pytest.raises(SystemExit, match="before its first assistant token"):
        train_sft.main(*sft_args(micro, tmp_path, "--max_length", "16"))


def test_few_steps_lower_eval_loss_and_write_outputs(micro, tmp_path, capsys):
    metrics = train_sft.main(*sft_args(micro, tmp_path))
    assert metrics["global_step"] == 8
    assert metrics["final_eval_loss"] < metrics["initial_eval_loss"] - 0.1
    assert "0/6 conversations longer than max_length=1024" in capsys.readouterr().out
    out = tmp_path / "t" / "sft"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "config.yaml",
                 "README.md"):
        assert (out / name).is_file(), name


def test_check_fails_loudly_when_model_never_calls_a_tool(micro, tmp_path, calc_task):
    # An untrained micro model cannot emit a valid call; the stage must exit non-zero and say so.
    with pytest.raises(SystemExit, match="no valid tool call"):
        train_sft.main(*sft_args(micro, tmp_path, "--max_steps", "1", "--check_tasks", str(calc_task.root),
                                 "--check_max_turns", "2"))
    check = json.loads((tmp_path / "t" / "sft" / "check.json").read_text())
    assert check["summary"]["valid_calls"] == 0 and check["summary"]["tasks"] == 1


def test_bad_model_path_and_missing_split_fail_clearly(micro, tmp_path):
    with pytest.raises(SystemExit, match="no such directory"):
        train_sft.main(*sft_args(micro, tmp_path, "--model_name_or_path", str(tmp_path / "none")))
    with pytest.raises(SystemExit, match="no 'test' split"):
        train_sft.main(*sft_args(micro, tmp_path / "b", "--dataset_test_split", "test"))


def test_lora_sft_trains_and_saves_a_merged_checkpoint(micro, tmp_path):
    metrics = train_sft.main(*sft_args(micro, tmp_path, "--use_peft", "true", "--lora_r", "8", "--lora_alpha", "16",
                                       "--lora_target_modules", "q_proj", "v_proj", "--learning_rate", "2e-2"))
    assert metrics["final_eval_loss"] < metrics["initial_eval_loss"]
    assert_merged_lora_checkpoint(tmp_path / "t" / "sft", micro / "base")

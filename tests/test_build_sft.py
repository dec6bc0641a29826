"""Expert trajectories -> SFT rows: only solved episodes, canonical turns, bad examples kept apart."""

import json
from pathlib import Path

import datasets
import pytest
from conftest import make_calc_task

from data.build_sft import ExportError, bad_examples, build, sft_messages, sft_row
from data.oracle import OraclePolicy
from env.episode import run_episode
from env.protocol import parse_turn
from env.tools import CodeTools, tool_schemas


def test_sft_messages_structure_and_round_trip(calc_task):
    """Assistant turns are their harness text (no structured tool_calls a template would re-serialize)."""
    traj = run_episode(calc_task, OraclePolicy(seed=3))
    msgs = sft_messages(traj.to_record())
    assert [m["role"] for m in msgs[:2]] == ["system", "user"]
    raw = [m["content"] for m in traj.messages if m["role"] == "assistant"]
    assert all(set(m) == {"role", "content"} for m in msgs if m["role"] == "assistant")
    assert [m["content"] for m in msgs if m["role"] == "assistant"] == raw
    for m in msgs:
        if m["role"] == "tool":
            assert m["name"] and isinstance(m["content"], str)


def test_rows_that_render_to_malformed_calls_are_refused(calc_task):
    """check_rows_render: the project template's rendering of each assistant turn must parse in the harness;
    a row that would teach a malformed call is refused with the task id and the parser's error."""
    from data.build_sft import RenderError, check_rows_render, sft_row

    traj = run_episode(calc_task, OraclePolicy(seed=1))
    row = sft_row({**traj.to_record(), "seed": 1}, {})
    checked = check_rows_render([row], ["project"])
    assert checked == {"project": len(traj.turns)}
    bad = json.loads(json.dumps(row))
    turn = next(m for m in bad["messages"] if m["role"] == "assistant" and "<tool_call>" in m["content"])
    turn["content"] = '<tool_call>\n{"name": "read_file", "arguments": "{\\"path\\": \\"a.py\\"}"}\n</tool_call>'
    with pytest.raises(RenderError, match="must be a JSON object"):
        check_rows_render([bad], ["project"])


def test_non_canonical_turn_is_refused(calc_task):
    traj = run_episode(calc_task, OraclePolicy(seed=0))
    traj.messages[2]["content"] = traj.messages[2]["content"].replace("\n</tool_call>", "   \n</tool_call>")
    with pytest.raises(ExportError, match="not in canonical form"):
        sft_messages(traj.to_record())


def test_build_keeps_solved_episodes_and_writes_manifest(tmp_path):
    for split in ("train", "val"):
        make_calc_task(tmp_path / "tasks" / split, task_id=f"calc-{split}")
    manifest = build(tmp_path / "tasks", tmp_path / "sft", variants=2, seed=0, workers=1, limit=None)
    ds = datasets.load_from_disk(str(tmp_path / "sft" / "dataset"))
    assert set(ds) == {"train", "validation"} and len(ds["train"]) == 2 and len(ds["validation"]) == 2
    row = ds["train"][0]
    assert json.loads(row["tools"]) == tool_schemas(CodeTools) and row["family"] == "fix_bug"
    assert manifest["splits"]["train"]["kept"] == 2 and manifest["splits"]["train"]["distribution"]["solve_rate"] == 1
    assert json.loads((tmp_path / "sft" / "manifest.json").read_text())["seed"] == 0
    with pytest.raises(ValueError, match="not empty"):  # refuses to clobber an earlier output
        build(tmp_path / "tasks", tmp_path / "sft", variants=1, seed=0, workers=1, limit=None)


def test_bad_examples_are_really_malformed():
    schemas = {s["function"]["name"]: s["function"] for s in tool_schemas(CodeTools)}
    import random

    examples = bad_examples(random.Random(0))
    assert len(examples) >= 6
    for ex in examples:
        turn = parse_turn(ex["text"], schemas)
        assert turn.malformed_calls and ex["expected_error"] in turn.malformed_calls[0].error, ex


def test_sft_rows_render_exactly_what_the_harness_showed_the_model(calc_task):
    """The chat template on structured SFT messages == the template on the raw harness turns."""
    from nanocomposer.model import apply_chat_template_to, build_tokenizer

    files = sorted((Path(__file__).resolve().parents[1] / "env").glob("*.py"))
    tok = apply_chat_template_to(build_tokenizer((f.read_text() for f in files), vocab_size=600))
    traj = run_episode(calc_task, OraclePolicy(seed=2))
    harness_view = [{k: m[k] for k in ("role", "content") if k in m} for m in traj.messages]
    as_trained = tok.apply_chat_template(sft_messages(traj.to_record()), tools=traj.tools, tokenize=False)
    as_seen = tok.apply_chat_template(harness_view, tools=traj.tools, tokenize=False)
    assert as_trained == as_seen


def test_load_tokenizer_reads_a_project_checkpoint_as_if_its_model_type_were_registered(calc_task, tmp_path):
    """data/ may not import nanocomposer (tests/test_layers.py), so --tokenizer / --verify-template on a smeared-key
    checkpoint load its tokenizer unregistered: same class, chat template and token ids as AutoTokenizer with the
    type registered, no transformers warning, and nanocomposer never imported."""
    import subprocess
    import sys

    from conftest import save_micro_checkpoint
    from transformers import AutoTokenizer

    import nanocomposer.smeared_llama  # noqa: F401  (the registered reference)

    ckpt = save_micro_checkpoint(tmp_path / "ckpt")
    row = sft_row({**run_episode(calc_task, OraclePolicy(seed=1)).to_record(), "seed": 1}, {})
    (tmp_path / "row.json").write_text(json.dumps(row))
    code = ("import json, sys; from data.build_sft import load_tokenizer; row = json.load(open(sys.argv[2])); "
            "tok = load_tokenizer(sys.argv[1]); print(json.dumps([type(tok).__name__, tok.chat_template, "
            "tok.apply_chat_template(row['messages'], tools=json.loads(row['tools']), tokenize=True, "
            "return_dict=False), sorted(m for m in sys.modules if m.startswith('nanocomposer'))]))")
    out = subprocess.run([sys.executable, "-c", code, str(ckpt), str(tmp_path / "row.json")], capture_output=True,
                         text=True, timeout=300, check=True, cwd=Path(__file__).resolve().parents[1])
    ref = AutoTokenizer.from_pretrained(ckpt)
    expected = [type(ref).__name__, ref.chat_template, ref.apply_chat_template(
        row["messages"], tools=json.loads(row["tools"]), tokenize=True, return_dict=False), []]
    assert json.loads(out.stdout) == expected
    assert "model of type" not in out.stderr, out.stderr


def test_rows_from_turn_records_equal_the_harness_messages(calc_task):
    """The rows are the harness's messages as the model saw them (read back from a results file too)."""
    for seed in range(4):
        traj = run_episode(calc_task, OraclePolicy(seed=seed))
        harness = [{k: m[k] for k in ("role", "content", "name") if k in m} for m in traj.messages]
        record = json.loads(json.dumps(traj.to_record()))  # as read back from a results file
        assert json.dumps(sft_messages(record)) == json.dumps(harness)

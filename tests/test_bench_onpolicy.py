"""bench.onpolicy_logprobs on a micro checkpoint: in fp32 the sampler's logprobs (batched decode, padded batch)
are the trainer's (one forward pass), which is what lets the real-time on-policy check tell rounding from a bug."""

import json

import pytest

from bench import onpolicy_logprobs
from tests.conftest import save_micro_checkpoint

TOOLS = [{"type": "function", "function": {"name": "submit", "description": "Finish.", "parameters": {
    "type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}}}]


def episode(key: str, user: str, turns: int) -> dict:
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": user}]
    for i in range(turns):
        messages += [{"role": "assistant", "content": f"looking at file {i}"},
                     {"role": "tool", "name": "submit", "content": f"result {i} " * (i + 1)}]
    return {"episode_key": key, "messages": messages, "tools": TOOLS}


def test_fp32_sampling_and_scoring_agree_on_conversations_of_different_lengths(tmp_path):
    model = save_micro_checkpoint(tmp_path / "micro")
    episodes = tmp_path / "results.episodes.jsonl"
    rows = [episode("a#0", "fix the bug", 1), episode("b#0", "add a test for the parser please", 3),
            {"episode_key": "c#0", "messages": [{"role": "user", "content": "no answer yet"}], "tools": TOOLS}]
    episodes.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = onpolicy_logprobs.main(["--model", str(model), "--episodes", str(episodes), "--n", "2",
                                     "--max_new_tokens", "6", "--dtypes", "float32", "bfloat16"])
    fp32, bf16 = report
    assert fp32["dtype"] == "float32" and bf16["dtype"] == "bfloat16"
    assert fp32["tokens"] > 2 and fp32["prompt_tokens"][0] < fp32["prompt_tokens"][1]  # a padded batch
    assert fp32["max"] < 1e-4 and fp32["mean"] <= fp32["p99"] <= fp32["max"]
    assert bf16["tokens"] > 2 and bf16["max"] < 1.0


def test_a_file_without_assistant_turns_is_a_clear_error(tmp_path):
    episodes = tmp_path / "e.jsonl"
    episodes.write_text(json.dumps({"episode_key": "x", "messages": [{"role": "user", "content": "hi"}],
                                    "tools": TOOLS}) + "\n")
    with pytest.raises(SystemExit, match="no episode with an assistant turn"):
        onpolicy_logprobs.main(["--model", "unused", "--episodes", str(episodes)])


@pytest.mark.parametrize("content, message", [
    ("{not json\n", ":1: not an episode record"),
    (json.dumps({"episode_key": "x", "messages": [{"role": "user", "content": "a"},
                                                  {"role": "assistant", "content": "b"}]}) + "\n",
     ":1: not an episode record with messages, tools and episode_key (KeyError"),
])
def test_a_broken_episodes_file_names_the_line(tmp_path, content, message):
    episodes = tmp_path / "e.jsonl"
    episodes.write_text(content)
    with pytest.raises(SystemExit, match=message.replace("(", "\\(")):
        onpolicy_logprobs.main(["--model", "unused", "--episodes", str(episodes)])


def test_a_missing_model_is_a_clear_error(tmp_path):
    episodes = tmp_path / "e.jsonl"
    episodes.write_text(json.dumps(episode("a#0", "fix it", 1)) + "\n")
    with pytest.raises(SystemExit, match="onpolicy_logprobs: .*nowhere"):
        onpolicy_logprobs.main(["--model", str(tmp_path / "nowhere"), "--episodes", str(episodes)])

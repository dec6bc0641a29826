"""One RL sample per episode, token-in and token-out: the policy that builds each episode's token sequence
turn by turn (`RolloutPolicy`), and the training sample made from it (`episode_sample`). nanocomposer/rollout.py
plays the episodes; this module decides which tokens TRL trains on.

One sequence per episode. The sample TRL trains on is `prompt_ids` = the rendered first prompt (system +
tools + task + assistant header) and `completion_ids` = every later token: the model's own ids of each
turn, exactly as sampled, interleaved with the environment's tokens (the template's text between turns:
end of turn, tool responses, next assistant header). `env_mask` is 1 on the model's tokens and 0 on the
environment's (TRL's tool mask: tool results are never trained on); `logprobs` are the sampling
log-probabilities (0.0 on environment tokens, which the mask excludes).

Token-in, token-out (`RolloutPolicy`): each turn's prompt is the episode's previous prompt + the sampled ids
+ the environment's tokens, not a fresh tokenization of the re-rendered conversation. The template is
prefix-preserving, so when the sampled ids are the tokenizer's own tokenization of the text they decode
to, both are the same ids and the RL path shows the model exactly what eval's ModelPolicy shows it
(tested by replaying a trajectory through both). When the model samples a non-canonical split of some
text (BPE allows several), re-tokenizing would change the context under the model's feet and the
training forward pass would score tokens in a context the sampler never saw; keeping the sampled ids
keeps training on-policy. How often that happens is logged (`rollout/noncanonical_turn_rate`).
"""

from __future__ import annotations

from dataclasses import dataclass

from env.episode import Generation, Trajectory, TurnRequest, foreign_token_source
from nanocomposer.engine.sampling import Completion, FunctionGenerator
from nanocomposer.engine.transformers_backend import TransformersGenerator
from nanocomposer.policy import END_OF_TURN, ModelPolicy, SamplingConfig


class RolloutError(RuntimeError):
    """A rollout that cannot become a training sample; the message names the task and the problem."""


def refuse_foreign(trajectory: Trajectory, where: str) -> None:
    """RolloutError, one line, when the trajectory's tokens are not this model's (an OpenAI-compatible endpoint
    played it: another tokenizer, no ids or logprobs of ours). SFT export may still use its text."""
    from nanocomposer.policies import is_remote

    found = foreign_token_source(trajectory.turns)
    if found is None and is_remote(trajectory.policy):
        found = (0, trajectory.policy)
    if found is not None:
        raise RolloutError(f"{where}: its tokens are not ours (turn {found[0]} came from {found[1]}); RL trains "
                           "only on its own model's token ids and logprobs (SFT export may use this trajectory)")


@dataclass
class _Sequence:
    """Where one episode's token sequence stands after its last turn (RolloutPolicy)."""

    text: str  # the rendering the last prompt was made from
    prompt_ids: list[int]
    completion_ids: list[int]
    turn_text: str  # what the harness stored as the assistant message of that turn


class RolloutPolicy(ModelPolicy):
    """ModelPolicy that extends each episode's token sequence turn by turn instead of re-tokenizing (module
    docstring), for every live episode of a runner at once (its stream, or `act_batch`): `prompt_ids` builds a
    turn's prompt from the episode's state, `turn_done` records what the turn sampled.

    Each prompt after an episode's first is: its previous prompt ids + the ids sampled for its previous turn +
    the tokens of the text the chat template adds after it (end of turn, tool responses, next assistant
    header). That text is the difference of two renderings, which the prefix-preserving template makes a
    suffix; a conversation that is not extended as a suffix (e.g. a compactor rewrote it) gets a RolloutError
    for that episode. The state is kept per `episode_key` (a request of turn 0 starts it afresh); `forget()`
    drops it once a rollout's episodes are over.

    The transformers backend keeps each episode's KV states between its turns (`PrefixCache`), so a turn
    prefills only the tokens the environment added. The weights are fixed within a rollout and change after
    it (the optimizer step), so `forget()` clears that cache too: no rollout reuses states of older weights.

    `cpu_threads` (ModelPolicy's): torch's CPU threads while generating (restored after; None: leave them).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._sequences: dict[str, _Sequence] = {}
        self._rendered: dict[str, str] = {}  # episode key -> the rendering behind the prompt being generated

    def _generation(self, prompt_ids: list[int], completion_ids: list[int], logprobs: list[float]) -> Generation:
        """A turn that stopped on a stop id other than the template's end of turn (`<|endoftext|>`) leaves that
        id out of its completion: the template closes the turn with its own `<|im_end|>` (an environment
        token), so the next prompt is what eval's re-rendering gives, not `...<|endoftext|><|im_end|>`."""
        generation = super()._generation(prompt_ids, completion_ids, logprobs)
        end = self.tokenizer.convert_tokens_to_ids(END_OF_TURN) if END_OF_TURN in self.tokenizer.get_vocab() else None
        if not generation.truncated and end is not None and completion_ids[-1] != end:
            generation.completion_ids, generation.logprobs = list(completion_ids[:-1]), list(logprobs[:-1])
        return generation

    def forget(self) -> None:
        self._sequences.clear()
        self._rendered.clear()
        if isinstance(self.generator, TransformersGenerator):
            self.generator.clear_prefix_cache()

    def render_text(self, messages: list[dict], tools: list[dict]) -> str:
        from nanocomposer.policy import MESSAGE_KEYS

        clean = [{k: m[k] for k in MESSAGE_KEYS if k in m} for m in messages]
        return self.tokenizer.apply_chat_template(clean, tools=tools or None, add_generation_prompt=True,
                                                  tokenize=False)

    def turn_done(self, request: TurnRequest, result: Generation | BaseException) -> None:
        key = request.episode_key
        text = self._rendered.pop(key, None)
        if isinstance(result, Generation) and text is not None:
            self._sequences[key] = _Sequence(text, result.prompt_ids, result.completion_ids, result.text)
        else:  # the episode ends with this error: its sequence is finished
            self._sequences.pop(key, None)

    def prompt_ids(self, request: TurnRequest) -> list[int]:
        """The episode's previous prompt and sampled ids, extended by the tokens of what the environment added
        (class docstring); the first turn is tokenized whole."""
        key = request.episode_key
        text = self.render_text(request.messages, request.tools)
        last = self._sequences.pop(key, None) if request.turn > 0 else None
        if request.turn == 0:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        elif last is None:
            raise RolloutError(f"episode {key}: turn {request.turn} without the tokens of the turn before it")
        else:
            if not text.startswith(last.text + last.turn_text):
                raise RolloutError(f"episode {key}: turn {request.turn} does not extend the previous prompt as a "
                                   "suffix (was the conversation rewritten, e.g. by a compactor?)")
            env_text = text[len(last.text) + len(last.turn_text):]
            stop_text = self.tokenizer.decode(last.completion_ids[-1:], skip_special_tokens=False)
            if last.completion_ids and last.completion_ids[-1] in self.stop_ids and env_text.startswith(stop_text):
                env_text = env_text[len(stop_text):]  # the model wrote the end-of-turn token itself
            ids = last.prompt_ids + last.completion_ids + self.tokenizer.encode(env_text, add_special_tokens=False)
        self._rendered[key] = text
        return self.fits_context(ids)


class VLLMRolloutPolicy(RolloutPolicy):
    """RolloutPolicy generating with the trainer's vLLM engine (TRL's colocate or server mode): every request of
    an `act_batch` in one `vllm_generation.generate` call.

    Sampling settings are the trainer's (temperature, top_p, and max_completion_length, which train_rl sets to
    the per-turn max_new_tokens; TRL's engine takes no per-request seeds); logprobs are vLLM's processed
    logprobs of the sampled tokens.
    """

    def __init__(self, model, tokenizer, sampling: SamplingConfig, trainer):
        super().__init__(model, tokenizer, sampling)
        self.trainer = trainer
        self.generator = FunctionGenerator(self._generate_on_trainer)

    def _generate_on_trainer(self, prompts: list[list[int]], seeds: list[int]) -> list[Completion]:
        _, completions, logprobs, _ = self.trainer.vllm_generation.generate(prompts, None, 1)
        return [Completion(list(ids), [float(lp[0]) if lp and lp[0] is not None else float("nan") for lp in lps])
                for ids, lps in zip(completions, logprobs, strict=True)]


def noncanonical_turns(trajectory: Trajectory, tokenizer) -> int:
    """Turns whose sampled ids are not the tokenizer's own tokenization of the text they decode to (the stop
    token aside): where re-tokenizing would have changed the context under the model (module docstring)."""
    count = 0
    for turn in trajectory.turns:
        ids = turn["completion_ids"] or []
        stopped = not turn["truncated"] and ids and ids[-1] in tokenizer.all_special_ids  # (RolloutPolicy drops a
        body = ids[:-1] if stopped else ids  # stop id other than the end of turn: those turns end in text)
        count += tokenizer.encode(turn["text"], add_special_tokens=False) != body
    return count


def episode_sample(trajectory: Trajectory, eos_id: int, mask_episode: bool = False) -> dict:
    """One training sample from an episode: prompt_ids, completion_ids, env_mask, logprobs (module docstring).

    Every turn's prompt must extend the sequence built so far (RolloutPolicy guarantees it; so does any policy
    whose sampled ids are canonical). An episode without a single turn (e.g. the first prompt overflowed the
    context) becomes one masked EOS token: TRL needs a non-empty completion, and nothing is trained.
    """
    refuse_foreign(trajectory, f"task {trajectory.task_id}")
    turns = trajectory.turns
    if not turns:
        return {"prompt_ids": [eos_id], "completion_ids": [eos_id], "env_mask": [0], "logprobs": [0.0]}
    sequence = list(turns[0]["prompt_ids"])
    prompt_len = len(sequence)
    env_mask, logprobs = [], []
    for turn in turns:
        prompt, completion = turn["prompt_ids"], turn["completion_ids"]
        if prompt is None or completion is None or turn["logprobs"] is None:
            raise RolloutError(f"task {trajectory.task_id}: turn {turn['turn']} has no token ids "
                               f"(policy {trajectory.policy!r} is not a model policy)")
        if prompt[:len(sequence)] != sequence:
            raise RolloutError(f"task {trajectory.task_id}: the prompt of turn {turn['turn']} does not extend the "
                               "tokens of the turns before it; the episode cannot be one training sequence")
        env = prompt[len(sequence):]
        sequence += env + completion
        env_mask += [0] * len(env) + [1] * len(completion)
        logprobs += [0.0] * len(env) + list(turn["logprobs"])
    if mask_episode:
        env_mask = [0] * len(env_mask)
    return {"prompt_ids": sequence[:prompt_len], "completion_ids": sequence[prompt_len:], "env_mask": env_mask,
            "logprobs": logprobs}

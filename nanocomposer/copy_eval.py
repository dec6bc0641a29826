"""In-context copy accuracy: can the model reproduce a random identifier it has seen earlier in its context?

A probe is a held-out document of `data.build_copy_corpus` cut right before the second occurrence of one
of its invented identifiers; the targets are the tokens that cover that occurrence. The identifiers are
random syllables, new in every document, so only copying from the first occurrence predicts them.
All scores are teacher-forced argmax accuracies, which is exactly what greedy decoding from the same
prefix would write.

- `copy_accuracy` (the copy skill itself, induction): given the identifier's first token(s) as a cue, the
  model writes the rest of it exactly. The cue is the shortest prefix of the occurrence whose last token,
  everywhere earlier in the context, is followed by the same next token: copying then has one right
  answer. A probe needs at least one token after the cue.
- `next_name_accuracy`: the model writes the whole identifier at its second occurrence, cue included. That
  also asks *which* name comes next, which the code often leaves open (`return a` or `return b`), so its
  ceiling is below 1 even for a model that copies perfectly; it is logged beside, not instead.
- `copy_token_accuracy` averages over the tokens after the cue instead of whole identifiers.

The first target token can carry one character from before the identifier (the GPT-4 split regex glues
one non-letter, e.g. a space or `(`, to the following letters). Contexts are cut to the last
`max_context` tokens (the CPT block size: a longer context was never trained), and a probe whose first
occurrence falls outside that window is not made.

    python -m nanocomposer.copy_eval --model runs/demo/cpt --probes 200
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import torch
from transformers import TrainerCallback

from data.build_copy_corpus import generate_document, occurrences

DEFAULT_PROBES = 200
DEFAULT_MAX_CONTEXT = 256
PROBE_SEED = 0  # held-out documents of build_copy_corpus --seed 0; training corpora use the train range


@dataclass(frozen=True)
class CopyProbe:
    """Token ids of the context (ending right before the identifier's second occurrence) and targets."""

    context: tuple[int, ...]
    targets: tuple[int, ...]
    identifier: str
    cue: int = 1  # targets[:cue] are the cue; copy_accuracy scores targets[cue:]


def make_probes(tokenizer, count: int = DEFAULT_PROBES, max_context: int = DEFAULT_MAX_CONTEXT,
                seed: int = PROBE_SEED) -> list[CopyProbe]:
    """`count` probes, one per held-out document (documents without a usable probe are skipped)."""
    from data.build_copy_corpus import SEED_STRIDE, document_seed

    if count < 1 or max_context < 2:
        raise ValueError(f"make_probes: count={count} must be >= 1 and max_context={max_context} >= 2")
    probes: list[CopyProbe] = []
    for index in range(SEED_STRIDE):
        if len(probes) == count:
            return probes
        probe = _document_probe(tokenizer, document_seed("validation", index, seed), max_context)
        if probe is not None:
            probes.append(probe)
        elif index > 20 * count:
            break
    raise ValueError(f"make_probes: only {len(probes)} probes fit max_context={max_context} tokens")


def _document_probe(tokenizer, doc_seed: int, max_context: int) -> CopyProbe | None:
    import random

    doc = generate_document(doc_seed)
    rng = random.Random(f"copy-probe:{doc_seed}")
    encoding = tokenizer(doc.text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
    candidates = [name for name in dict.fromkeys(doc.identifiers) if len(occurrences(doc.text, name)) >= 2]
    rng.shuffle(candidates)
    for name in candidates:
        (first_start, _), (start, end) = occurrences(doc.text, name)[:2]
        covering = [i for i, (a, b) in enumerate(offsets) if a < end and b > start]
        if not covering:
            continue
        first = next(i for i, (a, b) in enumerate(offsets) if b > first_start)
        window_start = max(0, covering[0] - max_context)
        if first >= window_start and first < covering[0]:
            context, targets = tuple(ids[window_start:covering[0]]), tuple(ids[i] for i in covering)
            cue = unambiguous_cue(context, targets)
            if cue is not None:
                return CopyProbe(context, targets, name, cue)
    return None


def unambiguous_cue(context: tuple[int, ...], targets: tuple[int, ...]) -> int | None:
    """The shortest cue length k >= 1 such that every earlier occurrence of targets[k-1] in context + the
    cue is followed by targets[k] (one right answer for a copying model); None if no k < len(targets)."""
    seen = context + targets
    for k in range(1, len(targets)):
        end = len(context) + k - 1  # position of the cue's last token
        followers = {seen[i + 1] for i in range(end) if seen[i] == targets[k - 1]}
        if followers == {targets[k]}:
            return k
    return None


@torch.no_grad()
def copy_accuracy(model, probes: list[CopyProbe], batch_size: int = 32) -> dict[str, float]:
    """Exact-match and per-token teacher-forced accuracy of `model` on `probes` (see the module docstring).

    `model(input_ids=..., attention_mask=...)` must return an object with `.logits` (any causal LM). Rows
    are right-padded, so every row's positions start at 0 as in training. The model's train/eval mode is
    restored afterwards.
    """
    if not probes:
        raise ValueError("copy_accuracy: no probes")
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        exact, whole_names, correct_tokens, total_tokens = 0, 0, 0, 0
        parameter = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
        device = parameter.device if parameter is not None else torch.device("cpu")
        ordered = sorted(probes, key=lambda p: len(p.context) + len(p.targets))
        for start in range(0, len(ordered), batch_size):
            batch = ordered[start:start + batch_size]
            rows = [p.context + p.targets[:-1] for p in batch]  # the last target is predicted, never read
            width = max(map(len, rows))
            input_ids = torch.zeros(len(rows), width, dtype=torch.long)
            attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
            for r, row in enumerate(rows):
                input_ids[r, :len(row)] = torch.tensor(row)
                attention_mask[r, :len(row)] = 1
            rows_at = torch.tensor([r for r, p in enumerate(batch) for _ in p.targets])
            # The position whose next token is each target: the context's last token, then the targets'.
            positions_at = torch.tensor([len(p.context) - 1 + k for p in batch for k in range(len(p.targets))])
            predicted = _predictions_at(model, input_ids.to(device), attention_mask.to(device),
                                        rows_at.to(device), positions_at.to(device)).cpu().tolist()
            for probe in batch:
                guesses, predicted = predicted[:len(probe.targets)], predicted[len(probe.targets):]
                right = [g == t for g, t in zip(guesses, probe.targets)]
                whole_names += all(right)
                exact += all(right[probe.cue:])
                correct_tokens += sum(right[probe.cue:])
                total_tokens += len(probe.targets) - probe.cue
    finally:
        if was_training and hasattr(model, "train"):
            model.train()
    return {"copy_accuracy": exact / len(probes), "copy_token_accuracy": correct_tokens / total_tokens,
            "next_name_accuracy": whole_names / len(probes), "copy_probes": len(probes)}


def _predictions_at(model, input_ids, attention_mask, rows, positions) -> torch.Tensor:
    """Argmax next tokens at (rows, positions). A transformers causal LM runs its LM head only there (the
    head over the 8k vocabulary is most of a tiny model's compute); anything else returns full `.logits`."""
    decoder = getattr(model, "get_decoder", lambda: None)()
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if decoder is None or head is None:
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[rows, positions].argmax(-1)
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return head(hidden[rows, positions]).argmax(-1)


class CopyAccuracyCallback(TrainerCallback):
    """Logs `eval_copy_accuracy`, `eval_copy_token_accuracy` and `eval_next_name_accuracy` after every
    evaluation of a Trainer (W&B shows them as eval/copy_accuracy, ...), and with `repeat_distinct` also
    `eval_repeat_copy_accuracy`: copying fresh random token runs (`nanocomposer.copy_warmup`).

    `log` is the trainer's `log` method: the values go through every logging callback and into
    `state.log_history` as their own entry at the evaluation's step. They are also added to the metrics
    dict `trainer.evaluate()` returns.
    """

    def __init__(self, probes: list[CopyProbe], log, batch_size: int = 32, repeat_distinct: int | None = None):
        if not probes:
            raise ValueError("CopyAccuracyCallback: no probes")
        self.probes, self.log, self.batch_size = probes, log, batch_size
        self.repeat_distinct = repeat_distinct  # also log eval_repeat_copy_accuracy (nanocomposer.copy_warmup)

    def on_evaluate(self, args, state, control, model=None, metrics=None, **kwargs):
        if model is None or not state.is_world_process_zero:
            return
        result = copy_accuracy(model, self.probes, self.batch_size)
        logs = {f"eval_{key}": result[key] for key in ("copy_accuracy", "copy_token_accuracy", "next_name_accuracy")}
        if self.repeat_distinct:
            from nanocomposer.copy_warmup import repeated_runs_accuracy

            logs["eval_repeat_copy_accuracy"] = repeated_runs_accuracy(model, self.repeat_distinct)
        if metrics is not None:
            metrics.update(logs)
        self.log(logs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanocomposer.copy_eval", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a saved causal LM directory (model and tokenizer)")
    parser.add_argument("--probes", type=int, default=DEFAULT_PROBES)
    parser.add_argument("--max-context", type=int, default=DEFAULT_MAX_CONTEXT)
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import nanocomposer.smeared_llama  # noqa: F401  (registers the embedded base's model type)

    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    except (OSError, ValueError) as error:
        parser.error(f"--model {args.model}: does not load ({str(error).splitlines()[0]})")
    try:
        probes = make_probes(tokenizer, args.probes, args.max_context)
    except ValueError as error:
        parser.error(str(error))
    print(json.dumps(copy_accuracy(model, probes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

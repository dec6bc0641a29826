"""Copy warm-up: training rows of random token runs, each followed by itself, put before the code in CPT.

Every token of a run's second half is predictable only by copying from the first half, so these rows reward
the copying (induction) circuit at every position; in code only the names do, among tokens that local syntax
already predicts. Measured on the tiny smeared-key base (docs/copying.md): 700 steps of these rows took
repeated-run copying from 0% to 62%, and the code CPT that followed reached a cued copy accuracy on held-out
names that 1,500 steps of the code mix alone never approached.

`train_cpt.py --copy_warmup_steps N` puts N optimizer steps of these rows first (then the code blocks, in an
order shuffled with the run's seed); `bench/copy_formation.py` trains on them alone.
"""

from __future__ import annotations

import random

import torch

FIRST_ID = 100  # runs draw ids FIRST_ID.. (clear of the special and tool tokens at the start of the vocabulary)
RUN_LENGTHS = (4, 16)  # shortest and longest run, in tokens
SEPARATOR_ID = 0  # after each repeated run (the embedded tokenizer's <|endoftext|>)


def repeated_runs_row(rng: random.Random, length: int, distinct: int, shortest: int = RUN_LENGTHS[0],
                      longest: int = RUN_LENGTHS[1]) -> list[int]:
    """`length` token ids: random runs of `shortest`..`longest` ids from `distinct` ids, each run twice."""
    row: list[int] = []
    while len(row) < length:
        run = [rng.randrange(FIRST_ID, FIRST_ID + distinct) for _ in range(rng.randint(shortest, longest))]
        row += run + run + [SEPARATOR_ID]
    return row[:length]


def distinct_ids(vocab_size: int) -> int:
    """How many ids the runs may draw from a vocabulary of `vocab_size`."""
    if vocab_size <= FIRST_ID + 1:
        raise ValueError(f"copy warm-up: a vocabulary of {vocab_size} ids leaves none above id {FIRST_ID}")
    return vocab_size - FIRST_ID


def copy_warmup_blocks(rows: int, block_size: int, vocab_size: int, seed: int):
    """A datasets.Dataset of `rows` blocks shaped like `pack_documents`' (input_ids, position_ids, labels)."""
    from datasets import Dataset

    rng = random.Random(f"copy-warmup:{seed}")
    distinct = distinct_ids(vocab_size)
    ids = [repeated_runs_row(rng, block_size, distinct) for _ in range(rows)]
    positions = list(range(block_size))
    return Dataset.from_dict({"input_ids": ids, "position_ids": [positions] * rows,
                              "labels": [[-100, *row[1:]] for row in ids]})


def repeated_runs_accuracy(model, distinct: int, runs: int = 16, half: int = 20, seed: int = 123) -> float:
    """Greedy accuracy on the second halves of `runs` fresh random runs of `half` ids (teacher-forced)."""
    rng = random.Random(seed)
    device = next(model.parameters()).device
    ids = torch.tensor([run + run for run in
                        ([rng.randrange(FIRST_ID, FIRST_ID + distinct) for _ in range(half)] for _ in range(runs))],
                       device=device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        predicted = model(input_ids=ids).logits.argmax(-1)
    model.train(was_training)
    return (predicted[:, half:2 * half - 1] == ids[:, half + 1:]).float().mean().item()

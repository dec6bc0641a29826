"""How a tokenizer cuts names: does a name start with the same token wherever it occurs, and at what cost.

Copying a name from the context is an induction step: find where the name was, write what came there. That
only works token for token if the name is made of the same tokens in both places. The GPT-4 split glues the
character before a word to it, so ` dounaim` in an instruction and `"dounaim` in a JSON argument start with
different tokens, and the model has to map one onto the other for names it has never seen. Per model:

- copy corpus: of the names that occur twice in held-out `data.build_copy_corpus` documents, the share whose
  second occurrence starts with the same token as the first (the first token is what `copy_eval`'s cued
  accuracy hands the model; `next_name_accuracy` asks for it);
- ladder answers: of the tasks whose gold answer is written in the instruction, the share where the answer's
  tokens in the instruction equal its tokens as the `submit` argument the agent must write;
- code: characters per token on the corpus' validation split (what the agreement costs in sequence length).

    python -m bench.tokenizer --models artifacts/base artifacts/base_bare --tasks artifacts/ladder/tasks/test
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformers import AutoTokenizer

from data.build_copy_corpus import document_seed, generate_document, occurrences
from env.task_sets import resolve_task_set
from env.tasks import TaskError
from nanocomposer.model import iter_corpus_texts


def span_tokens(tokenizer, text: str, start: int, end: int) -> tuple[int, ...]:
    """Ids of the tokens that overlap text[start:end]."""
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return tuple(i for i, (a, b) in zip(encoding["input_ids"], encoding["offset_mapping"], strict=True)
                 if a < end and b > start)


def copy_corpus_head_agreement(tokenizer, documents: int) -> tuple[int, int]:
    """(names whose two first occurrences start with the same token, names that occur twice)."""
    same = total = 0
    for index in range(documents):
        doc = generate_document(document_seed("validation", index, 0))
        for name in dict.fromkeys(doc.identifiers):
            spans = occurrences(doc.text, name)[:2]
            if len(spans) == 2:
                first, second = (span_tokens(tokenizer, doc.text, *span) for span in spans)
                same, total = same + (first[0] == second[0]), total + 1
    return same, total


def answer_agreement(tokenizer, tasks) -> tuple[int, int]:
    """(tasks whose answer has the same tokens in the instruction and in the submit call, tasks with one)."""
    same = total = 0
    for task in tasks:
        answer = task.meta.get("gold_answer")
        if not answer or answer not in task.instruction:
            continue
        call = json.dumps({"name": "submit", "arguments": {"summary": answer}})
        start, call_start = task.instruction.index(answer), call.index(answer)
        same += (span_tokens(tokenizer, task.instruction, start, start + len(answer))
                 == span_tokens(tokenizer, call, call_start, call_start + len(answer)))
        total += 1
    return same, total


def chars_per_token(tokenizer, corpus: str) -> float:
    texts = list(iter_corpus_texts(corpus, "validation"))
    tokens = sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts)
    return sum(map(len, texts)) / tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tokenizer", description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", required=True, help="checkpoint or base directories (their tokenizers)")
    parser.add_argument("--tasks", default="artifacts/ladder/tasks/test", help="task set with gold answers")
    parser.add_argument("--corpus", default="artifacts/data/corpus", help="code corpus (saved DatasetDict)")
    parser.add_argument("--documents", type=int, default=300, help="held-out copy-corpus documents")
    args = parser.parse_args(argv)
    if args.documents < 1:
        parser.error("--documents must be >= 1")
    missing = [path for path in args.models if not Path(path, "tokenizer.json").is_file()]
    if missing:
        parser.error(f"--models {missing[0]}: no tokenizer.json there (a base or checkpoint directory)")
    try:
        tasks = resolve_task_set(args.tasks).tasks
        tokenizers = {path: AutoTokenizer.from_pretrained(path) for path in args.models}
        list(iter_corpus_texts(args.corpus, "validation"))
    except (OSError, ValueError, TaskError) as e:  # a missing or unreadable model, task set or corpus
        parser.error(str(e).splitlines()[0])
    print("| tokenizer | copy corpus: same first token | ladder answers: same tokens | code chars/token |")
    print("|---|---|---|---|")
    for path, tokenizer in tokenizers.items():
        heads, names = copy_corpus_head_agreement(tokenizer, args.documents)
        answers, with_answer = answer_agreement(tokenizer, tasks)
        print(f"| {path} | {heads / names:.1%} of {names} | {answers / max(with_answer, 1):.1%} of {with_answer} "
              f"| {chars_per_token(tokenizer, args.corpus):.2f} |")


if __name__ == "__main__":
    main()

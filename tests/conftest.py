import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data.build_samples import build_samples
from env.patch_apply import make_patch
from env.tasks import load_task, write_task

# data/samples' repos are built from data/projects; test modules load them at import, so build before any is
# collected (a no-op when up to date; a lock serialises the xdist workers).
build_samples()

CALC_REPO = {
    "calc/__init__.py": "",
    "calc/ops.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
    "tests/test_ops.py": "from calc.ops import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
                         "def test_mul():\n    assert mul(2, 3) == 6\n",
}


def make_calc_task(dest: Path, task_id: str = "calc-add"):
    fixed = dict(CALC_REPO, **{"calc/ops.py": CALC_REPO["calc/ops.py"].replace("a - b", "a + b")})
    root = write_task(dest / task_id, id=task_id, instruction="add(2, 3) returns -1 instead of 5.",
                      test_command="python -m pytest -q -p no:cacheprovider tests", repo=CALC_REPO,
                      hidden={"tests/test_ops.py": CALC_REPO["tests/test_ops.py"]},
                      gold_patch=make_patch(CALC_REPO, fixed), family="fix_bug", tier="micro")
    return load_task(root)


SENTINEL = "SENTINEL-HOST-FILE-CONTENT-5c1e"  # in the host files no patch, gold edit or error may carry


@pytest.fixture
def host(tmp_path) -> Path:
    """Files outside every root, for the patch tests (tests/test_hostile_tasks.py has its own `host`): a
    sentinel next to the task set and one in the system temp directory (where a scratch copy of a repo used to
    live)."""
    d = tmp_path / "host"
    d.mkdir()
    (d / "SENTINEL.txt").write_text(SENTINEL + "\n")
    fd, name = tempfile.mkstemp(prefix="SENTINEL-", suffix=".txt")
    os.write(fd, (SENTINEL + "\n").encode())
    os.close(fd)
    (d / "tmp-name").write_text(Path(name).name)
    yield d
    os.unlink(name)


def host_state(host: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(host.iterdir())}


@pytest.fixture
def two_tasks(tmp_path) -> Path:
    """A directory of two calc tasks (calc-a, calc-b)."""
    root = tmp_path / "tasks"
    for task_id in ("calc-a", "calc-b"):
        make_calc_task(root, task_id)
    return root


@pytest.fixture
def calc_task(tmp_path):
    return make_calc_task(tmp_path)


def save_micro_checkpoint(dest: Path, context: int = 4096, smeared_keys: bool = True) -> Path:
    """An untrained micro model (vocab ~512, hidden 64, 2 layers) saved at `dest` like a pipeline stage; the
    default base's architecture (smeared keys) unless `smeared_keys=False` (a plain Llama, what vLLM serves)."""
    import sysconfig

    import torch

    from nanocomposer.model import build_model, build_tokenizer

    torch.set_num_threads(1)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    tokenizer = build_tokenizer([(stdlib / f).read_text(encoding="utf-8") for f in ("json/encoder.py", "shlex.py")],
                                512)
    tokenizer.model_max_length = context
    build_model(tokenizer, hidden=64, layers=2, heads=2, context=context, seed=0,
                smeared_keys=smeared_keys).save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def assert_merged_lora_checkpoint(out: Path, base_dir: Path) -> None:
    """`out` holds a full model (no adapter files, no LoRA parameters) whose LoRA targets (q_proj) moved
    away from `base_dir`'s weights while the other projections (k_proj) stayed exactly the base's."""
    import torch
    from transformers import AutoModelForCausalLM

    assert (out / "model.safetensors").is_file() and not (out / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    layer, base_layer = merged.model.layers[0].self_attn, base.model.layers[0].self_attn
    assert not torch.equal(layer.q_proj.weight, base_layer.q_proj.weight)  # adapted and merged
    assert torch.equal(layer.k_proj.weight, base_layer.k_proj.weight)  # not a LoRA target: untouched


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one CPU thread for a test module (restored after): micro models gain nothing from threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def harness_leftovers(tmp: Path) -> list[str]:
    """Workspaces (directories and tmpfs mounts), grading copies and sandboxed processes of runs that used
    `tmp` as their temp dir."""
    import re

    dirs = [str(p) for p in tmp.rglob("*") if p.is_dir() and re.match(r"(ws|grade)-", p.name)]
    dirs += [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(tmp) in line]
    procs = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(tmp).encode() in cmdline.read_bytes():
                procs.append(cmdline.parent.name)
        except OSError:
            continue
    return dirs + procs

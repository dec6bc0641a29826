"""The local model registry the agent server serves from: named versions and an atomically swapped pointer.

    registry/
      versions/<name>/     a checkpoint directory (or a symlink to one), or a directory holding
                           policy.json {"spec": "oracle" | "replay:/abs/file.json" | ...} for scripted policies
      current              the name of the version new sessions use (replaced with os.replace: readers see
                           the old name or the new one, never a partial write)

Training (a later real-time RL loop) writes a new version directory, then promotes it; the server reads
`current` when each session starts, so a promotion needs no restart and each session records its version.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from nanocomposer.policies import is_remote, is_scripted

VERSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class RegistryError(ValueError):
    """A registry operation that cannot be done; the message names the registry and the version."""


class Registry:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.versions_dir = self.root / "versions"
        self.current_file = self.root / "current"

    def versions(self) -> list[str]:
        if not self.versions_dir.is_dir():
            return []
        return sorted(p.name for p in self.versions_dir.iterdir() if p.is_dir() and VERSION_NAME.fullmatch(p.name))

    def current(self) -> str | None:
        try:
            name = self.current_file.read_text().strip()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as e:
            raise RegistryError(f"registry {str(self.root)!r}: cannot read {str(self.current_file)!r} ({e})") from None
        return name or None

    def spec(self, version: str) -> str:
        """The policy spec `nanocomposer.policies.build_policy` takes for `version`."""
        path = self._path(version)
        if not path.is_dir():
            raise RegistryError(f"registry {str(self.root)!r}: no version {version!r} "
                                f"(versions: {', '.join(self.versions()) or 'none'})")
        spec_file = path / "policy.json"
        if spec_file.is_file():
            try:
                return str(json.loads(spec_file.read_text())["spec"])
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise RegistryError(f"registry version {version!r}: bad {spec_file} ({e})") from None
        return str(path.resolve())

    def add(self, version: str, spec: str) -> None:
        """Register `spec` (a scripted policy or a checkpoint directory, linked, not copied) as `version`."""
        path = self._path(version)
        if path.exists() or path.is_symlink():
            raise RegistryError(f"registry {str(self.root)!r}: version {version!r} already exists")
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        spec = normal_spec(spec)
        if is_scripted(spec) or is_remote(spec):
            tmp = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=self.versions_dir))
            (tmp / "policy.json").write_text(json.dumps({"spec": spec}) + "\n")
            os.replace(tmp, path)
            return
        checkpoint = Path(spec)
        if not checkpoint.is_dir():
            raise RegistryError(f"checkpoint {spec!r}: not a directory (cannot register version {version!r})")
        path.symlink_to(checkpoint.resolve(), target_is_directory=True)

    def promote(self, version: str) -> None:
        """Point `current` at `version`: refused (RegistryError, `current` unchanged) when the version is a
        checkpoint that would not load (a candidate half-written by a killed trainer, truncated weights)."""
        spec = self.spec(version)  # exists and is readable
        if not is_scripted(spec) and not is_remote(spec):
            from nanocomposer.inputs import model_dir_problem  # lazy: scripted registries need no torch

            if (problem := model_dir_problem(Path(spec), chat_template=True)) is not None:
                raise RegistryError(f"registry {str(self.root)!r}: version {version!r} cannot be promoted: "
                                    f"{spec}: {problem}")
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".current-", dir=self.root)
        with os.fdopen(fd, "w") as f:
            f.write(version + "\n")
        os.replace(tmp, self.current_file)

    def ensure(self, spec: str, version: str | None = None) -> str:
        """`spec` registered (under `version`, or a name derived from it) and promoted; returns the name."""
        name = version or _version_name(spec)
        if name not in self.versions():
            self.add(name, spec)
        elif version is None and self.spec(name) != normal_spec(spec):
            raise RegistryError(f"registry {str(self.root)!r}: version {name!r} exists with another spec; "
                                "name the new one with --version")
        self.promote(name)
        return name

    def _path(self, version: str) -> Path:
        if not isinstance(version, str) or not VERSION_NAME.fullmatch(version):
            raise RegistryError(f"invalid version name {version!r}: use letters, digits, '.', '_' and '-'")
        return self.versions_dir / version


def normal_spec(spec: str) -> str:
    """Paths made absolute, so a registered spec means the same thing from any working directory."""
    if spec.startswith("replay:"):
        return "replay:" + str(Path(spec.split(":", 1)[1]).resolve())
    return spec if is_scripted(spec) or not Path(spec).exists() else str(Path(spec).resolve())


def _version_name(spec: str) -> str:
    if spec.startswith("replay:"):
        spec = "replay-" + Path(spec.split(":", 1)[1]).stem
    elif is_remote(spec):
        from nanocomposer.policies import policy_label

        spec = policy_label(spec)
    elif not is_scripted(spec):
        spec = "-".join(Path(spec).resolve().parts[-2:])
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", spec).strip("-.") or "model"
    return name[:100]

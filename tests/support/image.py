"""The Dockerfile's steps, run without a container daemon: its COPY steps into a temporary root, its RUN steps in a
fresh venv (that venv's `pip` and `python` first on PATH), its ENTRYPOINT + CMD and HEALTHCHECK as commands.

Substitutions, the only differences from a `docker build`: the interpreter is the suite's Python, not the base
image's; pip installs from a local wheelhouse of the same requirements (`wheelhouse()`: built once per
pyproject.toml, cached outside the checkout) instead of the index, so the steps run offline and in seconds; a RUN that
creates the image's user (`useradd`) is not run (tests run as the current user)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("FAIRSERVE_CACHE", Path.home() / ".cache" / "fairserve"))
NOT_RUN = ("useradd ",)  # RUN steps that need root inside an image
KNOWN = {"FROM", "ENV", "RUN", "WORKDIR", "COPY", "USER", "EXPOSE", "HEALTHCHECK", "ENTRYPOINT", "CMD"}


@dataclass
class Dockerfile:
    steps: list[tuple[str, str]]  # (instruction, its arguments), continuation lines joined

    @classmethod
    def read(cls, path: Path = REPO / "Dockerfile") -> Dockerfile:
        steps, pending = [], ""
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not pending and (not line or line.startswith("#")):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            word, _, rest = (pending + line).partition(" ")
            pending = ""
            if word.upper() not in KNOWN:  # NOTE: a new instruction needs its meaning here, or the test lies
                raise AssertionError(f"the Dockerfile's {word} is not run by tests/support/image.py")
            steps.append((word.upper(), rest.strip()))
        return cls(steps)

    def one(self, instruction: str) -> str:
        (args,) = [a for i, a in self.steps if i == instruction]
        return args

    def command(self) -> list[str]:
        return json.loads(self.one("ENTRYPOINT")) + json.loads(self.one("CMD"))

    def healthcheck(self) -> list[str]:
        options, _, cmd = self.one("HEALTHCHECK").partition("CMD ")
        return json.loads(cmd)


@dataclass
class Image:
    """What the build left: the root the COPY steps wrote into, the venv, the environment ENV set."""

    root: Path
    venv: Path
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def resolve(self, argv: list[str]) -> list[str]:
        """An image command with its program from the venv (`fairserve`, `python`)."""
        return [str(self.venv / "bin" / argv[0]), *argv[1:]]


def wheelhouse() -> Path:
    """Wheels of the package's requirements and build requirements, built once per pyproject.toml."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    needs = sorted(project["project"]["dependencies"]) + sorted(project["build-system"]["requires"])
    key = hashlib.sha256(json.dumps([needs, sys.version_info[:2]]).encode()).hexdigest()[:16]
    where = CACHE / f"wheels-{key}"
    if (where / ".complete").exists():
        return where
    part = where.with_suffix(".part")
    shutil.rmtree(part, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = subprocess.run([*pip, "wheel", "-w", str(part), *needs], capture_output=True, text=True)
    if build.returncode != 0:
        why = f"could not build the wheelhouse for the Dockerfile test: {build.stderr.strip()[-1500:]}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    (part / ".complete").touch()
    shutil.rmtree(where, ignore_errors=True)
    part.rename(where)
    return where


def build(dockerfile: Dockerfile, into: Path) -> Image:
    root, venv = into / "root", into / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    image = Image(root, venv, root)
    image.env = {
        **os.environ,
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheelhouse()),
    }
    for instruction, args in dockerfile.steps:
        if instruction == "ENV":
            image.env.update(dict(pair.split("=", 1) for pair in shlex.split(args)))
        elif instruction == "WORKDIR":
            image.workdir = root / args.lstrip("/")
            image.workdir.mkdir(parents=True, exist_ok=True)
        elif instruction == "COPY":
            *sources, dest = shlex.split(args)
            target = image.workdir / dest if not dest.startswith("/") else root / dest.lstrip("/")
            for source in sources:
                path = REPO / source
                if path.is_dir():
                    shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target / path.name)
        elif instruction == "RUN":
            if args.startswith(NOT_RUN):
                image.skipped.append(args)
                continue
            done = subprocess.run(args, shell=True, cwd=image.workdir, env=image.env, capture_output=True, text=True)
            assert done.returncode == 0, f"RUN {args} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return image

"""The offline GPU kit: pinned wheels, packed into parts small enough to travel one per device call.

The GPU machine (``/work/.library/device``: an H200, Python 3.12, torch with the CUDA 13
libraries, onnxruntime 1.30 for the CPU) reaches no package registry, and each call carries
at most 64 MiB of working tree, the repository's ~23 MiB of tracked files included. So:

1. **lock** (here, with PyPI): pip resolves the server's and ``bench.gpu``'s requirements for
   the target interpreter (``pip install --dry-run --report``) and the resolution is written
   as a requirements file with one sha256 per wheel (``lock-<target>.txt``, committed);
2. **build** (here): ``pip download --require-hashes`` fetches exactly those files; the ones
   the GPU machine lacks (everything but :data:`PROVIDED`) are concatenated, small files
   first, into one byte stream that is cut into parts of at most :data:`PART_BYTES`, each
   in a folder of its own (``parts/NN/``) with its sha256 and the manifest (``kit.json``:
   every file's offset, size and sha256, every part's size and sha256);
3. **check** (here, offline): ``pip install --dry-run --no-index --require-hashes`` resolves
   the whole lock from those files alone, for the target's Python and platforms;
4. **collect** (there, once per call; ``bench/gpu_kit/collect.py``): the parts carried so
   far are copied to a folder that outlives the call while the machine stays warm (skipping
   those already there with the right checksum), every file whose bytes have all arrived is
   cut out and checked, and each group of wheels that is complete (``serve``: all but ONNX
   Runtime; ``ort``: ONNX Runtime) is installed with ``pip --no-index --no-deps --require-hashes --target``.

Standard library only, as is ``collect.py``: they run before anything is installed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PART_BYTES = 38 * 2**20  # + the ~23 MiB tracked tree stays under a call's 64 MiB
# The device README's list: wheels any glibc >= 2.28 x86-64 runs (pip matches each tag exactly).
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# On the GPU machine already (KINDS.md's package list): resolved and checked with the rest, never carried.
# Small pure-Python packages it also has (anyio, idna, h11, click, typing-extensions, ...) travel anyway:
# its versions of them are not known here, and fastapi and pydantic pin lower bounds on them.
PROVIDED = frozenset(
    {
        "numpy",
        "pillow",
        "prometheus-client",
        "protobuf",
        "onnx",
        "ml-dtypes",
        "packaging",
        "flatbuffers",
        "httpx",
        "httpcore",
        "certifi",
        "uvloop",
        "pyyaml",
    }
)
# The versions the GPU machine has of packages it provides, where KINDS.md's pip list names them:
# the cp312 lock resolves against them, so the offline check proves the kit works with what is there.
GPU_MACHINE_PINS = ("numpy==2.5.2", "onnx==1.23.1")
LATE = frozenset({"onnxruntime", "onnxruntime-gpu"})  # the "ort" group, last in the stream
ENV_OFFLINE = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
INCOMPLETE = 3  # collect's exit status while parts are still missing


class KitError(RuntimeError):
    """A part or file with the wrong checksum, a kit that does not match, or pip failing."""


@dataclass(frozen=True)
class Target:
    """One interpreter and requirement set a kit is built for.

    Attributes:
        name: "cp312-gpu" (the GPU machine), "cp311-cpu" (the dry run here), "cp311-device"
            (a stand-in for the GPU machine's own packages, for the dry run).
        python_version: "3.12".
        requirements: the top-level requirements (PEP 508 strings) pip resolves.
    """

    name: str
    python_version: str
    requirements: tuple[str, ...]

    @property
    def lock(self) -> Path:
        """The committed lock file: ``bench/gpu_kit/lock-<name>.txt``."""
        return HERE / f"lock-{self.name}.txt"

    def pip_args(self) -> list[str]:
        """pip's options selecting wheels for this interpreter and the manylinux x86-64 platforms."""
        abi = "cp" + self.python_version.replace(".", "")
        args = ["--only-binary=:all:", "--python-version", self.python_version, "--implementation", "cp"]
        args += ["--abi", abi]  # abi3 and none wheels match too
        for platform in PLATFORMS:
            args += ["--platform", platform]
        return args


def _project_requirements(onnxruntime_extra: str) -> tuple[str, ...]:
    """pyproject's serving dependencies, its ``cpu``/``gpu`` ONNX Runtime pin, the fp16 converter and httpx."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    converter = next(r for r in extras["train"] if r.startswith("onnxconverter-common"))
    httpx = next(r for r in extras["dev"] if r.startswith("httpx"))  # bench.servers waits on /readyz with it
    return (*project["dependencies"], *extras[onnxruntime_extra], converter, httpx)


TARGETS = {
    "cp312-gpu": Target("cp312-gpu", "3.12", (*_project_requirements("gpu"), *GPU_MACHINE_PINS)),
    "cp311-cpu": Target("cp311-cpu", "3.11", _project_requirements("cpu")),
    # What the GPU machine has that the kit relies on, onnxruntime 1.30 (CPU) included, for Python 3.11.
    "cp311-device": Target(
        "cp311-device",
        "3.11",
        ("numpy", "pillow", "prometheus-client", "httpx", "onnx", "uvloop", "pyyaml", "onnxruntime==1.30.0"),
    ),
}


@dataclass(frozen=True)
class Pin:
    """One line of a lock: a wheel pinned by name, version and sha256."""

    name: str
    version: str
    sha256: str
    filename: str

    @property
    def travels(self) -> bool:
        """True when the GPU machine lacks it, so the kit carries it."""
        return self.name not in PROVIDED

    @property
    def group(self) -> str:
        """The install group: "ort" for ONNX Runtime (installed on its own, last), "serve" for the rest."""
        return "ort" if self.name in LATE else "serve"

    def line(self) -> str:
        """The pin as a line of the lock file (a pip requirement with its hash, and a comment)."""
        note = "travels" if self.travels else "provided by the GPU machine"
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}  # {self.filename}; {note}"


def normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them ("PyYAML" -> "pyyaml", "ml_dtypes" -> "ml-dtypes")."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path) -> str:
    """The file's sha256, hex."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(2**20):
            digest.update(chunk)
    return digest.hexdigest()


def pip(args: Sequence[str], *, offline: bool = False) -> str:
    """Run ``python -m pip`` (this interpreter's); return its output.

    Raises:
        KitError: pip failed (its output is in the message).
    """
    env = {k: v for k, v in os.environ.items() if not (offline and k.startswith("PIP_"))}
    env |= ENV_OFFLINE if offline else {}
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise KitError(f"pip {' '.join(args[:2])} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout + done.stderr


def read_lock(path: Path) -> list[Pin]:
    """The pins of a lock file written by :func:`lock`."""
    return read_lock_text(path.read_text())


def read_lock_text(text: str) -> list[Pin]:
    """The pins of a lock file's text (its comment lines skipped)."""
    pins = []
    pattern = re.compile(r"^(\S+)==(\S+) --hash=sha256:([0-9a-f]{64})  # ([^;]+);")
    for line in text.splitlines():
        if match := pattern.match(line):
            pins.append(Pin(match[1], match[2], match[3], match[4]))
    return pins


def lock(target: Target) -> list[Pin]:
    """Resolve ``target.requirements`` for the target interpreter (needs an index) and write its lock file."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        pip(
            [
                "install",
                "--dry-run",
                "--quiet",
                "--ignore-installed",
                "--report",
                str(report),
                "--target",
                str(Path(tmp) / "target"),
                *target.pip_args(),
                *target.requirements,
            ]
        )
        resolved = json.loads(report.read_text())["install"]
    pins = sorted(
        (
            Pin(
                normalise(item["metadata"]["name"]),
                item["metadata"]["version"],
                item["download_info"]["archive_info"]["hashes"]["sha256"],
                item["download_info"]["url"].rsplit("/", 1)[1],
            )
            for item in resolved
        ),
        key=lambda pin: pin.name,
    )
    header = [
        f"# The {target.name} kit's wheels (CPython {target.python_version}, manylinux x86-64), one sha256 each.",
        "# Written by `python -m bench.gpu_kit lock --target " + target.name + "` from:",
        *(f"#   {requirement}" for requirement in target.requirements),
    ]
    target.lock.write_text("\n".join([*header, *(pin.line() for pin in pins)]) + "\n")
    return pins


def download(target: Target, wheels: Path) -> list[Pin]:
    """Fetch every wheel of the target's lock into ``wheels`` (pip checks each sha256), and check them again.

    Raises:
        KitError: pip failed, or a file's sha256 is not the lock's.
    """
    pins = read_lock(target.lock)
    wheels.mkdir(parents=True, exist_ok=True)
    for stale in set(wheels.glob("*.whl")) - {wheels / pin.filename for pin in pins}:
        stale.unlink()  # of an earlier lock: the offline check must see this lock's wheels alone
    requirements = ["-r", str(target.lock), "-d", str(wheels)]
    pip(["download", "--quiet", "--no-deps", "--require-hashes", *target.pip_args(), *requirements])
    for pin in pins:
        if sha256(wheels / pin.filename) != pin.sha256:
            raise KitError(f"{pin.filename}: sha256 is not the lock's {pin.sha256}")
    return pins


def check_offline(target: Target, wheels: Path) -> str:
    """Resolve the whole lock from ``wheels`` alone, for the target's Python and platforms; pip's answer.

    Raises:
        KitError: it does not resolve (a wheel missing, a hash wrong, a platform not matched).
    """
    with tempfile.TemporaryDirectory() as tmp:
        return pip(
            [
                "install",
                "--dry-run",
                "--no-index",
                "--find-links",
                str(wheels),
                "--require-hashes",
                "--ignore-installed",
                "--target",
                tmp,
                *target.pip_args(),
                "-r",
                str(target.lock),
            ],
            offline=True,
        )


def _requirements_file(pins: Iterable[Pin]) -> str:
    return "".join(f"{pin.name}=={pin.version} --hash=sha256:{pin.sha256}\n" for pin in pins)


def pack(target: Target, wheels: Path, out: Path, *, images: Sequence[Path] = (), part_bytes: int = PART_BYTES) -> dict:
    """Write the travelling files of ``target`` as parts into ``out/parts/NN/``; return the manifest.

    The stream holds, in this order: one requirements file per group (``serve.txt``,
    ``ort.txt``, hashes included), ``images`` (the benchmark's JPEGs: the GPU machine has no
    ``../shared``), the ``serve`` wheels by name, then ONNX Runtime's. Each part folder holds
    ``kit.partNN``, ``kit.partNN.sha256`` (``sha256sum -c`` reads it) and ``kit.json``.
    """
    travelling = [pin for pin in read_lock(target.lock) if pin.travels]
    staging = out / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    members: list[tuple[str, Path, str]] = []  # (path in the kit, file here, group)
    for group in ("serve", "ort"):
        requirements = staging / f"{group}.txt"
        requirements.write_text(_requirements_file(p for p in travelling if p.group == group))
        members.append((f"{group}.txt", requirements, "meta"))
    members += [(f"images/{image.name}", image, "images") for image in sorted(images)]
    for group in ("serve", "ort"):
        members += [(f"wheels/{p.filename}", wheels / p.filename, group) for p in travelling if p.group == group]
    files, offset = [], 0
    for path, source, group in members:
        size = source.stat().st_size
        files.append({"path": path, "offset": offset, "size": size, "sha256": sha256(source), "group": group})
        offset += size
    parts_dir = out / "parts"
    shutil.rmtree(parts_dir, ignore_errors=True)
    count = max(1, -(-offset // part_bytes))
    digest = hashlib.sha256()
    parts, sources = [], iter(members)
    current, left = None, 0
    for index in range(1, count + 1):
        name = f"{index:02d}"
        folder = parts_dir / name
        folder.mkdir(parents=True)
        part = folder / f"kit.part{name}"
        with part.open("wb") as sink:
            room = part_bytes
            while room:
                if not left:
                    member = next(sources, None)
                    if member is None:
                        break
                    current, left = member[1].open("rb"), member[1].stat().st_size
                    continue
                chunk = current.read(min(room, left, 2**20))
                sink.write(chunk)
                digest.update(chunk)
                room, left = room - len(chunk), left - len(chunk)
                if not left:
                    current.close()
        parts.append({"name": name, "file": part.name, "size": part.stat().st_size, "sha256": sha256(part)})
        (folder / f"{part.name}.sha256").write_text(f"{parts[-1]['sha256']}  {part.name}\n")
    manifest = {
        "target": target.name,
        "python_version": target.python_version,
        "part_bytes": part_bytes,
        "stream_bytes": offset,
        "stream_sha256": digest.hexdigest(),
        "parts": parts,
        "files": files,
    }
    for part in parts:
        (parts_dir / part["name"] / "kit.json").write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(staging)
    return manifest

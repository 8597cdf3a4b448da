"""``python -m service.process.seed SOURCE REPOSITORY``: fill an empty model repository from the image's models.

The Kubernetes init container (``k8s/deployment.yaml``) runs it before the server: the first pod
finds the shared volume empty and copies the image's ``/models`` into it; later pods find it
full and leave it alone. Standard library only.

* **Empty** means no entry but ``lost+found`` (which a freshly formatted volume holds) and hidden
  ones (a dot name, which the server ignores too).
* **Atomic per model**, as docs/model-control.md asks of publishing: each model folder is copied
  under a dot name and then renamed, so a server (or a poller) never sees a half-copied model; two
  pods seeding at once each copy their own dot folder, and the second rename, finding the model
  there, drops its copy.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

IGNORED = {"lost+found"}


def is_empty(repository: Path) -> bool:
    """True when ``repository`` holds nothing a server would serve (``lost+found`` and dot names aside)."""
    return not [e for e in os.listdir(repository) if e not in IGNORED and not e.startswith(".")]


def seed(source: Path, repository: Path) -> list[str]:
    """Copy every model folder of ``source`` into ``repository`` if it is empty; the models copied.

    Raises:
        OSError: ``source`` or ``repository`` cannot be read, or a copy fails (the init container fails).
    """
    if not is_empty(repository):
        return []
    copied = []
    for name in sorted(os.listdir(source)):
        if name.startswith(".") or not (source / name).is_dir():
            continue
        staging = repository / f".{name}.seeding-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(source / name, staging)
        try:
            os.rename(staging, repository / name)  # atomic; fails if another pod's copy is there already
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            continue
        copied.append(name)
    return copied


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m service.process.seed SOURCE REPOSITORY", file=sys.stderr)
        return 2
    try:
        copied = seed(Path(args[0]), Path(args[1]))
    except OSError as exc:  # a missing or unreadable folder: one line, not a traceback (a tester's)
        print(f"seed: {exc.filename or args[1]}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"seeded {args[1]} with {', '.join(copied)}" if copied else f"{args[1]} already holds models: left alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The benchmark's images: real photos and CIFAR-10 test images, re-encoded as 640x480 and 4000x3000 JPEGs.

    python -m bench.images --out bench/.work/images

Sources (nothing here is committed; the images are written under a gitignored folder):

* the photos in ``../shared/images`` (``MANIFEST.tsv`` there gives each file's source and
  licence; the licences travel with the copies as ``SOURCES.tsv``);
* the first ``--cifar`` test images of CIFAR-10, one class after another, from
  ``../shared/data/cifar10-jpeg.zip``.

Each image is centre-cropped to 4:3 (``ImageOps.fit``), resized with Lanczos and saved as a
baseline JPEG at quality 90 with 4:2:0 chroma subsampling, as a phone camera writes them.
"""

from __future__ import annotations

import argparse
import csv
import io
import logging
import zipfile
from pathlib import Path

from PIL import Image, ImageOps

log = logging.getLogger(__name__)

SHARED = Path(__file__).resolve().parents[2] / "shared"
if not SHARED.is_dir():  # a worktree under /work/wt/<branch>: shared/ sits beside wt/
    SHARED = Path(__file__).resolve().parents[3] / "shared"
PHOTOS = (
    "exif_orientation/Landscape_1.jpg",
    "exif_orientation/Portrait_1.jpg",
    "skimage/astronaut.png",
    "skimage/chelsea.png",
    "skimage/coffee.png",
)
SIZES = {"640x480": (640, 480), "4000x3000": (4000, 3000)}
QUALITY = 90


def _sources(shared: Path, cifar: int) -> list[tuple[str, Image.Image, str]]:
    """(name, image, licence) of every source image, displayed orientation, RGB."""
    licences = {}
    with (shared / "images" / "MANIFEST.tsv").open() as f:
        for row in csv.DictReader(f, delimiter="\t"):
            licences[row["local_path"]] = (
                f"{row['source_repo']} {row['source_path']} @ {row['commit']}: {row['license']}"
            )
    sources = []
    for rel in PHOTOS:
        with Image.open(shared / "images" / rel) as image:
            photo = ImageOps.exif_transpose(image).convert("RGB")
        sources.append((Path(rel).stem.lower(), photo, licences[rel]))
    with zipfile.ZipFile(shared / "data" / "cifar10-jpeg.zip") as archive:
        for member in _cifar_members(archive, cifar):
            image = Image.open(io.BytesIO(archive.read(member))).convert("RGB")
            sources.append((_cifar_name(member), image, "CIFAR-10 test split (Krizhevsky 2009)"))
    return sources


def _cifar_members(archive: zipfile.ZipFile, count: int) -> list[str]:
    """The first ``count`` test images taking one class after another: airplane 0000, automobile 0000, ..."""
    by_class: dict[str, list[str]] = {}
    for member in sorted(n for n in archive.namelist() if n.startswith("test/") and n.endswith(".jpg")):
        by_class.setdefault(member.split("/")[1], []).append(member)
    return [by_class[c][i] for i in range(count) for c in sorted(by_class)][:count]


def _cifar_name(member: str) -> str:
    return f"cifar-{member.split('/')[1]}-{Path(member).stem}"


def _names(shared: Path, cifar: int) -> list[str]:
    with zipfile.ZipFile(shared / "data" / "cifar10-jpeg.zip") as archive:
        members = _cifar_members(archive, cifar)
    return [Path(rel).stem.lower() for rel in PHOTOS] + [_cifar_name(m) for m in members]


def prepare(out: Path, *, cifar: int = 11, shared: Path = SHARED) -> dict[str, list[Path]]:
    """Write every source image at every size; return the files by size name.

    Existing files are kept (the output is deterministic), so a second call is cheap.

    Returns:
        ``{"640x480": [paths], "4000x3000": [paths]}``, photos first, then CIFAR-10.
    """
    written: dict[str, list[Path]] = {size: [] for size in SIZES}
    sources = None
    for size_name, size in SIZES.items():
        folder = out / size_name
        folder.mkdir(parents=True, exist_ok=True)
        expected = [folder / f"{name}.jpg" for name in _names(shared, cifar)]
        if all(p.is_file() for p in expected):
            written[size_name] = expected
            continue
        sources = sources or _sources(shared, cifar)
        for name, image, _ in sources:
            path = folder / f"{name}.jpg"
            ImageOps.fit(image, size, Image.Resampling.LANCZOS).save(path, quality=QUALITY, subsampling="4:2:0")
            written[size_name].append(path)
        with (folder / "SOURCES.tsv").open("w") as f:
            f.write("file\tsource and licence\n")
            f.writelines(f"{name}.jpg\t{licence}\n" for name, _, licence in sources)
        log.info("wrote %d images at %s to %s", len(sources), size_name, folder)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.images", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench/.work/images"))
    parser.add_argument("--cifar", type=int, default=11, help="how many CIFAR-10 test images (default 11)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for size, paths in prepare(args.out, cifar=args.cifar).items():
        print(f"{size}: {len(paths)} images, {sum(p.stat().st_size for p in paths) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()

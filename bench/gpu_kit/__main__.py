"""The offline GPU kit's commands (docs/gpu.md gives the whole procedure).

Here, with PyPI:

    python -m bench.gpu_kit lock --target cp312-gpu     # re-resolve; rewrites bench/gpu_kit/lock-cp312-gpu.txt
    python -m bench.gpu_kit build --target cp312-gpu    # download (hash-checked), pack parts, check offline
    python -m bench.gpu_kit check --target cp312-gpu    # the offline resolution check alone

There, on the GPU machine (bench/gpu_kit/run.sh calls these):

    python3 -m bench.gpu_kit collect --parts .gpu-kit/cp312-gpu/parts --home /tmp/gpu-kit
    PYTHONPATH=/tmp/gpu-kit/site-ort:/tmp/gpu-kit/site python3 -m bench.gpu_kit verify --device cuda --home /tmp/gpu-kit
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.gpu_kit import collect, kit

KIT_DIR = kit.ROOT / ".gpu-kit"  # git-ignored


def _images(size: str = "640x480") -> list[Path]:
    """The benchmark's JPEGs at ``size`` (bench.images writes them from ../shared, which never travels)."""
    from bench import images

    return images.prepare(kit.ROOT / "bench" / ".work" / "images")[size]


def build(
    target: kit.Target, out: Path, *, part_bytes: int = kit.PART_BYTES, images: Sequence[Path] | None = None
) -> dict:
    """Download the target's wheels into ``out/wheels``, pack the parts into ``out/parts``, check offline.

    Args:
        images: the JPEGs the kit carries for bench.gpu (None: bench.images' 640x480 set).

    Returns:
        The parts manifest, with ``"check"``: pip's answer to the offline resolution.
    """
    wheels = out / "wheels"
    pins = kit.download(target, wheels)
    images = _images() if images is None else images
    manifest = kit.pack(target, wheels, out, images=images, part_bytes=part_bytes)
    manifest["check"] = kit.check_offline(target, wheels)
    travelling = [p for p in pins if p.travels]
    print(
        f"{target.name}: {len(pins)} wheels locked, {len(travelling)} travel "
        f"({sum((wheels / p.filename).stat().st_size for p in travelling) / 2**20:.1f} MiB), "
        f"{len(images)} images; stream {manifest['stream_bytes'] / 2**20:.1f} MiB in {len(manifest['parts'])} parts"
    )
    for part in manifest["parts"]:
        print(f"  {out / 'parts' / part['name'] / part['file']}  {part['size']:>10d} bytes  sha256 {part['sha256']}")
    largest = max(part["size"] for part in manifest["parts"])
    print(f"largest part {largest / 2**20:.2f} MiB (limit {part_bytes / 2**20:.0f} MiB)")
    print("offline resolution (pip install --dry-run --no-index --require-hashes):")
    print("  " + manifest["check"].strip().splitlines()[-1])
    return manifest


def verify(device: str, home: Path, report_path: Path | None = None) -> dict:
    """Check that the kit's ONNX Runtime is the one imported and that it gets the provider ``device`` asks for.

    The report (which onnxruntime, from where, which providers) is printed, and written to
    ``report_path`` when given, before any check can fail.

    Raises:
        SystemExit: onnxruntime is imported from elsewhere, or CUDA is missing where asked for.
    """
    import onnxruntime as ort

    sites = [str(p.resolve()) for p in collect.site_dirs(home)]
    where = str(Path(ort.__file__).resolve())
    report = {"onnxruntime": ort.__version__, "file": where, "sites": sites}
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # the CUDA and cuDNN libraries of the machine's nvidia-* packages
    report["available"] = ort.get_available_providers()
    graph = kit.ROOT / "model_repository" / "vit-digits" / "1" / "model.onnx"
    wanted = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    report["session"] = ort.InferenceSession(str(graph), providers=wanted).get_providers()
    print(json.dumps(report, indent=1))
    if report_path:
        report_path.write_text(json.dumps(report, indent=1) + "\n")
    if device == "cuda" and not (
        "CUDAExecutionProvider" in report["available"] and report["session"][0] == "CUDAExecutionProvider"
    ):
        sys.exit(f"CUDA asked for, but available {report['available']}, session {report['session']}")
    if not any(where.startswith(site) for site in sites):
        sys.exit(f"onnxruntime {ort.__version__} comes from {where}, not from the kit ({sites}): check PYTHONPATH")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_kit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("lock", "build", "check"):
        command = commands.add_parser(name)
        command.add_argument("--target", choices=sorted(kit.TARGETS), default="cp312-gpu")
        command.add_argument("--out", type=Path, help="default .gpu-kit/<target>")
        command.add_argument("--part-mib", type=float, default=kit.PART_BYTES / 2**20)
        command.add_argument("--no-images", action="store_true", help="carry no benchmark images")
    taking = commands.add_parser("collect", help="take in the carried parts; install what is complete")
    taking.add_argument("--parts", type=Path, required=True, help="the carried parts folder")
    taking.add_argument("--home", type=Path, default=Path("/tmp/gpu-kit"))
    verifying = commands.add_parser("verify", help="the kit's onnxruntime is imported and gets the device")
    verifying.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    verifying.add_argument("--home", type=Path, default=Path("/tmp/gpu-kit"))
    verifying.add_argument("--report", type=Path, help="also write the report (JSON) here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")

    try:
        if args.command in ("lock", "build", "check"):
            target = kit.TARGETS[args.target]
            out = args.out or KIT_DIR / target.name
            if args.command == "lock":
                pins = kit.lock(target)
                print(f"wrote {target.lock}: {len(pins)} wheels, {sum(p.travels for p in pins)} travel")
            elif args.command == "build":
                build(target, out, part_bytes=int(args.part_mib * 2**20), images=[] if args.no_images else None)
            else:
                print(kit.check_offline(target, out / "wheels").strip())
        elif args.command == "collect":
            status = collect.collect(args.parts, args.home)
            print("kit: " + json.dumps(status))
            if status["parts"]["missing"]:
                print(f"kit incomplete: carry parts {' '.join(status['parts']['missing'])} next (docs/gpu.md)")
                sys.exit(kit.INCOMPLETE)
        else:
            verify(args.device, args.home, args.report)
    except kit.KitError as exc:
        sys.exit(f"python -m bench.gpu_kit {args.command}: {exc}")


if __name__ == "__main__":
    main()

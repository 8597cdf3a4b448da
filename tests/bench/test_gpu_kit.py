"""The offline GPU kit: the committed lock, parts no larger than the limit, collection one part per call."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest

from bench.gpu_kit import collect, kit

PLATFORM_TAG = re.compile(r"-(?:py2\.py3|py3|cp3\d+)-(?:none|abi3|cp3\d+)-(?P<platforms>[^-]+)\.whl$")


def test_the_cp312_lock_pins_every_wheel_the_gpu_machine_lacks_by_hash() -> None:
    target = kit.TARGETS["cp312-gpu"]
    pins = {pin.name: pin for pin in kit.read_lock(target.lock)}
    header = [line.removeprefix("#   ") for line in target.lock.read_text().splitlines() if line.startswith("#   ")]
    assert header == list(target.requirements)  # the lock was written from pyproject as it is now
    needed = {
        "onnxruntime-gpu", "fastapi", "uvicorn", "starlette", "pydantic", "pydantic-core", "pydantic-settings",
        "python-multipart", "orjson", "httptools", "anyio", "onnxconverter-common",
    }  # fmt: skip
    assert needed <= {name for name, pin in pins.items() if pin.travels}
    assert pins["onnxruntime-gpu"].version == "1.31.1" and "onnxruntime" not in pins
    assert not pins["numpy"].travels and not pins["pillow"].travels  # the machine has them
    for pin in pins.values():
        assert re.fullmatch(r"[0-9a-f]{64}", pin.sha256)
        tags = PLATFORM_TAG.search(pin.filename)
        assert tags, pin.filename
        platforms = tags["platforms"].split(".")
        assert platforms == ["any"] or set(platforms) & set(kit.PLATFORMS), pin.filename
        assert "-cp311-" not in pin.filename and "-cp313-" not in pin.filename


def test_a_lock_line_reads_back_as_the_pin_it_was_written_from() -> None:
    pin = kit.Pin("pydantic-core", "2.50.5", "ab" * 32, "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.whl")
    assert kit.read_lock_text(pin.line()) == [pin]
    assert kit.normalise("PyYAML") == "pyyaml" and kit.normalise("ml_dtypes") == "ml-dtypes"


@pytest.fixture
def fake_kit(tmp_path, monkeypatch) -> tuple[kit.Target, dict]:
    """A target whose lock names four made-up wheels (one of them ONNX Runtime) and one the machine provides."""
    monkeypatch.setattr(kit, "HERE", tmp_path)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    rng = random.Random(0)
    pins = []
    for name, size in [("fastapi", 3000), ("starlette", 9000), ("orjson", 500), ("onnxruntime-gpu", 20000)]:
        filename = f"{name.replace('-', '_')}-1.0-py3-none-any.whl"
        (wheels / filename).write_bytes(rng.randbytes(size))
        pins.append(kit.Pin(name, "1.0", kit.sha256(wheels / filename), filename))
    pins.append(kit.Pin("numpy", "2.0", "0" * 64, "numpy-2.0-cp312-cp312-manylinux_2_28_x86_64.whl"))  # not packed
    target = kit.Target("fake", "3.12", ("fastapi",))
    target.lock.write_text("".join(pin.line() + "\n" for pin in pins))
    image = tmp_path / "a.jpg"
    image.write_bytes(rng.randbytes(700))
    manifest = kit.pack(target, wheels, tmp_path / "out", images=[image], part_bytes=7000)
    return target, manifest


def test_parts_are_no_larger_than_the_limit_and_carry_their_checksums(fake_kit, tmp_path) -> None:
    _, manifest = fake_kit
    parts = tmp_path / "out" / "parts"
    sizes = [p["size"] for p in manifest["parts"]]
    assert sum(sizes) == manifest["stream_bytes"] == sum(f["size"] for f in manifest["files"])
    assert len(sizes) == 5 and sizes[:-1] == [7000] * 4 and 0 < sizes[-1] <= 7000
    for part in manifest["parts"]:
        folder = parts / part["name"]
        assert sorted(p.name for p in folder.iterdir()) == sorted([part["file"], part["file"] + ".sha256", "kit.json"])
        assert kit.sha256(folder / part["file"]) == part["sha256"]
        assert (folder / f"{part['file']}.sha256").read_text() == f"{part['sha256']}  {part['file']}\n"
        assert json.loads((folder / "kit.json").read_text()) == manifest
    order = [f["path"] for f in manifest["files"]]
    assert order[:3] == ["serve.txt", "ort.txt", "images/a.jpg"] and order[-1].startswith("wheels/onnxruntime_gpu")
    assert "numpy" not in " ".join(order)  # provided by the machine: never carried


def test_collect_takes_one_part_per_call_installs_each_group_once_and_skips_what_it_has(
    fake_kit, tmp_path, monkeypatch
) -> None:
    _, manifest = fake_kit
    installs: list[list[str]] = []

    def pip(args, *, offline=False):
        installs.append(list(args))
        Path(args[args.index("--target") + 1]).mkdir(parents=True, exist_ok=True)
        return ""

    monkeypatch.setattr(collect, "pip", pip)
    home, parts = tmp_path / "home", tmp_path / "out" / "parts"
    statuses = []
    for name in ["03", "01", "02", "05", "04"]:  # any order, one per call, as the device tool carries them
        carried = tmp_path / "carried"
        shutil.rmtree(carried, ignore_errors=True)
        shutil.copytree(parts / name, carried / name)
        statuses.append(collect.collect(carried, home))
    assert [s["parts"]["missing"] for s in statuses] == [
        ["01", "02", "04", "05"], ["02", "04", "05"], ["04", "05"], ["04"], [],
    ]  # fmt: skip
    # the serve group (fastapi, orjson, starlette) is whole once parts 01 and 02 are in; ONNX Runtime at the end
    assert [s["installed"] for s in statuses] == [[], [], ["serve"], ["serve"], ["serve", "ort"]]
    assert len(installs) == 2 and all(
        "--no-index" in a and "--require-hashes" in a and "--no-deps" in a for a in installs
    )
    assert installs[0][installs[0].index("-r") + 1].endswith("serve.txt")
    assert (home / "files" / "serve.txt").read_text().splitlines()[0].startswith("fastapi==1.0 --hash=sha256:")
    for entry in manifest["files"]:
        assert kit.sha256(home / "files" / entry["path"]) == entry["sha256"]
    again = collect.collect(tmp_path / "nothing-carried", home)  # a call with no part: nothing to redo
    assert again["parts"]["missing"] == [] and len(installs) == 2


@pytest.mark.usefixtures("fake_kit")
def test_a_damaged_part_is_refused(tmp_path) -> None:
    carried = tmp_path / "carried"
    shutil.copytree(tmp_path / "out" / "parts" / "02", carried / "02")
    damaged = carried / "02" / "kit.part02"
    damaged.write_bytes(b"x" + damaged.read_bytes()[1:])
    with pytest.raises(kit.KitError, match="sha256"):
        collect.collect(carried, tmp_path / "home")

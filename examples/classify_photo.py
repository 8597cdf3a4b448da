"""Classify a photo and draw its attention-rollout heat map, as the README shows them.

    .venv/bin/python examples/classify_photo.py examples/chelsea.png

runs the server in process (the committed model repository, CPU), POSTs the photo to
``/v1/models/<model>/classify`` twice, for JSON and with ``?render=png``, and writes
``<photo>.<model>.json`` and ``<photo>.<model>.png`` beside the photo. ``--url`` sends the
requests to a running server instead (``make serve``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


async def classify(photo: Path, model: str, url: str | None, top_k: int) -> tuple[dict, bytes]:
    """(JSON response, PNG bytes) for ``photo`` from a running server at ``url``, or an in-process one."""
    path = f"/v1/models/{model}/classify"
    files = {"image": (photo.name, photo.read_bytes())}
    if url is not None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            result = await client.post(path, files=files, params={"top_k": top_k})
            picture = await client.post(path, files=files, params={"render": "png"})
    else:
        from service.app import create_app
        from service.settings import Settings

        app = create_app(Settings(model_repository=ROOT / "model_repository", device="cpu"))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://in-process", timeout=60) as client:
                while (await client.get("/readyz")).status_code != 200:
                    await asyncio.sleep(0.05)
                result = await client.post(path, files=files, params={"top_k": top_k})
                picture = await client.post(path, files=files, params={"render": "png"})
    result.raise_for_status()
    picture.raise_for_status()
    return result.json(), picture.content


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("photo", type=Path)
    parser.add_argument("--model", default="vit-cifar10")
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--url", default=None, help="a running server, e.g. http://127.0.0.1:8000")
    args = parser.parse_args(argv)
    body, png = asyncio.run(classify(args.photo, args.model, args.url, args.top_k))
    stem = args.photo.with_suffix("")
    Path(f"{stem}.{args.model}.json").write_text(json.dumps(body) + "\n")
    Path(f"{stem}.{args.model}.png").write_bytes(png)
    print(json.dumps(body))
    print(f"wrote {stem}.{args.model}.json and {stem}.{args.model}.png")


if __name__ == "__main__":
    main()

"""Classify a photo with its attention-rollout heat map, or detect objects with their boxes drawn, as the README shows.

    .venv/bin/python examples/render.py examples/chelsea.png
    .venv/bin/python examples/render.py examples/canvas.png --model detr-digits --route detect

runs the server in process (the committed model repository, CPU), POSTs the image to
``/v1/models/<model>/<route>`` twice, for JSON and with ``?render=png``, and writes
``<image>.<model>.json`` and ``<image>.<model>.png`` beside the image. ``--url`` sends the
requests to a running server instead (``make serve``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


async def render(photo: Path, model: str, route: str, url: str | None, params: dict) -> tuple[dict, bytes]:
    """(JSON response, PNG bytes) for ``photo`` from a running server at ``url``, or an in-process one."""
    path = f"/v1/models/{model}/{route}"
    files = {"image": (photo.name, photo.read_bytes())}
    if url is not None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            result = await client.post(path, files=files, params=params)
            picture = await client.post(path, files=files, params={**params, "render": "png"})
    else:
        from service.core.settings import Settings
        from service.http.app import create_app

        app = create_app(Settings(model_repository=ROOT / "model_repository", device="cpu"))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://in-process", timeout=60) as client:
                while (await client.get("/readyz")).status_code != 200:
                    await asyncio.sleep(0.05)
                result = await client.post(path, files=files, params=params)
                picture = await client.post(path, files=files, params={**params, "render": "png"})
    result.raise_for_status()
    picture.raise_for_status()
    return result.json(), picture.content


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("photo", type=Path)
    parser.add_argument("--model", default="vit-cifar10")
    parser.add_argument("--route", choices=["classify", "detect"], default="classify")
    parser.add_argument("--top-k", type=int, default=3, help="classify: classes returned")
    parser.add_argument("--threshold", type=float, default=0.7, help="detect: lowest score returned")
    parser.add_argument("--url", default=None, help="a running server, e.g. http://127.0.0.1:8000")
    args = parser.parse_args(argv)
    params = {"top_k": args.top_k} if args.route == "classify" else {"threshold": args.threshold}
    body, png = asyncio.run(render(args.photo, args.model, args.route, args.url, params))
    stem = args.photo.with_suffix("")
    Path(f"{stem}.{args.model}.json").write_text(json.dumps(body) + "\n")
    Path(f"{stem}.{args.model}.png").write_bytes(png)
    print(json.dumps(body))
    print(f"wrote {stem}.{args.model}.json and {stem}.{args.model}.png")


if __name__ == "__main__":
    main()

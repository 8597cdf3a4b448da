"""The playground: a page at ``/`` that calls this server's own API from the browser.

Everything it loads is package data under ``service/playground/`` (HTML, CSS, one script and,
when packaged, example images), served from here, so the page works with no network. The page
holds no data of its own: it reads ``/v1/models`` and posts images to the inference routes with
``fetch``, sending the API key the user types (kept in the page's memory only). Its files are
therefore public paths (:data:`PUBLIC_PATHS`): a browser cannot send a Bearer header when it
navigates. ``PATCHSERVE_PLAYGROUND=false`` leaves this router out.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, JSONResponse

ASSETS = Path(__file__).resolve().parents[2] / "playground"
EXAMPLES = ASSETS / "examples"
_MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8", ".js": "text/javascript"}
_IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}
# The page may load only what this server serves (and the images the user picks, as blob: URLs).
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = {"Content-Security-Policy": _CSP, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


def _files(folder: Path, media_types: dict[str, str]) -> dict[str, Path]:
    """The files directly in ``folder`` with a known suffix, by name (an allow-list: no path is joined)."""
    if not folder.is_dir():
        return {}
    return {p.name: p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix.lower() in media_types}


STATIC = {name: path for name, path in _files(ASSETS, _MEDIA_TYPES).items() if name != "index.html"}
EXAMPLE_FILES = _files(EXAMPLES, _IMAGE_TYPES)
PUBLIC_PATHS: tuple[str, ...] = (
    "/",
    "/playground/examples",
    *(f"/playground/{name}" for name in STATIC),
    *(f"/playground/examples/{name}" for name in EXAMPLE_FILES),
)

router = APIRouter(include_in_schema=False)


def _file(path: Path, media_type: str) -> FileResponse:
    return FileResponse(path, media_type=media_type, headers=_HEADERS)


@router.api_route("/", methods=["GET", "HEAD"])
async def page() -> FileResponse:
    """The playground page."""
    return _file(ASSETS / "index.html", _MEDIA_TYPES[".html"])


@router.get("/playground/examples")
async def examples() -> JSONResponse:
    """The packaged example images: ``{"examples": [{"name": ..., "url": ...}]}`` (empty when none)."""
    listed = [{"name": name, "url": f"/playground/examples/{name}"} for name in EXAMPLE_FILES]
    return JSONResponse({"examples": listed}, headers={"Cache-Control": "no-cache"})


@router.get("/playground/examples/{name}")
async def example(name: str) -> FileResponse:
    """One packaged example image.

    Raises:
        HTTPException: no such example (a 404 problem).
    """
    path = EXAMPLE_FILES.get(name)
    if path is None:
        raise HTTPException(404, f"no example image {name!r}; GET /playground/examples lists them")
    return _file(path, _IMAGE_TYPES[path.suffix.lower()])


@router.get("/playground/{name}")
async def asset(name: str) -> FileResponse:
    """The page's stylesheet and script.

    Raises:
        HTTPException: no such file (a 404 problem).
    """
    path = STATIC.get(name)
    if path is None:
        raise HTTPException(404, f"the playground has no file {name!r}")
    return _file(path, _MEDIA_TYPES[path.suffix.lower()])

"""The server's one configuration class, read from ``PATCHSERVE_*`` environment variables.

Only the app factory (:func:`service.http.app.create_app`) and the entry point read it; everything
below them takes plain values, so tests build apps with settings of their own.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

ENV_PREFIX = "PATCHSERVE_"
# The longest request timeout, seconds (a day): a deadline stays a finite, representable time, and
# /v2's model config its microseconds in a uint64 (Triton's default_timeout_microseconds).
MAX_REQUEST_TIMEOUT = 86_400.0
_TOKEN68 = re.compile(r"^[A-Za-z0-9\-._~+/]+=*$")
_ORIGIN = re.compile(r"^https?://[^/\s,]+$")
_SECRET_FIELDS = {"api_keys"}


class Settings(BaseSettings):
    """Server settings. Every field is read from ``PATCHSERVE_<FIELD>`` (upper case).

    Times are in seconds, sizes in bytes or pixels. Batching values are defaults that a
    model's manifest may override (its ``batching`` section).
    """

    # allow_inf_nan: "inf" would pass gt=0 and disable a timeout (or overflow where it is converted).
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True, allow_inf_nan=False)

    model_repository: Path = Field(Path("model_repository"), description="Folder of <name>/<version>/ models.")
    host: str = Field(
        "127.0.0.1",
        min_length=1,
        description="Address to listen on (empty is refused: uvicorn took it as every interface).",
    )
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0 picks a free one).")
    workers: int = Field(1, ge=1, le=64, description="uvicorn worker processes; one per GPU.")
    device: Literal["auto", "cuda", "cpu"] = Field(
        "auto", description="auto: CUDA when the session really gets it, else CPU."
    )

    max_batch_size: int = Field(
        8,
        ge=1,
        le=1024,
        description="Largest batch sent to one model run; unset, the auto-tuner chooses it (8 with the tuner off).",
    )
    max_queue_delay: float = Field(
        0.002, ge=0.0, le=10.0, description="Seconds the oldest queued request may wait for a batch to fill."
    )
    queue_size: int = Field(
        256, ge=1, le=1_000_000, description="Requests a model version may hold queued; more -> 503."
    )
    request_timeout: float = Field(
        30.0,
        gt=0.0,
        le=MAX_REQUEST_TIMEOUT,
        description="Seconds from arrival to a request's deadline (504 if still queued); a request may ask for less.",
    )

    max_body_bytes: int = Field(20 * 1024 * 1024, ge=1024, description="Largest request body accepted (413).")
    max_image_pixels: int = Field(
        40_000_000, ge=64, description="Largest image (width x height, from its header) decoded (413)."
    )
    max_images_per_request: int = Field(32, ge=1, le=1024, description="Most images in one request (400).")
    scaled_decode: bool = Field(
        True,
        description="Decode a JPEG (libjpeg's DCT scaling, 1/2 to 1/8) or a WebP (libwebp's scaler) straight to "
        "the smallest size still at least the model's input: 0.12-0.3x the CPU of a full-size decode of a large "
        "photo, but not the same pixels as a full-size decode then resize, so scores differ (up to 0.2 in a "
        "probability on the 32x32 vit-cifar10; docs/api.md). False: always decode at full size, as the Hugging "
        "Face pipelines do.",
    )
    # Decoding budgets (service/imaging/pixel_budget.py): pixels as decoded (a JPEG after its DCT downscale).
    max_decoding_pixels: int = Field(
        48_000_000,
        ge=64,
        description="Decoded pixels one worker holds at once, all requests together; an image waits for room "
        "until its deadline (504); one over it alone: 413. Bounds a worker's decoding memory.",
    )
    max_request_pixels: int = Field(
        160_000_000,
        ge=64,
        description="Decoded pixels of one request's images together; the images past it get 413 entries. "
        "Bounds one request's decoding CPU.",
    )
    # Structure limits of the JPEG, PNG, GIF and TIFF pre-scan (service/imaging/prescan.py), checked before
    # Pillow parses a byte.
    max_jpeg_scans: int = Field(64, ge=1, description="Scans (SOS markers) in a JPEG (413); encoders write ~10.")
    max_jpeg_scan_pixels: int = Field(
        1_000_000_000, ge=1, description="Scans x width x height of a JPEG of 2+ scans, the work of decoding it (413)."
    )
    max_jpeg_segments: int = Field(1024, ge=16, description="Marker segments in a JPEG (413); cameras write ~20.")
    max_jpeg_fill_bytes: int = Field(
        65536, ge=0, description="0xFF fill and junk bytes between a JPEG's segments (413); encoders write none."
    )
    max_png_chunks: int = Field(10_000, ge=3, description="Chunks in a PNG, IDAT included (413).")
    max_gif_blocks: int = Field(
        20_000, ge=1, description="Extension blocks and sub-blocks before a GIF's first image (413)."
    )
    max_tiff_strips: int = Field(
        16_384, ge=1, description="Strips or tiles of a TIFF (413); libtiff writes one per 8 KiB, 2,560 for 20 MiB."
    )
    max_tiff_tags: int = Field(1024, ge=16, description="Entries of one TIFF IFD (413); encoders write ~10-60.")
    max_tiff_values: int = Field(
        1 << 20, ge=1024, description="Numbers in a TIFF's tag values, a rational counting 16 (413)."
    )
    max_bmp_rle_pixels: int = Field(
        1 << 20, ge=4096, description="Pixels of a run-length-encoded BMP, decoded by Pillow in Python (413)."
    )
    max_image_metadata_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="Metadata bytes of one image (ICC profile, EXIF, XMP, text; PNG's inflated) (413).",
    )
    max_multipart_parts: int = Field(64, ge=1, description="Most parts, of any name, in one multipart body (400).")

    intra_op_threads: int = Field(
        0,
        ge=0,
        le=1024,
        description="ONNX Runtime intra-op threads per session (0: the model's share of the usable cores).",
    )
    inter_op_threads: int = Field(0, ge=0, le=1024, description="ONNX Runtime inter-op threads (0: ORT's default).")
    decode_threads: int = Field(
        0, ge=0, le=1024, description="Threads decoding images (0: the worker's share of the usable cores)."
    )
    intra_op_spinning: bool | None = Field(
        None,
        description="Let ONNX Runtime's threads busy-wait while a run is in progress (unset: on when the computing "
        "threads fit the usable cores).",
    )
    instances: int | None = Field(
        None,
        ge=1,
        le=16,
        description="ONNX Runtime sessions per model version, fed by one batcher (unset: 2 on the CPU with 2 "
        "cores or more, else 1; 2 on a GPU, or the auto-tuner's choice).",
    )
    wide_session: bool | None = Field(
        None,
        description="On the CPU, one more session per model version with all of its cores, for a request that "
        "arrives while every instance is idle (unset: on when the instances each have fewer threads).",
    )
    auto_tune: bool = Field(
        True, description="At warm-up, measure each model's throughput by batch size and instances, and pick them."
    )
    tune_seconds: float = Field(10.0, gt=0.0, le=600.0, description="Most seconds the auto-tuner measures one model.")
    tune_point_seconds: float = Field(
        0.2, gt=0.0, le=10.0, description="Seconds the auto-tuner measures each (instances, batch size) point."
    )
    tune_rounds: int = Field(
        3, ge=1, le=20, description="Interleaved rounds over the tuner's grid; each point is its median over them."
    )
    tune_max_batch_size: int = Field(
        0, ge=0, le=1024, description="Largest batch size the auto-tuner tries (0: 16 on the CPU, 64 on a GPU)."
    )
    tune_max_instances: int = Field(2, ge=1, le=16, description="Most instances the auto-tuner tries.")
    tune_busy_cores: float = Field(
        0.25, gt=0.0, description="Cores other processes may take while the tuner measures; more: not cached."
    )
    tune_cache: Path | None = Field(
        None,
        description="Folder of the auto-tuner's results, by model file and machine (unset: the user's cache folder).",
    )
    repository_poll_seconds: float = Field(
        0.0,
        ge=0.0,
        le=86400.0,
        # 0, or 0.1 s and up (_poll_or_not): a scan each millisecond took a third of an idle core (a tester's)
        description="Seconds between scans of the model repository for new, changed or removed versions "
        "(0: no polling; the repository API still loads and unloads). See docs/model-control.md.",
    )
    model_control_api: bool = Field(
        False,
        description="Serve POST /v2/repository/models/{name}/load and .../unload (behind the API keys when "
        "they are set): Triton's --model-control-mode=explicit; false (Triton's default, none): they answer 403.",
    )
    io_binding: bool = Field(False, description="Run through an ONNX Runtime IO binding (batch bound on the device).")
    cuda_device_id: int = Field(0, ge=0, description="The GPU the CUDA execution provider runs on.")
    cudnn_conv_algo_search: Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"] = Field(
        "EXHAUSTIVE", description="cuDNN convolution algorithm search (HEURISTIC for models fed many image sizes)."
    )
    cuda_mem_limit: int = Field(0, ge=0, description="Bytes the CUDA memory arena may hold per session (0: no limit).")

    backlog: int = Field(2048, ge=1, le=65535, description="Connections the listening socket queues before refusing.")

    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated bearer tokens; empty: no authentication.", repr=False
    )
    auth_public_paths: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["/healthz", "/readyz", "/metrics", "/v2/health/live", "/v2/health/ready"],
        description="Comma-separated paths served without an API key when api_keys is set (probes, scraping).",
    )
    cors_allow_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated origins browsers may call from ('*': any); empty: no CORS headers at all.",
    )
    playground: bool = Field(
        True, description="Serve the playground page at / (its files need no API key); false: no page."
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = Field(
        "text", description="text: one human-readable line per record; json: one JSON object per line."
    )

    # Operation: admission, drain, connections (service/http/middleware/admission.py, service/process/serve.py).
    max_in_flight: int = Field(
        128,
        ge=1,
        le=1_000_000,
        description="Requests one worker holds at once; more -> 503 + Retry-After before they run.",
    )
    max_buffered_bytes: int = Field(
        512 * 1024 * 1024,
        ge=1024,
        description="Request body bytes one worker holds at once (declared, or received); a request that would "
        "pass it gets 503 + Retry-After before its body is kept (one body alone is always taken).",
    )
    body_timeout: float = Field(60.0, gt=0.0, description="Seconds to receive a whole request body (408).")
    drain_delay: float = Field(  # bounded: 1e12 kept a SIGTERMed server draining for ever (a tester's)
        5.0,
        ge=0.0,
        le=3600.0,
        description="Seconds to keep accepting after SIGTERM, with /readyz at 503, before closing.",
    )
    graceful_shutdown_timeout: int = Field(
        30, ge=1, le=86400, description="Seconds accepted requests get to finish once the server stops accepting."
    )
    keep_alive_timeout: int = Field(
        75, ge=1, description="Seconds an idle keep-alive connection stays open (above proxies' 60 s)."
    )
    send_timeout: float = Field(
        30.0,
        gt=0.0,
        description="Seconds a response may sit unsent because the client does not read it; then the "
        "connection is aborted and its buffer freed.",
    )
    header_timeout: float = Field(
        30.0,
        gt=0.0,
        description="Seconds a request's line and headers may take to arrive after its first byte; then 408 "
        "and the connection closes (nginx: client_header_timeout).",
    )
    max_header_bytes: int = Field(
        65536,
        ge=1024,
        description="Bytes a request's line and headers may take; more is 431 and the connection closes "
        "(nginx: large_client_header_buffers). A pipelined request that begins in the read where the one "
        "before it ends may pass it by that read.",
    )

    @field_validator("api_keys", "auth_public_paths", "cors_allow_origins", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value

    @field_validator("api_keys", "cors_allow_origins", mode="before")
    @classmethod
    def _some_key_when_set(cls, value: object, info: ValidationInfo) -> object:
        # before _split_keys (validators of one mode run last-defined first): ",", " , " or "  " set
        # on purpose but holding no key (origin) would turn authentication (CORS) off without a word; "" is "none"
        if isinstance(value, str) and value and not value.replace(",", "").strip():  # (the value is a secret)
            if info.field_name == "api_keys":
                raise ValueError("it holds no key (only commas and spaces); leave it empty for no authentication")
            raise ValueError("it holds no origin (only commas and spaces); leave it empty for no CORS")
        return value

    @field_validator("api_keys")
    @classmethod
    def _keys_are_tokens(cls, keys: list[str]) -> list[str]:
        if not all(_TOKEN68.match(key) for key in keys):
            raise ValueError("each key must be letters, digits and -._~+/ (RFC 7235 token68): openssl rand -hex 32")
        return keys

    @field_validator("model_repository", mode="before")
    @classmethod
    def _a_folder_named(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():  # Path("") is ".": the working folder, read as models
            raise ValueError("it is empty; name the repository folder (default: model_repository)")
        return value

    @field_validator("repository_poll_seconds")
    @classmethod
    def _poll_or_not(cls, seconds: float) -> float:
        if 0 < seconds < 0.1:
            raise ValueError("0 (no polling) or at least 0.1: each scan reads the whole repository's folders")
        return seconds

    @field_validator("auth_public_paths")
    @classmethod
    def _paths_are_absolute(cls, paths: list[str]) -> list[str]:
        if not all(path.startswith("/") for path in paths):
            raise ValueError("each path must start with '/', e.g. /healthz")
        return paths

    @field_validator("cors_allow_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        if not all(origin == "*" or _ORIGIN.match(origin) for origin in origins):
            raise ValueError("each origin must be '*' or scheme://host[:port] with no path, e.g. https://app.example")
        return origins


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """The ``PATCHSERVE_*`` variables in ``environ`` that name no setting (a typo is otherwise
    silently ignored), each with the closest setting's name when one is close.

    Returns:
        One line per unknown variable, e.g. ``"PATCHSERVE_MAX_BATCH: not a setting, ignored (did you mean
        PATCHSERVE_MAX_BATCH_SIZE?)"``; empty when every variable is a setting.
    """
    known = [name.upper() for name in Settings.model_fields]
    lines = []
    for variable in sorted(environ):
        name = variable.upper()
        if name.startswith(ENV_PREFIX) and name.removeprefix(ENV_PREFIX) not in known:
            # compared without the prefix, which every name shares and which would make all look close
            close = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), known, n=1)
            hint = f" (did you mean {ENV_PREFIX}{close[0]}?)" if close else ""
            lines.append(f"{variable}: not a setting, ignored{hint}")
    return lines


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment (and ``overrides``).

    Raises:
        SystemExit: status 2 when a value is invalid, after printing to stderr each offending
            ``PATCHSERVE_*`` variable and why, so a bad deployment stops at start-up, not at the first request.
    """
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"])
            got = "<hidden>" if field.split(".")[0] in _SECRET_FIELDS else repr(error.get("input"))
            lines.append(f"{ENV_PREFIX}{field.upper()}: {error['msg']} (got {got})")
        print("patchserve: invalid settings:\n  " + "\n  ".join(lines), file=sys.stderr)
        raise SystemExit(2) from None

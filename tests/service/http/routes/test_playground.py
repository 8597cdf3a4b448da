"""The playground page at ``/`` and the offline API docs: served, public, switchable, self-contained.

The browser test drives the page in headless Chromium (Debian's ``chromium`` and
``chromium-driver``; Selenium is pointed at the system chromedriver, so its driver manager never
downloads one) against a real server, compares what the page drew with the JSON API's answer,
and reads the browser's network log to prove that the page and ``/docs`` load nothing from any
host but the server. It saves the screenshot ``docs/playground.md`` shows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import ROOT, require_tool, running_app, server_process

EXAMPLES = ROOT / "examples"
# The docs' screenshots are retaken with UPDATE_SCREENSHOTS=1 (the timings in them change every
# run, so a plain run leaves the committed ones alone and saves its own under pytest's tmp_path).
DOCS_SCREENSHOTS = ROOT / "docs" / "playground"
_URL = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")


@pytest.mark.anyio
async def test_the_page_and_its_files_are_served_with_a_policy_that_allows_only_this_server() -> None:
    async with running_app() as client:
        page = await client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert "connect-src 'self'" in page.headers["content-security-policy"]
        loaded = _URL.findall(page.text)
        assert set(loaded) >= {"/playground/playground.css", "/playground/playground.js"}
        for url in loaded:  # every file the page names is this server's, or a data: URL
            assert url.startswith(("/", "data:")), url
            if url.startswith("/playground/"):
                assert (await client.get(url)).status_code == 200, url
        examples = (await client.get("/playground/examples")).json()["examples"]
        assert {e["name"] for e in examples} == {"chelsea.png", "canvas.png"}
        chelsea = await client.get("/playground/examples/chelsea.png")
        assert chelsea.content == (EXAMPLES / "chelsea.png").read_bytes()
        missing = await client.get("/playground/examples/../app.py")
        assert missing.status_code == 404
        assert (await client.get("/playground/nothing.js")).status_code == 404


@pytest.mark.anyio
async def test_the_page_and_the_docs_assets_are_public_when_keys_are_set_and_the_api_is_not() -> None:
    async with running_app(api_keys=["s3cret"]) as client:
        for path in ("/", "/playground/playground.js", "/playground/examples", "/playground/examples/canvas.png"):
            assert (await client.get(path)).status_code == 200, path
        assert (await client.get("/v1/models")).status_code == 401
        assert (await client.get("/docs")).status_code == 401  # the docs stay behind the key unless made public
        for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png"):
            assert (await client.get(f"/docs/static/{asset}")).status_code == 200, asset  # package files, no data
        keyed = await client.get("/v1/models", headers={"Authorization": "Bearer s3cret"})
        assert {m["name"] for m in keyed.json()["models"]} >= {"vit-cifar10", "detr-digits"}


@pytest.mark.anyio
async def test_the_playground_can_be_switched_off() -> None:
    async with running_app(playground=False) as client:
        response = await client.get("/")
        assert response.status_code == 404
        assert response.headers["content-type"] == "application/problem+json"
        assert (await client.get("/playground/playground.js")).status_code == 404


@pytest.mark.anyio
async def test_docs_and_redoc_name_only_files_this_server_serves() -> None:
    async with running_app() as client:
        for page in ("/docs", "/redoc"):
            html = (await client.get(page)).text
            assert "fonts.googleapis.com" not in html and "cdn.jsdelivr.net" not in html
            urls = _URL.findall(html) + re.findall(r"""url:\s*'([^']+)'""", html)
            assert urls, page
            for url in urls:
                assert url.startswith("/"), (page, url)
                response = await client.get(url)
                assert response.status_code == 200 and len(response.content) > 100, (page, url)
        assert '"validatorUrl": null' in (await client.get("/docs")).text  # no badge from validator.swagger.io


# The browser.


def _chrome(user_data_dir: str):
    """Headless Chromium through the system chromedriver, with the performance (network) log on."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = require_tool("chromium", "apt-get install chromium chromium-driver; make tools does")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--disable-extensions",
        "--no-first-run",
        "--window-size=1280,900",
        f"--user-data-dir={user_data_dir}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver_path = require_tool("chromedriver", "apt-get install chromium-driver; make tools does")
    return webdriver.Chrome(service=Service(executable_path=driver_path), options=options)


@pytest.fixture
def browser() -> Iterator[object]:
    try:
        import selenium  # noqa: F401
    except ImportError:
        message = "selenium is not installed (the dev extra installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    profile = tempfile.mkdtemp(prefix="patchserve-chromium-")
    driver = _chrome(profile)
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _requested_urls(driver) -> list[str]:
    """Every URL the browser asked for since the last call (the DevTools Network events)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def _assert_only_from(urls: list[str], base: str, expected: set[str]) -> None:
    """Every network request (http, https, ws, wss) went to ``base``, and ``expected`` paths were among them.

    ``data:`` and ``blob:`` URLs are the page's own; ``chrome://`` ones are the browser's (its
    new-tab page), never network.
    """
    server = urlsplit(base).netloc
    network = [u for u in urls if urlsplit(u).scheme in ("http", "https", "ws", "wss")]
    foreign = [u for u in network if urlsplit(u).netloc != server]
    assert not foreign, f"loaded from elsewhere: {foreign}"
    assert expected <= {urlsplit(u).path for u in network}, network


def _wait_for_answer(driver, answered: str, timeout: float = 60, expect: str = "done") -> None:
    """Wait until the page shows its answer for ``answered`` (``model/verb:image``), ``done`` or ``error``."""
    from selenium.webdriver.support.ui import WebDriverWait

    def settled(d) -> bool:
        body = d.find_element("tag name", "body")
        return body.get_attribute("data-answered") == answered and body.get_attribute("data-status") in (
            "done",
            "error",
        )

    WebDriverWait(driver, timeout).until(settled)
    status = driver.find_element("tag name", "body").get_attribute("data-status")
    assert status == expect, f"the page shows: {driver.find_element('id', 'problem').text!r}"


def _choose_model(driver, name: str) -> None:
    from selenium.webdriver.support.ui import Select, WebDriverWait

    WebDriverWait(driver, 60).until(lambda d: d.find_element("id", "model").is_enabled())
    Select(driver.find_element("id", "model")).select_by_value(name)


def _drawn_boxes(driver) -> int:
    return len(driver.find_elements("css selector", "#overlay g.box"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_playground_in_a_browser_shows_what_the_api_answers(browser, tmp_path: Path) -> None:
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver = browser
    screenshots = DOCS_SCREENSHOTS if os.environ.get("UPDATE_SCREENSHOTS") == "1" else tmp_path
    key = "s3cret-key"
    # Keys on, and the docs made public as docs/api.md says (their assets are public already).
    public = "/healthz,/readyz,/metrics,/docs,/redoc,/openapi.json"
    env = {"PATCHSERVE_API_KEYS": key, "PATCHSERVE_AUTH_PUBLIC_PATHS": public}
    with server_process(env=env) as (url, _), tempfile.TemporaryDirectory() as scratch:
        api = httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {key}"})
        chelsea, canvas = EXAMPLES / "chelsea.png", EXAMPLES / "canvas.png"

        _requested_urls(driver)  # drop what the browser loaded before (its own new-tab page)
        driver.get(url + "/")
        # Keys are set: the page loads (its files are public), /v1/models answers 401, shown as its problem.
        WebDriverWait(driver, 60).until(lambda d: d.find_element("id", "problem").is_displayed())
        assert driver.find_element("id", "problem-title").text == "Unauthorized"
        assert "API key" in driver.find_element("id", "problem-detail").text
        driver.find_element("id", "key").send_keys(key, Keys.TAB)  # the change event: models load with it
        _choose_model(driver, "vit-cifar10")
        assert not driver.find_element("id", "problem").is_displayed()
        driver.find_element("id", "file").send_keys(str(chelsea))
        _wait_for_answer(driver, "vit-cifar10/classify:chelsea.png")
        expected = api.post("/v1/models/vit-cifar10/classify", files={"image": chelsea.read_bytes()}).json()
        shown = [e.text for e in driver.find_elements("css selector", "#predictions .prediction .label")]
        assert shown == [p["label"] for p in expected["predictions"]]
        assert len(shown) == 5  # the default top_k
        assert driver.find_element("id", "heatmap-figure").is_displayed()  # vit-cifar10 exports attention maps
        assert driver.execute_script("return document.getElementById('heatmap').naturalWidth") > 0
        segments = driver.find_elements("css selector", "#timing-bar span")
        assert {s.get_attribute("class") for s in segments} >= {"decode", "queue", "compute"}
        # What vit-cifar10 serves comes from /v1/models: version 2 (DeiT) embeds too, so the page offers
        # a choice, classify first (the answer above is classify's).
        versions = api.get("/v1/models/vit-cifar10").json()["versions"]
        serves = {verb for version in versions for verb in version["serves"]}
        assert driver.find_element("id", "verb-field").is_displayed() == (len(serves) > 1)
        assert Select(driver.find_element("id", "verb")).first_selected_option.get_attribute("value") == "classify"
        screenshots.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(screenshots / "classify.png"))

        _choose_model(driver, "detr-digits")
        assert not driver.find_element("id", "verb-field").is_displayed()  # one route: no choice shown
        driver.find_element("id", "file").send_keys(str(canvas))
        _wait_for_answer(driver, "detr-digits/detect:canvas.png")

        def api_detections(threshold: float) -> list[dict]:
            answer = api.post(
                "/v1/models/detr-digits/detect", params={"threshold": threshold}, files={"image": canvas.read_bytes()}
            )
            return answer.json()["detections"]

        at_half = api_detections(0.5)
        assert at_half, "the example canvas has digits the detector finds"
        assert _drawn_boxes(driver) == len(at_half)
        assert not driver.find_element("id", "predictions").is_displayed()  # the classifier's answer is gone
        drawn_labels = sorted(
            g.get_attribute("data-label") for g in driver.find_elements("css selector", "#overlay g.box")
        )
        assert drawn_labels == sorted(d["label"] for d in at_half)

        # Raise the threshold just past the weakest box shown: the slider's arrow keys step 0.01.
        target = round(min(d["score"] for d in at_half) + 0.005, 2)
        target = min(max(target, 0.51), 1.0)
        slider = driver.find_element("id", "threshold")
        for _ in range(round((target - 0.5) / 0.01)):
            slider.send_keys(Keys.ARROW_RIGHT)
        value = float(slider.get_attribute("value"))
        assert value == pytest.approx(target)
        expected_count = len([d for d in api_detections(0.05) if d["score"] >= value])
        assert _drawn_boxes(driver) == expected_count
        assert expected_count < len(at_half)  # the boxes changed, without another request

        for _ in range(round((target - 0.5) / 0.01)):  # back to 0.5 for the picture
            slider.send_keys(Keys.ARROW_LEFT)
        assert _drawn_boxes(driver) == len(at_half)
        assert driver.save_screenshot(str(screenshots / "detect.png"))
        page_files = {"/", "/playground/playground.js", "/playground/playground.css", "/v1/models"}
        _assert_only_from(_requested_urls(driver), url, page_files | {"/v1/models/detr-digits/detect"})

        # A file that is not an image: the problem's title and detail, as the server wrote them.
        junk = Path(scratch) / "notes.png"
        junk.write_text("not an image")
        driver.find_element("id", "file").send_keys(str(junk))
        _wait_for_answer(driver, "detr-digits/detect:notes.png", expect="error")
        problem = api.post("/v1/models/detr-digits/detect", files={"image": junk.read_bytes()}).json()
        assert driver.find_element("id", "problem-title").text == problem["title"] == "Not a decodable image"
        assert driver.find_element("id", "problem-detail").text == problem["detail"]
        assert _drawn_boxes(driver) == 0

        # A packaged example, chosen from the page's list (fetched without the key: a public path).
        Select(driver.find_element("id", "example")).select_by_visible_text("canvas.png")
        _wait_for_answer(driver, "detr-digits/detect:canvas.png")
        assert _drawn_boxes(driver) == len(at_half)

        # What a model can do comes from /v1/models (`serves`): vit-digits classifies and embeds,
        # so the page offers both, and the embedding is shown as its first values.
        digit = EXAMPLES / "digit-7.png"
        _choose_model(driver, "vit-digits")
        assert driver.find_element("id", "verb-field").is_displayed()
        verbs = [o.get_attribute("value") for o in Select(driver.find_element("id", "verb")).options]
        assert verbs == api.get("/v1/models/vit-digits").json()["versions"][-1]["serves"] == ["classify", "embed"]
        Select(driver.find_element("id", "verb")).select_by_value("embed")
        driver.find_element("id", "file").send_keys(str(digit))
        _wait_for_answer(driver, "vit-digits/embed:digit-7.png")
        vector = api.post("/v1/models/vit-digits/embed", files={"image": digit.read_bytes()}).json()["embedding"]
        summary = driver.find_element("id", "vector-summary").text
        assert summary.startswith(f"embedding: {len(vector)} values, L2 norm 1.000"), summary
        shown = [float(x) for x in driver.find_element("id", "vector-values").text.split(", ")]
        assert shown == pytest.approx(vector[: len(shown)], abs=1e-4) and len(shown) == 8

        driver.get(url + "/docs")
        WebDriverWait(driver, 60).until(lambda d: d.find_elements("css selector", ".opblock"))
        driver.get(url + "/redoc")
        WebDriverWait(driver, 60).until(lambda d: d.find_elements("css selector", "[data-section-id]"))
        docs_files = {
            "/docs",
            "/redoc",
            "/openapi.json",
            "/docs/static/swagger-ui-bundle.js",
            "/docs/static/redoc.standalone.js",
        }
        _assert_only_from(_requested_urls(driver), url, docs_files)


def test_examples_are_the_committed_ones() -> None:
    packaged = Path(ROOT / "service" / "playground" / "examples")
    for name in ("chelsea.png", "canvas.png"):
        assert (packaged / name).read_bytes() == (EXAMPLES / name).read_bytes(), name

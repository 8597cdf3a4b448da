"""Model control in process: version policies, the repository API, swaps, retirements, refusals.

Each test serves a copy of vit-digits in a temporary folder and publishes further versions into
it (tests/service/model_versions.py). Conditions are waited for with generous deadlines, never
slept on; a version's requests are held in flight by a session whose ``run`` waits for an event.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import threading
from pathlib import Path

import httpx
import pytest

from service.runtime.version_policy import (
    DEFAULT_POLICY,
    All,
    ConfigError,
    Latest,
    Specific,
    VersionPolicy,
    parse_config,
)
from tests.conftest import MODEL_REPOSITORY, ROOT, make_settings, running_app
from tests.service.helpers import sample
from tests.service.model_versions import Reference, publish

pytestmark = pytest.mark.anyio
DIGIT_7 = ROOT / "examples" / "digit-7.png"
CLASSIFY = "/v1/models/vit-digits/classify"
LOAD, UNLOAD = (f"/v2/repository/models/vit-digits/{verb}" for verb in ("load", "unload"))
INDEX = "/v2/repository/index"
GZIP = {"Content-Encoding": "gzip"}


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    shutil.copytree(MODEL_REPOSITORY / "vit-digits", tmp_path / "vit-digits")
    return tmp_path


async def until(condition, what: str, seconds: float = 60.0) -> None:
    """Wait for ``condition()`` (checked every 10 ms) at most ``seconds``; fail naming ``what``."""
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"timed out waiting for {what}")


def control(client):
    return client.app.state.server.control


async def classify(client, version: str | None = None):
    params = {"version": version} if version else {}
    return await client.post(CLASSIFY, params=params, files={"image": DIGIT_7.read_bytes()})


def test_version_policies_select_as_triton_does() -> None:
    assert DEFAULT_POLICY.select([3, 1, 2]) == {3}
    assert VersionPolicy(latest=Latest(num_versions=2)).select([1, 2, 3]) == {2, 3}
    assert VersionPolicy(all=All()).select([1, 3]) == {1, 3}
    assert VersionPolicy(specific=Specific(versions=[1, 4])).select([1, 2, 3]) == {1}
    assert parse_config('{"version_policy": {"all": {}}, "max_batch_size": 8}', "x").version_policy.all is not None
    with pytest.raises(ConfigError, match="exactly one"):
        parse_config('{"version_policy": {"all": {}, "latest": {"num_versions": 1}}}', "config.json")
    with pytest.raises(ConfigError, match="num_versions"):
        parse_config('{"version_policy": {"latest": {"num_versions": 0}}}', "config.json")


def test_the_thread_plan_shares_the_cores_among_the_versions_the_policies_serve(repository: Path) -> None:
    # Found by a reviewer: every version folder took a share, so keeping old versions on disk (as
    # Triton's users do) left cores idle and turned the wide session and spinning off.
    from service.http.app import startup_versions, thread_plan

    for version in (2, 3):
        publish(repository, "vit-digits", version, kind="copy")
    settings = make_settings(model_repository=repository, instances=None)
    assert [v for _, v, _ in startup_versions(settings)] == [3]  # the default policy: the latest version only
    assert "shared by" not in thread_plan(settings).reason  # one version: every core is its own
    (repository / "vit-digits" / "config.json").write_text('{"version_policy": {"all": {}}}')
    assert [v for _, v, _ in startup_versions(settings)] == [1, 2, 3]
    assert "shared by 3 model versions" in thread_plan(settings).reason


def test_a_broken_version_no_policy_selects_does_not_stop_the_start(repository: Path) -> None:
    # Triton loads only what the policy selects; an old version with a bad manifest stopped the start.
    from service.core.errors import RepositoryError
    from service.http.app import validate_repository

    publish(repository, "vit-digits", 2, kind="bad-manifest")
    publish(repository, "vit-digits", 3, kind="copy")
    validate_repository(make_settings(model_repository=repository))  # serves 3 only: starts
    (repository / "vit-digits" / "config.json").write_text('{"version_policy": {"specific": {"versions": [2]}}}')
    with pytest.raises(RepositoryError, match=r"vit-digits/2/model\.json"):
        validate_repository(make_settings(model_repository=repository))


async def test_load_api_swaps_in_a_new_version_and_retires_the_old(repository: Path) -> None:
    reference = Reference(repository, "vit-digits")
    async with running_app(make_settings(model_control_api=True, model_repository=repository)) as client:
        first = await classify(client)
        assert first.json()["version"] == "1" and reference.matches(1, DIGIT_7, first.json())
        publish(repository, "vit-digits", 2)
        assert (await classify(client)).json()["version"] == "1"  # no polling: nothing changes by itself
        before = (await client.get("/metrics")).text  # the counters are the process's, shared by every test
        assert (await client.post(LOAD)).status_code == 200
        second = await classify(client)
        assert second.json()["version"] == "2" and reference.matches(2, DIGIT_7, second.json())
        assert second.json()["predictions"][0]["label"] == "2"  # version 2 reverses the classes: 7 -> 2
        await control(client).until_retired()
        index = (await client.post(INDEX)).json()
        assert index == [  # Triton keeps a version its policy dropped in the index, unloaded
            {"name": "vit-digits", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
            {"name": "vit-digits", "version": "2", "state": "READY", "reason": ""},
        ]
        assert (await client.post(INDEX, json={"ready": True})).json() == index[1:]
        # a fresh user's gzip body was read as JSON ("'utf-8' codec can't decode byte 0x8b")
        compressed = await client.post(INDEX, content=gzip.compress(b'{"ready": true}'), headers=GZIP)
        assert compressed.status_code == 415 and "only infer takes gzip" in compressed.json()["error"]
        listing = (await client.get("/v1/models")).json()
        assert [v["version"] for v in listing["models"][0]["versions"]] == ["2"]
        assert listing["models"][0]["version_policy"] == {"latest": {"num_versions": 1}}
        assert (await classify(client, "1")).status_code == 404
        metrics = (await client.get("/metrics")).text
        labels = {"model": "vit-digits", "version": "2", "outcome": "success"}
        assert (
            sample(metrics, "patchserve_model_loads_total", **labels)
            - sample(before, "patchserve_model_loads_total", **labels)
            == 1
        )
        assert sample(metrics, "patchserve_model_info", model="vit-digits", version="1") == 0


async def test_a_retired_version_answers_everything_it_queued_and_ran(repository: Path) -> None:
    (repository / "vit-digits" / "config.json").write_text('{"version_policy": {"all": {}}}')
    publish(repository, "vit-digits", 2)
    reference = Reference(repository, "vit-digits")
    async with running_app(
        make_settings(model_control_api=True, model_repository=repository, max_batch_size=1)
    ) as client:
        v1 = client.app.state.server.repository.get("vit-digits", "1")
        runner = v1.instances[0]
        release, session = threading.Event(), runner.session

        class HeldSession:  # the first run waits until released; the others wait behind it
            def run(self, *args):
                release.wait(60)
                return session.run(*args)

        runner.session = HeldSession()
        # The batching path for every request: a first request that got ahead of the others could
        # claim the runner alone and run in its decode thread, holding the rest in the queue (4, 0).
        v1.batcher.claim_alone = lambda: None
        held = [asyncio.create_task(classify(client, "1")) for _ in range(5)]
        await until(
            lambda: v1.batcher.queued == 3 and v1.batcher.staged_batches == 1,
            "one request of version 1 in flight, one waiting behind it in its runner's thread and three queued",
        )
        retire = await client.post(
            LOAD, json={"parameters": {"config": '{"version_policy": {"specific": {"versions": [2]}}}'}}
        )
        assert retire.status_code == 200, retire.text
        assert v1.retiring and not v1.released  # out of the routing table, still finishing its requests
        index = {e["version"]: e["state"] for e in (await client.post(INDEX)).json()}
        assert index == {"1": "UNLOADING", "2": "READY"}
        later = await classify(client)  # a request without a version: version 2, at once
        assert later.json()["version"] == "2" and reference.matches(2, DIGIT_7, later.json())
        assert (await classify(client, "1")).status_code == 404
        release.set()
        answers = await asyncio.gather(*held)
        assert [a.status_code for a in answers] == [200] * 5
        assert all(a.json()["version"] == "1" and reference.matches(1, DIGIT_7, a.json()) for a in answers)
        await control(client).until_retired()
        assert v1.released and v1.instances == []
        index = {e["version"]: (e["state"], e["reason"]) for e in (await client.post(INDEX)).json()}
        assert index == {"1": ("UNAVAILABLE", "unloaded"), "2": ("READY", "")}


async def test_a_retiring_version_waits_for_its_own_request_timeout(repository: Path) -> None:
    # Found by a reviewer: the wait was the server's request timeout, so a version whose manifest
    # gives its requests longer was released under them (503) before their deadlines.
    path = repository / "vit-digits" / "1" / "model.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "batching": {"request_timeout": 10.0}}))
    settings = make_settings(model_repository=repository, request_timeout=1.0, body_timeout=2.0)
    async with running_app(settings) as client:
        v1 = client.app.state.server.repository.get("vit-digits", "1")
        assert v1.batcher.config.request_timeout == 10.0
        assert control(client).swaps.drain_timeout(v1) == 10.0 + 2.0


async def test_the_drain_waits_drain_timeout_then_releases_a_version_still_held(
    repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reviewer's follow-up: the test above checked the figure, not that the drain waits it.
    # asyncio.wait_for, as version_swaps sees it, records its timeout and reports it expired at once.
    from service.runtime import version_swaps

    waited: list[float | None] = []

    async def expired(awaitable, timeout):
        waited.append(timeout)
        awaitable.close()  # the until_unused() coroutine, never awaited
        raise TimeoutError

    class Asyncio:
        def __getattr__(self, name: str):
            return expired if name == "wait_for" else getattr(asyncio, name)

    path = repository / "vit-digits" / "1" / "model.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "batching": {"request_timeout": 10.0}}))
    settings = make_settings(model_repository=repository, request_timeout=1.0, body_timeout=2.0, model_control_api=True)
    async with running_app(settings) as client:
        server = client.app.state.server
        with server.repository.use("vit-digits", "1") as v1:  # a request holding it: the drain must wait
            monkeypatch.setattr(version_swaps, "asyncio", Asyncio())
            assert (await client.post(UNLOAD)).status_code == 200
            await control(client).until_retired()
            monkeypatch.undo()
            assert waited == [12.0] and v1.released and v1.users == 1


async def test_a_corrupt_version_is_refused_and_the_serving_one_keeps_serving(repository: Path) -> None:
    def loads(text: str, version: str, outcome: str) -> float:
        return sample(text, "patchserve_model_loads_total", model="vit-digits", version=version, outcome=outcome)

    async with running_app(make_settings(model_control_api=True, model_repository=repository)) as client:
        before = (await client.get("/metrics")).text  # the counters are the process's, shared by every test
        publish(repository, "vit-digits", 3, "bad-manifest")
        refused = await client.post(LOAD)
        assert refused.status_code == 400 and "not_a_field" in refused.json()["error"]
        assert (await classify(client)).json()["version"] == "1"
        (entry,) = [e for e in (await client.post(INDEX)).json() if e["version"] == "3"]
        assert entry["state"] == "UNAVAILABLE" and "not_a_field" in entry["reason"]
        (shown,) = (await client.get("/v1/models")).json()["not_serving"]
        assert shown["version"] == "3" and "not_a_field" in shown["reason"]
        assert (await client.get("/readyz")).status_code == 200
        shutil.rmtree(repository / "vit-digits" / "3")
        publish(repository, "vit-digits", 3, "wrong-input")
        refused = await client.post(LOAD)
        assert refused.status_code == 400 and "'pixels'" in refused.json()["error"], refused.text
        assert (await classify(client)).json()["version"] == "1"
        after = (await client.get("/metrics")).text
        assert loads(after, "3", "failure") - loads(before, "3", "failure") == 2
        assert loads(after, "1", "success") == loads(before, "1", "success")  # version 1 was never loaded again


async def test_a_refused_load_with_a_version_policy_leaves_serving_as_it_was(repository: Path) -> None:
    # Found by a fresh user: "specific: [2]" without a version 2 answered 400 and retired version 1.
    def specific(*versions: int) -> dict:
        policy = {"version_policy": {"specific": {"versions": list(versions)}}}
        return {"parameters": {"config": json.dumps(policy)}}

    async with running_app(make_settings(model_control_api=True, model_repository=repository)) as client:
        for body in (specific(2), specific(999999999)):
            refused = await client.post(LOAD, json=body)
            assert refused.status_code == 400 and "selects none of its complete version folders [1]" in refused.text
            assert refused.json()["error"].endswith("what serves is unchanged")
            assert (await classify(client)).json()["version"] == "1"
        publish(repository, "vit-digits", 2, "bad-manifest")  # a version 2 that exists but fails to load
        failed = await client.post(LOAD, json=specific(2))
        assert failed.status_code == 400 and "not_a_field" in failed.json()["error"]
        await control(client).until_retired()
        assert (await classify(client)).json()["version"] == "1"
        await control(client).sync()  # the next poll, which does not try the failed files again
        await control(client).until_retired()
        assert (await classify(client)).json()["version"] == "1"
        ready = (await client.post(INDEX, json={"ready": True})).json()
        assert ready == [{"name": "vit-digits", "version": "1", "state": "READY", "reason": ""}]


async def test_a_load_config_with_keys_this_server_ignores_is_refused(repository: Path) -> None:
    # A tester's: {"max_batch_size": 0} or {"name": "other"} in a load's config got 200 and did nothing.
    def load(config: dict) -> dict:
        return {"parameters": {"config": json.dumps(config)}}

    async with running_app(make_settings(model_control_api=True, model_repository=repository)) as client:
        for config in ({"max_batch_size": 0}, {"platform": "onnxruntime_onnx", "version_policy": {"all": {}}}):
            refused = await client.post(LOAD, json=load(config))
            assert refused.status_code == 400 and "would be ignored" in refused.json()["error"]
            assert "reads only version_policy" in refused.json()["error"]
        assert (await classify(client)).json()["version"] == "1"  # what serves is unchanged
        for text, says in (
            ('{"version_policy": {"specific": {"versions": [true]}}}', "not true or false"),  # a tester's: read as [1]
            ('{"version_policy": {"all": {}}, "version_policy": {"latest": {}}}', "given twice"),  # the last won
            ('{"name": "other"}', "name is 'other', but the load is for 'vit-digits'"),
        ):
            refused = await client.post(LOAD, json={"parameters": {"config": text}})
            assert refused.status_code == 400 and says in refused.json()["error"], refused.text
        # A tester's: the body's own keys twice loaded with the last, the config silently dropped.
        for body in (
            '{"parameters": {"config": "{\\"version_policy\\": {\\"all\\": {}}}"}, "parameters": {}}',
            '{"parameters": {"config": "{}", "config": "{\\"version_policy\\": {\\"all\\": {}}}"}}',
        ):
            twice = await client.post(LOAD, content=body, headers={"Content-Type": "application/json"})
            assert twice.status_code == 400 and "given twice in one object" in twice.json()["error"], twice.text
        index = await client.post(INDEX, content=b'{"ready": true, "ready": false}')
        assert index.status_code == 400 and "'ready' given twice" in index.json()["error"]
        unknown = await client.post(LOAD, json={"parameters": {"foo": 1}})
        assert unknown.status_code == 400 and "unknown load parameter(s) 'foo'" in unknown.json()["error"]
        quoted = await client.post(LOAD, json=load({"version_policy": {"specific": {"versions": ["1"]}}}))
        assert quoted.status_code == 200  # protobuf's JSON form (Triton's) writes int64s as strings
        named = await client.post(LOAD, json=load({"name": "vit-digits", "version_policy": {"all": {}}}))
        assert named.status_code == 200  # its own name, as Triton's configs carry it, changes nothing
        repeated = await client.post(LOAD, json=load({"version_policy": {"specific": {"versions": [1, 1, 1]}}}))
        assert repeated.status_code == 200
        [model] = (await client.get("/v1/models")).json()["models"]
        assert model["version_policy"] == {"specific": {"versions": [1]}}  # shown once each


async def test_polling_publishes_and_removing_a_folder_retires(repository: Path) -> None:
    async with running_app(
        make_settings(model_control_api=True, model_repository=repository, repository_poll_seconds=0.1)
    ) as client:
        publish(repository, "vit-digits", 2)
        await until(lambda: "2" in {str(v) for v in client.app.state.server.repository.models["vit-digits"]}, "v2")
        assert (await classify(client)).json()["version"] == "2"
        await control(client).until_retired()
        assert [e["state"] for e in (await client.post(INDEX)).json()] == ["UNAVAILABLE", "READY"]  # 1 unloaded
        (repository / "vit-digits" / "config.json").write_text('{"version_policy": {"latest": {"num_versions": 2}}}')
        await until(lambda: 1 in client.app.state.server.repository.models.get("vit-digits", {}), "v1 back")
        assert [e["state"] for e in (await client.post(INDEX)).json()] == ["READY", "READY"]
        shutil.rmtree(repository / "vit-digits" / "2")
        await until(lambda: 2 not in client.app.state.server.repository.models.get("vit-digits", {}), "v2 retired")
        assert (await classify(client)).json()["version"] == "1"
        await control(client).until_retired()
        ready = [{"name": "vit-digits", "version": "1", "state": "READY", "reason": ""}]
        await until(lambda: control(client).index() == ready, "version 2, its folder gone, left out of the index")


async def test_unload_then_load_and_the_switches(repository: Path) -> None:
    async with running_app(make_settings(model_control_api=True, model_repository=repository)) as client:
        assert (await client.post(UNLOAD)).status_code == 200
        assert (await classify(client)).status_code == 404
        await control(client).until_retired()
        assert (await client.post(INDEX)).json() == [
            {"name": "vit-digits", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
        ]
        assert (await client.post(INDEX, json={"ready": True})).json() == []
        assert (await client.get("/readyz")).status_code == 200  # nothing that should serve is down
        assert (await client.post(LOAD)).status_code == 200
        assert (await classify(client)).json()["version"] == "1"
        assert (await client.post("/v2/repository/models/nothing/load")).status_code == 400
        assert (await client.post(LOAD, json={"parameters": {"file:1/model.onnx": "AAAA"}})).status_code == 400
        assert (await client.post(LOAD, content=b"{not json")).status_code == 400
    async with running_app(make_settings(model_repository=repository)) as client:  # the default: off
        off = await client.post(UNLOAD)
        assert off.status_code == 403 and "PATCHSERVE_MODEL_CONTROL_API" in off.json()["error"]
        assert (await client.post(INDEX)).status_code == 200
    async with running_app(
        make_settings(model_control_api=True, model_repository=repository, api_keys=["k1"])
    ) as client:
        assert (await client.post(UNLOAD)).status_code == 401
        assert (await client.post(UNLOAD, headers={"Authorization": "Bearer k1"})).status_code == 200


async def test_a_version_loaded_while_serving_reuses_the_tuners_result_and_never_measures(
    repository: Path, tmp_path: Path
) -> None:
    tuned = {"auto_tune": True, "instances": None, "tune_point_seconds": 0.02, "tune_max_batch_size": 4}
    settings = make_settings(
        model_control_api=True, model_repository=repository, tune_cache=tmp_path / "cache", tune_busy_cores=64, **tuned
    )
    async with running_app(settings) as client:
        first = (await client.get("/v1/models/vit-digits")).json()["versions"][0]["autotune"]
        assert first["source"] == "measured"  # at start-up, nothing else serving: measured (and cached)
        publish(repository, "vit-digits", 2, "copy")  # the same graph: the cached result is its own
        assert (await client.post(LOAD)).status_code == 200
        second = (await client.get("/v1/models/vit-digits")).json()["versions"][0]
        assert second["version"] == "2" and second["autotune"]["source"] == "cache"
        assert second["autotune"]["chosen"] == first["chosen"]
        assert second["autotune"]["measured_at"] == first["measured_at"]  # the start-up measurement, read back
        publish(repository, "vit-digits", 3)  # another graph, nothing cached: version 2's choice, not a measurement
        assert (await client.post(LOAD)).status_code == 200
        third = (await client.get("/v1/models/vit-digits")).json()["versions"][0]
        assert third["version"] == "3" and third["autotune"]["source"].startswith("reused from version 2")
        assert third["autotune"]["chosen"] == first["chosen"]
        assert third["batching"]["max_batch_size"] == first["chosen"]["max_batch_size"]
        assert not list((tmp_path / "cache").glob("vit-digits-3-*.json"))  # nothing was measured for it


async def test_a_poll_loads_a_version_only_once_its_files_are_complete_and_settled(repository: Path) -> None:
    async with running_app(make_settings(model_control_api=True, model_repository=repository)) as client:
        models = client.app.state.server.repository.models
        half = repository / "vit-digits" / "3"
        half.mkdir()
        shutil.copy(repository / "vit-digits" / "1" / "model.onnx", half / "model.onnx")  # no model.json yet
        publish(repository, "vit-digits", 2)
        await control(client).sync()  # the poller's call: version 2 seen once, not yet settled
        assert set(models["vit-digits"]) == {1}
        await control(client).sync()  # unchanged since: loaded, and version 1 retired (latest 1)
        assert set(models["vit-digits"]) == {2}
        await control(client).sync()
        assert set(models["vit-digits"]) == {2} and "3" not in {e["version"] for e in (await client.post(INDEX)).json()}
        (half / "junk").mkdir()
        (repository / "vit-digits" / "not-a-version").mkdir()  # ignored, with one warning
        (repository / "vit-digits" / "config.json").write_text("{not json")
        await control(client).sync()  # an invalid config.json: what serves is unchanged
        assert set(models["vit-digits"]) == {2}
        described = (await client.get("/v1/models/vit-digits")).json()
        assert "not JSON" in described["version_policy"]["error"]
        assert (await client.get("/readyz")).status_code == 200
        moved = repository.rename(repository.with_name("elsewhere"))  # an unmounted volume: nothing to list
        await control(client).sync()
        assert set(models["vit-digits"]) == {2}  # nothing retired on a view it could not read
        assert (await classify(client)).json()["version"] == "2"
        moved.rename(repository)


async def test_a_version_rewritten_in_place_is_loaded_again_and_swapped(repository: Path) -> None:
    async with running_app(make_settings(model_control_api=True, model_repository=repository)) as client:
        old = client.app.state.server.repository.get("vit-digits", "1")
        assert (await classify(client)).json()["predictions"][0]["label"] == "7"
        publish(repository, "vit-digits", 2)
        # new files for version 1, each replaced atomically (os.replace), as a re-export would
        (repository / "vit-digits" / "2" / "model.onnx").replace(repository / "vit-digits" / "1" / "model.onnx")
        shutil.rmtree(repository / "vit-digits" / "2")
        assert (await client.post(LOAD)).status_code == 200
        answer = (await classify(client)).json()
        assert answer["version"] == "1" and answer["predictions"][0]["label"] == "2"  # the reversed graph
        await control(client).until_retired()
        assert old.released and client.app.state.server.repository.get("vit-digits", "1") is not old
        metrics = (await client.get("/metrics")).text
        assert sample(metrics, "patchserve_model_info", model="vit-digits", version="1") == 1


async def test_a_version_rewritten_in_place_with_broken_files_stays_ready_and_says_why(repository: Path) -> None:
    # Left from a review: the index showed such a version READY with no reason (only /v1/models told).
    async with running_app(make_settings(model_control_api=True, model_repository=repository)) as client:
        publish(repository, "vit-digits", 2, "wrong-input")
        # version 1's graph replaced atomically by one the manifest does not fit
        (repository / "vit-digits" / "2" / "model.onnx").replace(repository / "vit-digits" / "1" / "model.onnx")
        shutil.rmtree(repository / "vit-digits" / "2")
        refused = await client.post(LOAD)
        assert refused.status_code == 400 and "'pixels'" in refused.json()["error"], refused.text
        assert (await classify(client)).json()["version"] == "1"  # its earlier files' sessions still serve
        (entry,) = (await client.post(INDEX)).json()
        assert entry["version"] == "1" and entry["state"] == "READY"
        assert entry["reason"].startswith("serving earlier files; new ones failed") and "'pixels'" in entry["reason"]
        listed = (await client.get("/v1/models/vit-digits")).json()
        # a tester's: /v1/models said UNAVAILABLE for the version that serves; now as the index says
        assert [v["version"] for v in listed["versions"]] == ["1"]
        assert [(e["version"], e["state"], e["reason"]) for e in listed["not_serving"]] == [
            ("1", "READY", entry["reason"])
        ]


async def test_a_load_in_progress_stalls_no_request(repository: Path) -> None:
    async with running_app(make_settings(model_control_api=True, model_repository=repository)) as client:
        loader, proceed = control(client).swaps.loader, threading.Event()

        class SlowLoader:  # the load of version 2 waits, in its worker thread, until told to go on
            tuner = loader.tuner

            def load(self, *args, **kwargs):
                proceed.wait(60)
                return loader.load(*args, **kwargs)

        control(client).swaps.loader = SlowLoader()
        publish(repository, "vit-digits", 2)
        loading = asyncio.create_task(client.post(LOAD))
        await until(lambda: control(client).states.get("vit-digits", {}).get(2) is not None, "version 2 loading")
        states = {e["version"]: e["state"] for e in (await client.post(INDEX)).json()}
        assert states == {"1": "READY", "2": "LOADING"}
        answers = await asyncio.gather(*(classify(client) for _ in range(4)))  # served meanwhile, by version 1
        assert [(a.status_code, a.json()["version"]) for a in answers] == [(200, "1")] * 4
        assert (await client.get("/readyz")).status_code == 200
        assert not loading.done()
        proceed.set()
        assert (await loading).status_code == 200
        assert (await classify(client)).json()["version"] == "2"


async def test_a_load_succeeds_when_only_versions_its_policy_leaves_out_fail(repository: Path) -> None:
    # Found by a tester: "specific: [1]" beside a broken version 3 answered 400, yet took effect.
    only_1 = {"parameters": {"config": json.dumps({"version_policy": {"specific": {"versions": [1]}}})}}
    async with running_app(make_settings(model_control_api=True, model_repository=repository)) as client:
        publish(repository, "vit-digits", 3, "bad-manifest")
        refused = await client.post(LOAD)  # the config's policy, latest 1, selects the broken version 3
        assert refused.status_code == 400 and "version 3:" in refused.json()["error"]
        loaded = await client.post(LOAD, json=only_1)  # version 3 has failed, but this policy leaves it out
        assert loaded.status_code == 200, loaded.text
        assert (await classify(client)).json()["version"] == "1"
        assert (await client.post(LOAD)).status_code == 400  # back to latest 1: version 3 again
        assert (await classify(client)).json()["version"] == "1"
        # Found by a second tester: with a good version 4 above the broken 3, latest 1 selects 4,
        # which loaded; the policy was applied to the failed versions alone (3), and the load said 400.
        publish(repository, "vit-digits", 4, "copy")
        beside = await client.post(LOAD)
        assert beside.status_code == 200, beside.text
        assert (await classify(client)).json()["version"] == "4"
        # a body is counted before it is parsed (service/core/json_bounds.py)
        flood = await client.post(INDEX, content=b"[" + b"[]," * 100 + b"[]]")
        assert flood.status_code == 400 and "102 arrays and objects, more than 64 allowed" in flood.json()["error"]
        keys = b'{"ready": true' + b"".join(b',"%x":0' % i for i in range(5000)) + b"}"  # a tester's: 200 after 1.85 s
        members = await client.post(INDEX, content=keys)
        assert members.status_code == 400 and "5001 object members" in members.json()["error"]


async def test_a_failed_highest_version_falls_back_to_the_next_and_never_retires_what_serves(repository: Path) -> None:
    # Found by a fresh user: a good version 2 and a broken version 3 published together, latest 1: version 3
    # failed, the selection over what was left picked 2, which that pass never loaded, and version 1 was
    # retired for it: 404 for the whole model, and with the load API (no polling) for good.
    async with running_app(make_settings(model_control_api=True, model_repository=repository)) as client:
        publish(repository, "vit-digits", 2, "copy")
        publish(repository, "vit-digits", 3, "bad-manifest")
        refused = await client.post(LOAD)
        assert refused.status_code == 400 and "version 3:" in refused.json()["error"]  # what latest 1 selects failed
        served = await classify(client)
        assert served.status_code == 200 and served.json()["version"] == "2", served.text  # the next one serves
        await control(client).until_retired()
        states = {e["version"]: e["state"] for e in (await client.post(INDEX)).json()}
        assert states == {"1": "UNAVAILABLE", "2": "READY", "3": "UNAVAILABLE"}
        # three broken versions at once: every one fails, and version 2 serves throughout
        publish(repository, "vit-digits", 4, "wrong-input")
        publish(repository, "vit-digits", 5, "bad-manifest")
        publish(repository, "vit-digits", 6, "wrong-input")
        assert (await client.post(LOAD)).status_code == 400
        await control(client).until_retired()
        assert (await classify(client)).json()["version"] == "2"
        assert (await client.get("/readyz")).status_code == 200


async def test_a_load_overtaken_by_an_unload_says_so(repository: Path) -> None:
    # Found by a fresh user: of 10 loads racing 10 unloads, 9 loads were told "no complete version folder
    # its version policy selects" though the folder was complete; the unload that came in was the cause.
    async with running_app(make_settings(model_control_api=True, model_repository=repository)) as client:
        lock = control(client)._lock
        await lock.acquire()  # a change in progress: what follows waits for it, in arrival order
        unloading = asyncio.ensure_future(client.post(UNLOAD))
        await until(lambda: len(lock._waiters or ()) == 1, "the unload to wait")
        loading = asyncio.ensure_future(client.post(LOAD))  # the load's own change waits behind the unload
        await until(lambda: len(lock._waiters or ()) == 2, "the load to wait")
        lock.release()
        unloaded, loaded = await unloading, await loading
        assert unloaded.status_code == 200
        assert loaded.status_code == 400 and "an unload of it came in while it loaded" in loaded.json()["error"]
        assert (await client.post(LOAD)).status_code == 200 and (await classify(client)).status_code == 200


async def test_a_version_in_the_repository_that_is_not_served_is_named_so(repository: Path) -> None:
    # A tester's: ?version=2 said "has no version '2'" while model_repository/<name>/2/ was right there.
    publish(repository, "vit-digits", 2, kind="copy")
    (repository / "vit-digits" / "config.json").write_text('{"version_policy": {"specific": {"versions": [1]}}}')
    async with running_app(model_repository=repository) as client:
        left_out = await client.post(CLASSIFY + "?version=2", files={"image": DIGIT_7.read_bytes()})
        absent = await client.post(CLASSIFY + "?version=3", files={"image": DIGIT_7.read_bytes()})
    assert left_out.status_code == absent.status_code == 404
    assert "version 2 is in the repository but not served" in left_out.json()["detail"]
    assert "version_policy" in left_out.json()["detail"] and "Served: [1]" in left_out.json()["detail"]
    assert "has no version '3'; it has [1]" in absent.json()["detail"]


def corrupt_version(repository: Path, version: int) -> None:
    """``version`` of vit-digits: version 1's manifest beside a model.onnx that is not a graph."""
    folder = repository / "vit-digits" / str(version)
    shutil.copytree(repository / "vit-digits" / "1", folder)
    (folder / "model.onnx").write_bytes(b"not a protobuf" * 100)


async def test_a_version_that_fails_at_start_up_is_left_out_and_the_policy_serves_the_next(repository: Path) -> None:
    # A tester's: a corrupt version 2 on disk at start-up left the worker alive, never ready, serving nothing,
    # where a running worker that saw the same version 2 appear kept serving version 1.
    corrupt_version(repository, 2)
    async with running_app(make_settings(model_repository=repository)) as client:
        answer = await classify(client)
        (shown,) = (await client.get("/v1/models")).json()["not_serving"]
        metrics = (await client.get("/metrics")).text
    assert answer.status_code == 200 and answer.json()["version"] == "1"  # latest: 1 of the versions that load
    assert (shown["version"], shown["state"]) == ("2", "UNAVAILABLE") and "protobuf" in shown["reason"].lower()
    assert sample(metrics, "patchserve_model_loads_total", model="vit-digits", version="2", outcome="failure") >= 1


async def test_a_start_up_where_no_version_loads_is_not_ready_and_says_why(tmp_path: Path) -> None:
    from service.http.app import create_app

    shutil.copytree(MODEL_REPOSITORY / "vit-digits" / "1", tmp_path / "vit-digits" / "1")
    (tmp_path / "vit-digits" / "1" / "model.onnx").write_bytes(b"not a protobuf" * 100)
    app = create_app(make_settings(model_repository=tmp_path))
    async with app.router.lifespan_context(app):
        state = app.state.server
        await until(lambda: bool(state.startup_error), "the start-up to give up")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            ready = await client.get("/readyz")
            answer = await classify(client)
    assert ready.status_code == 503 and "no model version could be loaded: vit-digits/1:" in ready.text
    assert answer.status_code == 503 and "no model version could be loaded" in answer.json()["detail"]  # not "loading"

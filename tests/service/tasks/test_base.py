"""The task seam: a task defined here is served by the generic route with no change to service/; one accounting."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel, Field

from service import tasks
from service.tasks import BaseTask
from service.tasks.base import result_schema
from tests.conftest import MODEL_REPOSITORY, ROOT, running_app, served_version
from tests.service.helpers import assert_problem, sample

pytestmark = pytest.mark.anyio

DIGIT_7 = (ROOT / "examples" / "digit-7.png").read_bytes()


class ArgmaxParams(BaseModel):
    offset: int = Field(0, ge=0, description="Added to the class index (to prove the parameters reach the task)")


class Argmax(BaseTask):
    """A toy companion task: the index of the largest logit, plus ``offset``."""

    name = "toy-argmax"
    verb = "argmax"
    summary = "The index of the largest logit"
    roles = ("logits",)
    companion = True
    Params = ArgmaxParams
    result_schema = result_schema("Argmax", {"argmax": {"type": "integer", "minimum": 0}})

    def fields(self, model, outcome, params: ArgmaxParams) -> dict[str, Any]:
        logits = tasks.output(model, outcome, "logits")
        return {"argmax": int(np.argmax(logits)) + params.offset}


@pytest.fixture
def toy_task():
    task = tasks.register(Argmax())
    yield task
    tasks.unregister(task.name)


async def test_a_task_defined_in_a_test_is_served_by_the_generic_route(toy_task) -> None:
    async with running_app() as client:
        plain = await client.post("/v1/models/vit-digits/argmax", files={"image": DIGIT_7})
        shifted = await client.post("/v1/models/vit-digits/argmax?offset=100", files={"image": DIGIT_7})
        classified = await client.post("/v1/models/vit-digits/classify", files={"image": DIGIT_7})
        bad = await client.post("/v1/models/vit-digits/argmax?offset=-1", files={"image": DIGIT_7})
        several = await client.post("/v1/models/vit-digits/argmax", files=[("image", DIGIT_7), ("image", DIGIT_7)])
        document = (await client.get("/openapi.json")).json()
        metrics = (await client.get("/metrics")).text
    top = classified.json()["predictions"][0]["class_id"]
    assert plain.status_code == 200 and plain.json()["argmax"] == top == 7
    assert plain.json()["model"] == "vit-digits" and plain.json()["image"] == classified.json()["image"]
    assert shifted.json()["argmax"] == 107
    assert_problem(bad, 422, "offset")
    assert [r["argmax"] for r in several.json()["results"]] == [7, 7]
    assert "server-timing" in plain.headers and "compute;dur=" in plain.headers["server-timing"]
    route = document["paths"]["/v1/models/{name}/argmax"]["post"]
    assert route["summary"] == "The index of the largest logit"
    assert "offset" in [p["name"] for p in route["parameters"]]
    assert sample(metrics, "patchserve_requests_total", model="vit-digits", version="1", outcome="success") >= 3


async def test_a_task_the_model_does_not_serve_names_the_route_it_does() -> None:
    async with running_app() as client:
        wrong = await client.post("/v1/models/detr-digits/classify", files={"image": DIGIT_7})
        back = await client.post("/v1/models/vit-digits/detect", files={"image": DIGIT_7})
    assert_problem(wrong, 400, "is a detection model; POST to /v1/models/detr-digits/detect")
    assert_problem(back, 400, "POST to /v1/models/vit-digits/classify")


def test_the_registry_refuses_a_clashing_verb_and_an_incomplete_task() -> None:
    class Clash(Argmax):
        name, verb = "toy-clash", "classify"

    with pytest.raises(ValueError, match="clashes"):
        tasks.register(Clash())
    with pytest.raises(ValueError, match="does not declare"):
        tasks.register(object())  # type: ignore[arg-type]
    assert "toy-clash" not in tasks.names()


def test_a_manifest_names_its_output_roles_and_the_list_form_still_loads() -> None:
    from service.runtime.manifest import load_manifest

    detr = load_manifest(served_version("detr-digits") / "model.json")
    assert tasks.role_outputs(detr) == {"logits": "pred_logits", "boxes": "pred_boxes"}
    named = detr.model_copy(update={"roles": {"boxes": "pred_boxes", "logits": "pred_logits"}})
    assert tasks.role_outputs(named) == {"boxes": "pred_boxes", "logits": "pred_logits"}
    assert tasks.options(detr).scores == "sigmoid_top_k"  # version 2: focal loss (issue 21)
    first = load_manifest(MODEL_REPOSITORY / "detr-digits" / "1" / "model.json")
    assert tasks.options(first).scores == "softmax"  # version 1: no task_options, DETR's softmax


async def test_a_failed_v2_inference_is_counted_as_an_error(monkeypatch) -> None:
    from service.http.routes import v2
    from tests.service.helpers import INFER, digit_tensor, json_request

    def broken(*args, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(v2, "encode_infer_response", broken)
    async with running_app() as client:
        before = (await client.get("/metrics")).text
        response = await client.post(INFER, json=json_request(digit_tensor(DIGIT_7)))
        unknown = await client.post("/v2/models/made-up/infer", json=json_request(digit_tensor(DIGIT_7)))
        after = (await client.get("/metrics")).text
    assert response.status_code == 500 and "simulated" not in response.json()["error"]
    assert unknown.status_code == 404

    def delta(**labels: str) -> float:
        return sample(after, "patchserve_requests_total", **labels) - sample(
            before, "patchserve_requests_total", **labels
        )

    assert delta(model="vit-digits", version="1", outcome="error") == 1
    assert delta(model="_unknown", outcome="client_error") == 1


@pytest.mark.parametrize(
    ("edit", "part"),
    [
        ({"task": "segmentation"}, "unknown task 'segmentation'; registered tasks: classification, detection"),
        ({"roles": {"logits": "scores"}}, "not in outputs"),
        ({"roles": {"embedding": "logits"}}, "needs the output role(s) ['logits']"),
        ({"task_options": {"scores": "softmax"}}, "task_options"),
    ],
)
def test_a_manifest_with_an_unknown_task_or_bad_roles_names_the_field(tmp_path, edit: dict, part: str) -> None:
    import json

    from service.runtime.manifest import Manifest, ManifestError, load_manifest

    data = json.loads((ROOT / "model_repository" / "vit-digits" / "1" / "model.json").read_text())
    assert Manifest.model_validate(data).task == "classification"
    data.update(edit)
    path = tmp_path / "model.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    assert str(path) in str(caught.value) and part in str(caught.value)

"""The local Tinker server against a hostile client: paths, pickles, slow jobs, bad numbers.

Raw HTTP where the SDK would refuse to send the input, the real SDK where it would.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from bridges.adapters.tinker import server as server_module
from bridges.adapters.tinker.server import create_app
from bridges.adapters.tinker.state import TinkerServerConfig, build_state
from bridges.runtime.http_server import ServerThread

SENTINEL_NAME = "pickle-ran"


class RunsCode:
    """A pickle payload: unpickling it creates a file (stand-in for arbitrary code)."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> Any:
        return (Path.touch, (self.target,))


@pytest.fixture(scope="module")
def hostile(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("hostile")
    root = base / "root"
    state = build_state(TinkerServerConfig(model=str(tiny_path), model_name="tiny", root=str(root)))
    thread = ServerThread(create_app(state), port=0)
    http = httpx.Client(base_url=f"{thread.url}/api/v1", timeout=60)
    try:
        yield {"http": http, "root": root, "outside": base, "url": thread.url, "state": state}
    finally:
        http.close()
        thread.close()


def call(http: httpx.Client, endpoint: str, body: Any) -> dict[str, Any]:
    """POST then, for a promise, poll retrieve_future until it answers; never a 5xx."""
    response = http.post(endpoint, content=json.dumps(body), headers={"content-type": "application/json"})
    assert response.status_code < 500, response.text
    if response.status_code != 200 or "request_id" not in response.json():
        return {"status": response.status_code, **response.json()}
    request_id = response.json()["request_id"]
    while True:
        polled = http.post("/retrieve_future", json={"request_id": request_id})
        assert polled.status_code < 500, polled.text
        if polled.json().get("type") != "try_again":
            return {"status": polled.status_code, **polled.json()}


def training_client(http: httpx.Client) -> str:
    session = http.post("/create_session", json={}).json()["session_id"]
    created = call(http, "/create_model", {"session_id": session, "model_seq_id": 0, "base_model": "tiny",
                                            "lora_config": {"rank": 2}})
    return created["model_id"]


def files_outside(root: Path, base: Path) -> list[Path]:
    return [p for p in base.rglob("*") if p.is_file() and not p.is_relative_to(root)]


def test_client_paths_never_leave_the_root_and_pickles_are_never_loaded(hostile: dict[str, Any]):
    http, root, base = hostile["http"], hostile["root"], hostile["outside"]
    model_id = training_client(http)
    sentinel = base / SENTINEL_NAME
    for place in (base / "evil.pt", root / "evil.pt", root / model_id / "weights" / "evil.pt"):
        place.parent.mkdir(parents=True, exist_ok=True)
        place.write_bytes(pickle.dumps(RunsCode(sentinel)))
    before = set(files_outside(root, base))

    refused = [
        call(http, "/save_weights", {"model_id": model_id, "path": "../../escape"}),
        call(http, "/save_weights", {"model_id": model_id, "path": "/tmp/escape"}),
        call(http, "/save_weights", {"model_id": "../../x", "path": "ok"}),
        call(http, "/save_weights_for_sampler", {"model_id": model_id, "path": "../up"}),
        call(http, "/load_weights", {"path": "tinker://../../evil/weights/x"}),
        call(http, "/load_weights", {"path": f"tinker:///{base}/evil"}),
        call(http, "/load_weights", {"path": f"tinker://{model_id}/weights/evil.pt"}),
        call(http, "/load_weights", {"path": f"tinker://{model_id}/weights/../../../evil"}),
        call(http, "/create_sampling_session", {"model_path": f"tinker://{model_id}/weights/evil"}),
        call(http, "/create_sampling_session", {"model_path": "tinker://../weights/evil"}),
        call(http, "/create_model", {"session_id": "../../x", "model_seq_id": 0}),
        call(http, "/create_model", {"session_id": "unknown-session", "model_seq_id": 0}),
    ]
    for answer in refused:
        assert answer["status"] == 400 or "error" in answer, answer
    assert not sentinel.exists()  # no pickle was ever unpickled
    assert set(files_outside(root, base)) == before  # nothing written outside root
    # a legitimate save is a folder of safetensors + JSON + manifest, inside root
    saved = call(http, "/save_weights", {"model_id": model_id, "path": "good"})
    folder = root / model_id / "weights" / "good"
    assert saved["path"] == f"tinker://{model_id}/weights/good"
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "meta.json", "weights.safetensors"]
    # a save whose bytes were changed is refused, not loaded
    (folder / "weights.safetensors").write_bytes(b"x" * 10)
    damaged = call(http, "/load_weights", {"path": saved["path"]})
    assert "damaged" in damaged["error"]


def test_a_slow_job_is_never_cancelled_by_a_poll_and_no_poll_is_a_500(
    hostile: dict[str, Any], monkeypatch: pytest.MonkeyPatch
):
    http = hostile["http"]
    monkeypatch.setattr(server_module, "RETRIEVE_WAIT_S", 0.2)
    model_id = training_client(http)
    # occupy the model thread, so the optim_step below queues behind it for several polls
    state = hostile["state"]
    gate = threading.Event()
    state.worker.submit(gate.wait, 30)
    promise = http.post("/optim_step", json={"model_id": model_id, "adam_params": {"learning_rate": 1e-3}})
    request_id = promise.json()["request_id"]
    answers = [http.post("/retrieve_future", json={"request_id": request_id}) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert all(a.json() == {"type": "try_again"} for a in answers)
    gate.set()
    deadline = time.monotonic() + 30
    while (answer := http.post("/retrieve_future", json={"request_id": request_id})).json() == {
        "type": "try_again"
    }:
        assert time.monotonic() < deadline
    assert answer.status_code == 200 and answer.json()["type"] == "optim_step"  # the step ran
    assert answer.json()["metrics"]["optim/step"] == 1.0


def test_telemetry_answers_the_shape_the_sdk_validates(hostile: dict[str, Any]):
    from tinker.types import TelemetryResponse

    answer = hostile["http"].post("/telemetry", json={"events": []})
    assert TelemetryResponse.model_validate(answer.json()).status == "accepted"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_samples": 0}, "num_samples must be an integer from 1 to 128"),
        ({"num_samples": 100000}, "num_samples must be an integer from 1 to 128"),
        ({"num_samples": "2"}, "num_samples must be an integer"),
        ({"sampling_params": {"temperature": math.nan}}, "temperature must be a finite number"),
        ({"sampling_params": {"temperature": -1.0}}, "temperature must be at least 0"),
        ({"sampling_params": {"top_p": 0}}, "top_p must be greater than 0"),
        ({"sampling_params": {"max_tokens": 0}}, "max_tokens must be a positive integer"),
        ({"prompt": {"chunks": [{"tokens": [1, 99999]}]}}, "every prompt token must be an integer id"),
        ({"prompt": {"chunks": [{"tokens": [-1]}]}}, "every prompt token must be an integer id"),
        ({"prompt": "hello"}, "prompt must be an object"),
    ],
)
def test_bad_sample_requests_are_one_sentence_4xx(
    hostile: dict[str, Any], change: dict[str, Any], message: str
):
    http = hostile["http"]
    session = http.post("/create_session", json={}).json()["session_id"]
    body = {
        "session_id": session, "base_model": "tiny", "num_samples": 1,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
        "sampling_params": {"max_tokens": 3, "temperature": 1.0},
    }
    body.update(change)
    answer = call(http, "/asample", body)
    assert answer["status"] == 400 and message in answer["detail"], answer


def test_malformed_bodies_are_4xx_or_a_terminal_error(hostile: dict[str, Any]):
    http = hostile["http"]
    for endpoint in ("/create_model", "/optim_step", "/save_weights", "/load_weights", "/retrieve_future"):
        deep = b"[" * 6000 + b"]" * 6000
        for body in (
            b"{not json",
            b"[1, 2]",
            b'"text"',
            json.dumps({"model_id": 7, "path": 3}).encode(),
            deep,
        ):
            answer = http.post(endpoint, content=body, headers={"content-type": "application/json"})
            if answer.status_code == 200:  # a promise (extra keys are ignored): its answer is no 500 either
                assert endpoint in ("/create_model", "/load_weights"), (endpoint, body, answer.text)
                polled = http.post("/retrieve_future", json=answer.json())
                assert polled.status_code == 200, polled.text
            else:
                assert 400 <= answer.status_code < 500, (endpoint, body, answer.text)


def test_non_finite_advantages_are_a_terminal_error_and_leave_the_weights_finite(hostile: dict[str, Any]):
    import tinker
    from tinker import types

    from bridges.adapters.tinker.session import open_service

    os.environ.setdefault("TINKER_API_KEY", "tml-local")
    with open_service(hostile["url"]) as service:
        training = service.create_lora_training_client(base_model="tiny", rank=2).result()
        tokens = [3, 4, 5, 6]
        for bad in (math.nan, math.inf, -math.inf):
            datum = types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": np.asarray(tokens[1:], dtype=np.int64),
                    "logprobs": np.zeros(3, dtype=np.float32),
                    "advantages": np.asarray([1.0, bad, 0.5], dtype=np.float32),
                },
            )
            with pytest.raises(tinker.RequestFailedError, match="'advantages' holds a NaN or infinite value"):
                training.forward_backward([datum], "importance_sampling").result()
        step = training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        assert step.metrics["optim/skipped"] == 0.0  # nothing bad was accumulated, so the step is a real one
        weights = hostile["state"].policies[training.model_id].snapshot()
        assert all(bool(t.isfinite().all()) for t in weights.values())
        bad_ids = types.Datum(
            model_input=types.ModelInput.from_ints([1, 2, 10_000]),
            loss_fn_inputs={
                "target_tokens": np.asarray([2, 3, 4], dtype=np.int64),
                "weights": np.ones(3, np.float32),
            },
        )
        with pytest.raises(tinker.RequestFailedError, match="outside the vocabulary"):
            training.forward_backward([bad_ids], "cross_entropy").result()

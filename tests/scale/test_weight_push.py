"""Weights pushed into a running ``bridges.serve`` (issue 27, item 1), with the real openai SDK and real
HTTP: after a push the server's logprobs are the trainer's (fp32, 1e-5), for full weights and for a
LoRA adapter sent as factors, in HTTP bodies or broadcast over a gloo pair (the code NCCL runs on
GPUs); every response carries the version it was sampled under and none mixes two; a push without the
key, off the format, naming what the model lacks, or older than what the server holds is refused in
one sentence and changes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from weight_server import fresh, weight_server

from bridges.grpo.push_channels import CollectiveChannel, HttpChannel, PushRefused
from bridges.grpo.weight_push import payloads
from bridges.models.weight_payload import Payload, encode, lora_scalings
from bridges.server.app import WeightUpdates, serve_in_thread

KEY = "weights-secret"
PROMPT = [{"role": "user", "content": "Say something long."}]


@pytest.fixture
def served(tiny_path: Path, tiny_tokenizer: Any) -> Iterator[tuple[Any, Any]]:
    """A server over its own copy of the tiny model, taking pushes under KEY."""
    with weight_server(tiny_path, tiny_tokenizer, KEY) as served:
        yield served


def payload_bytes(state: dict[str, Any], scalings: dict[str, float], version: int, whole: bool) -> list[bytes]:
    return [encode(p) for p in payloads(state, scalings, version, whole)]


def channel(name: str) -> Any:
    headers = {"Authorization": f"Bearer {KEY}"}
    return HttpChannel(headers) if name == "http" else CollectiveChannel(name, headers)


def push(server: Any, body: bytes, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.base_url}/weights", content=body, headers=headers, timeout=60)


def logprobs_under(model: Any, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0].float()
    start = len(prompt_ids) - 1
    return torch.log_softmax(logits[start : start + len(completion_ids)], -1).gather(
        -1, torch.tensor(completion_ids)[:, None]
    )[:, 0]


async def sample(server: Any, max_tokens: int = 12) -> Any:
    sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    return await sdk.chat.completions.create(
        model="tiny", messages=PROMPT, max_tokens=max_tokens, temperature=1.0
    )


def agrees(response: Any, model: Any) -> float:
    """The largest gap between the server's logprobs and ``model``'s on the same ids."""
    choice = response.choices[0]
    mine = logprobs_under(model, response.prompt_token_ids, choice.token_ids)
    return float((mine - torch.tensor(choice.token_logprobs)).abs().max())


def perturbed(model: Any, seed: int) -> Any:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


@pytest.mark.parametrize("via", ["http", "gloo"])
async def test_a_full_push_makes_the_servers_logprobs_the_trainers(served: Any, tiny_path: Path, via: str):
    server, engine = served
    policy = perturbed(fresh(tiny_path), seed=1)
    before = await sample(server)
    assert before.weight_version == 0 and agrees(before, policy) > 1e-3  # the server still has the checkpoint
    health = httpx.get(f"{server.url}/health").json()
    assert health["weight_channels"] == ["http", "gloo"]  # nccl only where CUDA is
    sender = channel(via)
    (whole,) = payloads(dict(policy.state_dict()), {}, version=7, whole=True)
    assert "lm_head.weight" not in whole.tensors  # tied to the embedding: the server's copy follows it
    await sender.send(server.url, [whole])
    after = await sample(server)
    assert after.weight_version == 7 and agrees(after, policy) < 1e-5
    assert httpx.get(f"{server.url}/health").json()["weight_version"] == 7
    with pytest.raises(PushRefused, match="409: this server holds weight version 7"):  # refused, not broadcast
        await sender.send(server.url, payloads(dict(fresh(tiny_path).state_dict()), {}, version=6, whole=True))
    await sender.send(server.url, payloads(dict(policy.state_dict()), {}, version=8, whole=True))
    assert engine.weight_version == 8 and agrees(await sample(server), policy) < 1e-5
    sender.close()


@pytest.mark.parametrize("via", ["http", "gloo"])
async def test_a_lora_adapter_travels_as_factors_and_replaces_the_last_one(served: Any, tiny_path: Path, via: str):
    from peft import LoraConfig, get_peft_model

    server, _ = served
    base = perturbed(fresh(tiny_path), seed=2)  # the trainer's base differs from the server's checkpoint
    policy = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])).eval()
    scalings = lora_scalings(policy)
    assert len(scalings) == 4 and set(scalings.values()) == {2.0}  # 2 layers x (q, v); alpha / r
    sender = channel(via)
    for version, seed in ((1, 3), (2, 4)):
        with torch.no_grad():  # a trained adapter: B is no longer zero
            for name, param in policy.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(seed)) * 0.5)
        state = {k: v for k, v in policy.state_dict().items()}
        parts = payload_bytes(state, scalings, version, whole=version == 1)
        assert len(parts) == (2 if version == 1 else 1)  # the whole base goes only with the first push
        lora_size = len(parts[-1])
        await sender.send(server.url, payloads(state, scalings, version, whole=version == 1))
        response = await sample(server)
        assert response.weight_version == version and agrees(response, policy) < 1e-5
    assert lora_size < len(parts[0]) or len(parts) == 1
    assert lora_size < 0.5 * len(encode(Payload("full", 0, dict(base.state_dict()))))


async def test_no_response_mixes_two_versions_while_pushes_land(served: Any, tiny_path: Path):
    """Requests in flight during pushes: each answer's logprobs are exactly those of the weights of the
    version it reports (a running batch finishes under the old weights)."""
    server, _ = served
    models = {0: fresh(tiny_path), 1: perturbed(fresh(tiny_path), 5), 2: perturbed(fresh(tiny_path), 6)}

    async def pushes() -> None:
        for version in (1, 2):
            await asyncio.sleep(0.05)
            body = payload_bytes(dict(models[version].state_dict()), {}, version, whole=True)[0]
            reply = await asyncio.to_thread(push, server, body)
            assert reply.status_code == 200

    answers, _ = await asyncio.gather(asyncio.gather(*(sample(server, 24) for _ in range(12))), pushes())
    seen = {a.weight_version for a in answers}
    assert seen <= {0, 1, 2}
    for answer in answers:
        assert agrees(answer, models[answer.weight_version]) < 1e-5


def test_refused_pushes_are_one_sentence_and_change_nothing(
    served: Any, tiny_path: Path, tiny_tokenizer: Any
):
    server, engine = served
    good = dict(fresh(tiny_path).state_dict())
    weight = engine.model.model.layers[0].mlp.up_proj.weight
    kept = weight.detach().clone()
    cases = [
        (push(server, encode(Payload("full", 3, good)), key=None), 401, "missing or wrong weights key"),
        (push(server, encode(Payload("full", 3, good)), key="guess"), 401, "missing or wrong weights key"),
        (push(server, b"\x00" * 100), 400, "not a safetensors file"),
        (push(server, encode(Payload("full", 3, {"no.such.weight": torch.zeros(2)}))), 400, "does not have"),
        (push(server, encode(Payload("full", 3, {"model.norm.weight": torch.zeros(3)}))), 400, "has shape"),
        (
            push(
                server,
                encode(
                    Payload(
                        "lora",
                        3,
                        {"lm_head.lora_A": torch.zeros(2, 64), "lm_head.lora_B": torch.zeros(107, 2)},
                        {"lm_head": 1.0},
                    )
                ),
            ),
            400,
            "tied embeddings",
        ),
        (
            push(
                server,
                encode(
                    Payload(
                        "lora",
                        3,
                        {"model.layers.0.mlp.up_proj.lora_A": torch.zeros(2, 64)},
                        {"model.layers.0.mlp.up_proj": 1.0},
                    )
                ),
            ),
            400,
            "lora_A",
        ),
    ]
    for reply, status, words in cases:
        assert reply.status_code == status and words in reply.json()["error"]["message"], reply.text
    assert (
        push(server, encode(Payload("full", 4, {"model.norm.weight": good["model.norm.weight"]}))).status_code
        == 200
    )
    stale = push(server, encode(Payload("full", 3, good)))
    assert stale.status_code == 409 and "would roll it back" in stale.json()["error"]["message"]
    assert engine.weight_version == 4 and torch.equal(weight, kept)  # only the one good push landed


def test_a_server_without_a_weights_key_takes_no_pushes(hf_engine: Any):
    from bridges.client import EngineClient

    with serve_in_thread(EngineClient(hf_engine, model_name="tiny")) as server:
        reply = push(server, b"{}")
    assert reply.status_code == 403 and "start it with weights_key" in reply.json()["error"]["message"]


def test_a_push_past_max_weights_bytes_is_413_and_reads_no_further(tiny_path: Path, tiny_tokenizer: Any):
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient

    model = fresh(tiny_path)
    engine = HFEngine(model, tiny_tokenizer)
    updates = WeightUpdates(KEY, model, max_bytes=4096)
    with serve_in_thread(EngineClient(engine, model_name="tiny"), updates=updates) as server:
        reply = push(server, encode(Payload("full", 1, dict(model.state_dict()))))
    engine.close()
    assert reply.status_code == 413 and "larger than 4096 bytes (max_weights_bytes)" in reply.json()["error"]["message"]
    assert engine.weight_version == 0


def test_channel_refusals_are_one_sentence_and_nothing_is_broadcast(served: Any, tiny_path: Path):
    """The channel's own routes: a join or a manifest that cannot work is one sentence (nothing is
    broadcast, the weights stay); a store nobody answers on fails the next push with 503, not a hang."""
    import socket

    from bridges.grpo.push_channels import open_channel
    from bridges.models.weight_channel import Manifest
    from bridges.runtime.errors import ConfigError

    server, engine = served
    auth = {"Authorization": f"Bearer {KEY}"}

    def post(path: str, body: Any, headers: dict[str, str] = auth) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/weights{path}", json=body, headers=headers, timeout=60)

    manifest = Manifest.of(Payload("full", 1, dict(fresh(tiny_path).state_dict())), push=0).to_json()
    join = {"host": "127.0.0.1", "port": 9, "prefix": "p/", "backend": "gloo", "timeout_s": 1.0}
    cases = [
        (post("", manifest), 400, "no weight channel is open"),
        (post("/channel", join, headers={}), 401, "missing or wrong weights key"),
        (post("/channel", {"host": "x"}), 400, "a channel join's body must be"),
        (post("/channel", {**join, "backend": "nccl"}), 400, "cannot open an nccl weight channel"),
        (post("/channel", {**join, "backend": "mpi"}), 400, "must be one of ('gloo', 'nccl')"),
        (post("", {"channel": {"push": 1}, "kind": "full"}), 400, "must be a manifest"),
        (post("", {**manifest, "tensors": [["x", "complex64", [2]]]}), 400, "with dtypes among"),
    ]
    for reply, status, words in cases:
        assert reply.status_code == status and words in reply.json()["error"]["message"], reply.text
    with socket.socket() as closed:  # a port nothing listens on: the server's join fails in the background
        closed.bind(("127.0.0.1", 0))
        join["port"] = closed.getsockname()[1]
    assert post("/channel", join).status_code == 200
    broken = post("", manifest)
    assert broken.status_code == 503 and "the weight channel failed" in broken.json()["error"]["message"]
    assert engine.weight_version == 0
    with pytest.raises(ConfigError, match="needs the trainer on CUDA"):
        open_channel("nccl", [["http", "gloo", "nccl"]], "cpu", weights_key=KEY)
    with pytest.raises(ConfigError, match="not every inference server offers it"):
        open_channel("nccl", [["http", "gloo", "nccl"], ["http", "gloo"]], "cuda:1", weights_key=KEY)
    assert open_channel("auto", [["http", "gloo"]], "cuda:1", weights_key=KEY).name == "http"
    assert open_channel("auto", [["http", "gloo"]], "cpu", weights_key=KEY).name == "http"

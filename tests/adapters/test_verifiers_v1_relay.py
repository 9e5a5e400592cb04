"""verifiers' interception server asks our endpoint in-process (``v1_relay``), under 0.3.x and 0.4.x.

The relay replaces an HTTP hop, so what it must keep is everything the hop carried: the same ids and
rewards as the HTTP route (which still serves an interception pool), the same refusals raised as
verifiers' ``EvalClient`` raises an upstream error, and a stream verifiers can read event by event.
CI runs this file under both releases (``.ci/verifiers-0.4``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridges.envs.registry import load_environment
from bridges.workflows.rollouts import run_group


def _client(path: Path) -> Any:
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient

    return EngineClient(HFEngine.from_pretrained(str(path)), model_name="tiny")


def _dialect(path: str) -> Any:
    from verifiers.v1.dialects import DIALECTS

    return next(d for d in DIALECTS if d.upstream_path == path)


async def _rollouts(env: Any, client: Any, count: int) -> list[Any]:
    rows = [dict(env.get_dataset()[i]) for i in range(count)]
    groups = [await run_group(env, row, client, 2, {"seed": i}, model="tiny") for i, row in enumerate(rows)]
    return [state for group in groups for state in group.states]


async def test_calls_go_through_the_relay_and_sample_what_the_http_route_samples(
    tiny_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """By default (one interception server) no call crosses HTTP to our endpoint; with verifiers' pool
    (``env_args.interception.type=elastic``) every call does. Same rows and seeds: the same ids,
    logprobs and rewards either way."""
    from bridges.adapters.verifiers.v1_endpoint import SessionEndpoint
    from bridges.adapters.verifiers.v1_relay import EndpointRelay

    carried = {"http": 0, "relay": 0}
    http_route, relay_answer = SessionEndpoint._chat, EndpointRelay._answer

    async def over_http(self: Any, request: Any) -> Any:
        carried["http"] += 1
        return await http_route(self, request)

    async def in_process(self: Any, *args: Any) -> Any:
        carried["relay"] += 1
        return await relay_answer(self, *args)

    monkeypatch.setattr(SessionEndpoint, "_chat", over_http)
    monkeypatch.setattr(EndpointRelay, "_answer", in_process)
    client = _client(tiny_path)
    relayed = await _rollouts(load_environment("repeat_letter_taskset"), client, 3)
    assert carried == {"http": 0, "relay": 6}
    pooled = await _rollouts(load_environment("repeat_letter_taskset", interception={"type": "elastic"}), client, 3)
    assert carried == {"http": 6, "relay": 6}
    for a, b in zip(relayed, pooled, strict=True):
        assert a.error is None and b.error is None and a.reward == b.reward
        assert [t.completion_ids for t in a.turns] == [t.completion_ids for t in b.turns] != [[]]
        assert a.turns[0].logprobs == pytest.approx(b.turns[0].logprobs, abs=1e-5)


async def test_the_relay_refuses_as_an_upstream_error_and_streams_whole_events(tiny_path: Path):
    """A call the endpoint refuses is verifiers' ``ProviderError`` with the endpoint's status and
    sentence (what ``EvalClient`` raises for an upstream error); a dialect the endpoint does not answer
    is a 404 naming it; a streamed call comes back as complete server-sent events that verifiers' own
    stream parser reads into the reply the plain call gets."""
    from verifiers.v1.dialects.base import is_sse_done_event
    from verifiers.v1.errors import ProviderError
    from verifiers.v1.types import SamplingConfig

    from bridges.adapters.verifiers import v1_endpoint
    from bridges.adapters.verifiers.v1_relay import EndpointRelay

    endpoint = v1_endpoint.SessionEndpoint()  # the relay needs no server: nothing listens
    relay, chat = EndpointRelay(endpoint, _client(tiny_path)), _dialect("/chat/completions")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "a"}], "max_tokens": 3, "seed": 1,
            **endpoint.open_episode("0")}
    sampling = SamplingConfig()
    with pytest.raises(ProviderError) as info:
        await relay.get_response(chat, {**body, v1_endpoint.EPISODE_KEY: "9"}, sampling, session_id="s")
    assert info.value.status_code == 404 and "names no episode being served" in str(info.value)
    with pytest.raises(ProviderError) as info:
        await relay.get_response(chat, body, sampling, session_id="")
    assert info.value.status_code == 400 and "X-Session-ID" in str(info.value)
    with pytest.raises(ProviderError) as info:
        await relay.get_response(_dialect("/responses"), body, sampling, session_id="s")
    assert info.value.status_code == 404 and "answers /chat/completions only, not /responses" in str(info.value)
    plain = await relay.get_response(chat, body, sampling, session_id="s")
    assert plain.raw["choices"][0]["token_ids"] and body[v1_endpoint.EPISODE_KEY] == "0"  # body left as given
    streamed_body = {**body, **endpoint.open_episode("1"), "stream": True}  # its first session: seed 1 as well
    reply = await relay.relay(chat, streamed_body, session_id="s")
    chunks = [chunk async for chunk in reply.chunks]
    await reply.close()
    assert len(chunks) > 2 and all(c.startswith(b"data: ") and c.endswith(b"\n\n") for c in chunks)
    assert is_sse_done_event(chunks[-1]) and reply.content_type == "text/event-stream"
    parser = chat.stream_parser()
    for chunk in chunks:
        if parser.on_done is not None and is_sse_done_event(chunk):
            parser.on_done()
        parser.feed(chunk)
    streamed = parser.finish()
    assert streamed.message.content == plain.message.content  # the same seed, the same reply
    assert [len(r) for r in (endpoint.take("0", "s"), endpoint.take("1", "s"))] == [1, 1]

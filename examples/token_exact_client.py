"""Any engine as an ``openai.AsyncOpenAI``: a two-turn conversation whose second prompt extends the first.

    python examples/token_exact_client.py

The second request sends the whole message list, as any OpenAI-SDK agent does; the client finds
the first turn in its ledger and builds the new prompt from the ids the engine actually sampled
plus only the new message, so ``drift_tokens`` is 0 and nothing is re-tokenised.
"""

from __future__ import annotations

import asyncio

from bridges import EngineClient
from bridges.adapters.hf import HFEngine


async def main() -> None:
    client = EngineClient(HFEngine.from_pretrained("tiny"))
    messages: list = [{"role": "user", "content": "Say something."}]
    first = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, seed=0)
    messages += [first.choices[0].message, {"role": "user", "content": "And again?"}]
    second = await client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, seed=1, extra_body={"return_drift": True}
    )
    reused = len(first.prompt_token_ids) + len(first.choices[0].token_ids)
    assert second.prompt_token_ids[:reused] == first.prompt_token_ids + first.choices[0].token_ids
    print(f"turn 1: {len(first.prompt_token_ids)} prompt ids, sampled {first.choices[0].token_ids}")
    print(f"turn 2: {len(second.prompt_token_ids)} prompt ids, the first {reused} reused from turn 1")
    print(
        f"logprobs per sampled id: {len(second.choices[0].token_logprobs)}; weight_version "
        f"{second.weight_version}; drift_tokens={second.drift_tokens}"
    )


if __name__ == "__main__":
    asyncio.run(main())

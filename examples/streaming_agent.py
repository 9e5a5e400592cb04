"""An agent that streams and forces a tool call, on a real BPE vocabulary: the ledger still holds.

    python examples/streaming_agent.py [model]    # default tiny-qwen3 (needs the vocabs extra)

Turn 1 forces a call to ``lookup`` (``tool_choice`` names it: the client prefills the family's
tool-call opener, which becomes prompt, not sample) and streams it, asking for the 3 likeliest
alternatives of every token; the agent assembles the call from the chunks, answers it, and turn 2's
prompt starts with exactly turn 1's prompt + sampled ids.
"""

from __future__ import annotations

import asyncio
import json
import sys

from bridges import EngineClient
from bridges.adapters.hf import HFEngine

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}}}}]


async def main(model: str) -> None:
    client = EngineClient(HFEngine.from_pretrained(model))
    messages: list = [{"role": "user", "content": "What is stored under a?"}]
    stream = await client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, stream=True, max_tokens=12, seed=0,
        tool_choice={"type": "function", "function": {"name": "lookup"}}, logprobs=True, top_logprobs=3,
    )
    call = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
    prompt, sampled, alternatives = [], [], []
    async for chunk in stream:
        prompt = (chunk.model_extra or {}).get("prompt_token_ids", prompt)  # on the last chunk
        for choice in chunk.choices:
            sampled = (choice.model_extra or {}).get("token_ids", sampled)  # on the finish chunk
            if choice.logprobs and choice.logprobs.content:
                alternatives = [[t.token for t in e.top_logprobs] for e in choice.logprobs.content]
            for delta in choice.delta.tool_calls or []:
                call["id"] += delta.id or ""
                call["function"]["name"] += delta.function.name or ""
                call["function"]["arguments"] += delta.function.arguments or ""
    messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"value": 42})}]
    second = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=8)
    history = prompt + sampled
    assert second.prompt_token_ids[: len(history)] == history
    print(
        f"family: {client.family.name}; streamed call: {call['function']['name']}({call['function']['arguments']!r:.60})"
    )
    print(f"top-3 alternatives of the first sampled token: {alternatives[0]}")
    print(
        f"turn 2 prompt: {len(second.prompt_token_ids)} ids, the first {len(history)} exactly turn 1's prompt + sample"
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "tiny-qwen3"))

"""One agent written three ways — OpenAI Agents SDK, pydantic-ai, LangChain — trained unchanged.

    pip install -e '.[agents]'
    cd examples/agents
    python -m bridges.train env=letter_agents env_args.framework=openai-agents model=tiny-qwen2.5 \
        trainer.max_steps=2 trainer.batch_size=2 trainer.group_size=4

Each agent gets a base URL and a key (its rollout's session) and the dataset row, builds its
framework's client on them exactly as it would for a hosted model, offers the model one function
tool, and returns its final answer. ``AgentEnv`` turns the calls it made into the rollout; the
reward is ``repeat_letter``'s, on the answer the agent returned. ``framework=`` picks the agent.
"""

from __future__ import annotations

from typing import Any

from bridges import AgentEnv, Rubric
from bridges.environments.repeat_letter import build_rows, make_repeat_reward, train_letters


def shout(letter: str, times: int) -> str:
    """Repeat a letter a number of times."""
    return letter * times


def task(row: dict[str, Any]) -> str:
    return str(row["prompt"][-1]["content"])


async def openai_agents_sdk(base_url: str, api_key: str, row: dict[str, Any]) -> str:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # its tracer would post spans to api.openai.com
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    model = OpenAIChatCompletionsModel(model="policy", openai_client=client)  # the session speaks Chat Completions
    agent = Agent(name="letters", instructions="Be brief.", tools=[function_tool(shout)], model=model)
    return str((await Runner.run(agent, task(row), max_turns=4)).final_output)


async def pydantic_ai(base_url: str, api_key: str, row: dict[str, Any]) -> str:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("policy", provider=OpenAIProvider(base_url=base_url, api_key=api_key))
    agent = Agent(model, instructions="Be brief.", tools=[shout], retries=0)
    return str((await agent.run(task(row))).output)


async def langchain(base_url: str, api_key: str, row: dict[str, Any]) -> str:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    shout_tool = tool(shout)
    llm = ChatOpenAI(model="policy", base_url=base_url, api_key=api_key, max_retries=0).bind_tools([shout_tool])
    messages: list[Any] = [HumanMessage(task(row))]
    for _ in range(4):
        reply = await llm.ainvoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            break
        messages += [ToolMessage(shout_tool.invoke(c["args"]), tool_call_id=c["id"]) for c in reply.tool_calls]
    return str(messages[-1].content)


AGENTS = {"openai-agents": openai_agents_sdk, "pydantic-ai": pydantic_ai, "langchain": langchain}


def load_environment(framework: str = "openai-agents", num_train: int = 256, length: int = 6, **kwargs: Any) -> AgentEnv:
    from datasets import Dataset

    from bridges import ConfigError

    if framework not in AGENTS:
        raise ConfigError(f"framework must be one of {', '.join(AGENTS)}, got {framework!r}.")

    def repeated_letter(state: Any, answer: str) -> float:
        return make_repeat_reward(length)([{"role": "assistant", "content": str(state["agent"].result or "")}], answer)

    sampling_args = {"max_tokens": length, **kwargs.pop("sampling_args", {})}
    return AgentEnv(
        AGENTS[framework],
        dataset=lambda: Dataset.from_dict(build_rows(train_letters("abcdefgh", num_train, 0), "{letter}")),
        rubric=Rubric(funcs=[repeated_letter]),
        sampling_args=sampling_args,
        **kwargs,
    )

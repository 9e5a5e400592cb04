"""Integer arithmetic word problems with a calculator tool (tool use, exact-answer reward).

The calculator evaluates a restricted arithmetic grammar by walking the parsed AST, never with
``eval``: a model's tool call is untrusted input, and a policy under RL will find any hole
(``__import__``, attribute access, a ``9**9**9`` that freezes the worker). Bad input comes back
as an ``Error: ...`` string the model can read and recover from, like any other tool result.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections.abc import Callable
from typing import Any

from bridges import ConfigError, Rubric, ToolEnv

MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 10**100
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    pass


def _evaluate(node: ast.AST) -> int | float:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        if not abs(node.value) <= MAX_MAGNITUDE:  # also catches 1e999 == inf
            raise CalculatorError("number too large")
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (
            abs(right) > 64 or (right > 0 and abs(left) ** min(right, 64) > MAX_MAGNITUDE)
        ):
            raise CalculatorError("exponent too large")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        if isinstance(value, complex):
            raise CalculatorError("result is not a real number")
        if abs(value) > MAX_MAGNITUDE:
            raise CalculatorError("result too large")
        return value
    raise CalculatorError(
        f"unsupported syntax '{type(node).__name__}'; use numbers, + - * / // % ** and parentheses"
    )


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: numbers combined with + - * / // % ** and parentheses, e.g. "(12 + 30) * 4".
    """
    expression = str(expression)
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"Error: expression longer than {MAX_EXPRESSION_CHARS} characters"
    try:
        value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    except SyntaxError:
        return f"Error: cannot parse {expression!r} as an arithmetic expression"
    except CalculatorError as exc:
        return f"Error: {exc}"
    except OverflowError:
        return "Error: result too large"
    except RecursionError:
        return "Error: expression nested too deeply"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int) else format(value, ".12g")


def make_problems(count: int, seed: int, max_operand: int = 99) -> list[tuple[str, int]]:
    """``count`` distinct (expression, value) problems with 2-3 operands and an integer result."""
    rng = random.Random(seed)
    problems: dict[str, int] = {}
    for _ in range(count * 50):
        if len(problems) == count:
            break
        terms = [str(rng.randint(2, max_operand)) for _ in range(rng.randint(2, 3))]
        ops = [rng.choice("+-*") for _ in range(len(terms) - 1)]
        expression = terms[0] + "".join(f" {op} {term}" for op, term in zip(ops, terms[1:], strict=True))
        problems.setdefault(expression, int(calculator(expression)))
    if len(problems) < count:
        raise ConfigError(f"cannot generate {count} distinct problems with operands up to {max_operand}.")
    return list(problems.items())


def build_rows(problems: list[tuple[str, int]]) -> dict[str, list[Any]]:
    return {
        "question": [f"What is {expression}?" for expression, _ in problems],
        "answer": [str(value) for _, value in problems],
    }


def last_number(text: str | None) -> str | None:
    numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text or "")
    return numbers[-1].replace(",", "") if numbers else None


def correct_answer(completion: list[dict[str, Any]], answer: str) -> float:
    """1.0 when the last number in the final assistant message equals the answer."""
    final = next((m for m in reversed(completion) if m.get("role") == "assistant"), None)
    number = last_number(final.get("content") if final else None)
    try:
        return float(number is not None and float(number) == float(answer))
    except ValueError:
        return 0.0


def used_calculator(completion: list[dict[str, Any]]) -> float:
    """Metric: did the model call the calculator at least once."""
    return float(any(m.get("role") == "tool" for m in completion))


SYSTEM_PROMPT = (
    "Solve the arithmetic problem. You may use the calculator tool. End with the final answer as a number."
)


def load_environment(
    num_train: int = 1000,
    num_eval: int = 100,
    seed: int = 0,
    max_operand: int = 99,
    max_turns: int = 4,
    max_tokens: int = 256,
    **kwargs: Any,
) -> ToolEnv:
    from datasets import Dataset

    problems = make_problems(num_train + num_eval, seed, max_operand)
    return ToolEnv(
        tools=[calculator],
        max_turns=max_turns,
        dataset=lambda: Dataset.from_dict(build_rows(problems[num_eval:])),
        eval_dataset=lambda: Dataset.from_dict(build_rows(problems[:num_eval])),
        system_prompt=SYSTEM_PROMPT,
        rubric=Rubric(funcs=[correct_answer, used_calculator], weights=[1.0, 0.0]),
        sampling_args={"max_tokens": max_tokens, **kwargs.pop("sampling_args", {})},
        **kwargs,
    )

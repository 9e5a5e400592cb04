"""Check a model's chat template against the token ledger and say whether training on it is safe
(``python -m bridges.check``); the checks themselves are ``bridges.client.template_check``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridges.client.families import FAMILY_NAMES
from bridges.client.template_check import TemplateReport, check_template
from bridges.client.tool_calls import TOOL_PARSERS
from bridges.runs.config import option
from bridges.runtime.errors import ConfigError


@dataclass
class CheckConfig:
    model: str = option("tiny", help="'tiny', 'tiny-<family>', a local folder or a hub id in the cache")
    family: str = option(
        "auto", choices=("auto", *FAMILY_NAMES), help="model family (auto: from the template)"
    )
    tool_parser: str = option(
        "auto", choices=("auto", *TOOL_PARSERS), help="tool-call format (auto: the family's)"
    )
    json: bool = option(False, help="print the report as JSON instead of the summary")
    report: str | None = option(None, help="also write the JSON report to this file")


def load_tokenizer(model: str) -> Any:
    """The model's tokenizer alone (no weights), or one sentence saying why it cannot be loaded."""
    from transformers import AutoTokenizer

    from bridges.models.tiny import resolve_model_path
    from bridges.runs.preflight import check_model

    check_model(model)
    try:
        return AutoTokenizer.from_pretrained(resolve_model_path(model))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model '{model}' has no loadable tokenizer: {str(exc).splitlines()[0]}") from None


def summary(model: str, report: TemplateReport) -> str:
    """The one-screen text form."""

    def mark(ok: bool | None) -> str:
        return "n/a" if ok is None else ("yes" if ok else "NO")

    lines = [
        f"model: {model}",
        f"family: {report.family} (tool calls: {report.tool_format}; reasoning: "
        f"{' '.join(report.reasoning_markers) if report.reasoning_markers else 'none'})",
        f"ledger extends every turn: {mark(report.ledger_extends)}" + "".join(f"\n  - {b}" for b in report.ledger_breaks),
        f"history printed the same as the conversation grows: {mark(not report.history_rewritten)}"
        + "".join(f"\n  - {r}" for r in report.rewrites[:3]),
        f"end of turn: the engine must sample {report.engine_must_emit or 'nothing'}; "
        f"the ledger appends {report.ledger_appends or 'nothing'}",
        f"BOS: {report.bos}",
        f"tool calls round-trip through the {report.tool_format} parser: {mark(report.tool_round_trip)}"
        + (f" ({report.tool_round_trip_detail})" if report.tool_round_trip_detail else ""),
        f"tool_choice opener matches the template: {mark(report.forced_opener_matches)}",
        f"reasoning round-trips: {mark(report.reasoning_round_trip)}",
        f"verdict: {report.verdict()}",
    ]
    return "\n".join(lines)


def run_check(model: str, family: str = "auto", tool_parser: str = "auto") -> TemplateReport:
    tokenizer = load_tokenizer(model)
    return check_template(
        tokenizer, None if family == "auto" else family, None if tool_parser == "auto" else tool_parser
    )


def check(config: CheckConfig) -> int:
    """Print (and optionally save) the template report; exit 1 when training on the template is unsafe."""
    if config.report is not None and not Path(config.report).expanduser().resolve().parent.is_dir():
        raise ConfigError(f"report={config.report!r}: its folder does not exist.")
    report = run_check(config.model, config.family, config.tool_parser)
    document = json.dumps({"model": config.model, **report.as_dict()}, indent=2)
    if config.report is not None:
        Path(config.report).expanduser().write_text(document + "\n")
    print(document if config.json else summary(config.model, report))
    return 0 if report.safe else 1

"""The fidelity table: 1,000 random multi-turn tool episodes per model family through ``EngineClient``.

Each family's tiny random model over its real BPE vocabulary (``model=tiny-<family>``,
bridges/models/family_models.py) plays episodes of 4 turns (bridges/jobs/fidelity.py): tool_choice drawn per turn,
tool results fed back, a quarter streamed. Per family it prints the episodes, the ledger breaks (turns
whose prompt does not extend the previous prompt + sampled ids: the number that must be 0), what a
re-render would have changed (drifted turns, drift tokens; rewritten = other text, retokenized =
same text but other ids), the parser round trip and the template verdict from ``bridges.check``.

    python benchmarks/fidelity.py [--episodes 1000] [--families tiny-qwen3,tiny-llama3]

Last line: families=<n> episodes=<n> ledger_breaks=<n> drifted_turn_fraction=<f>
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bridges.models.tiny import FAMILY_MODEL_NAMES


def run_family(name: str, episodes: int) -> tuple[dict, float, object]:
    from transformers import AutoTokenizer

    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient
    from bridges.client.template_check import check_template
    from bridges.jobs.fidelity import run_fidelity
    from bridges.models.family_models import family_model_path

    path = family_model_path(name)
    check = check_template(AutoTokenizer.from_pretrained(path))
    engine = HFEngine.from_pretrained(str(path), name=name, max_batch_size=64)
    client = EngineClient(engine, model_name=name)
    started = time.perf_counter()
    try:
        report = asyncio.run(run_fidelity(client, client.family.name, episodes))
    finally:
        engine.close()
    return report.as_dict(), time.perf_counter() - started, check


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--families", default=",".join(FAMILY_MODEL_NAMES))
    args = parser.parse_args()
    header = ("| model | family | episodes | turns | ledger breaks | drifted turns (rewritten / retokenized) "
              "| drift tokens | tool-call turns | reasoning turns | parser round-trip | template verdict | seconds |")
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    totals = {"episodes": 0, "breaks": 0, "turns": 0, "drifted": 0}
    for name in args.families.split(","):
        r, seconds, check = run_family(name, args.episodes)
        verdict = check.verdict().split(":")[0]  # type: ignore[attr-defined]
        print(f"| {name} | {r['family']} | {r['episodes']} | {r['turns']} | {r['ledger_breaks']} | "
              f"{r['drifted_turns']} ({r['rewritten_turns']} / {r['retokenized_turns']}) | {r['drift_tokens']} | "
              f"{r['tool_call_turns']} | {r['reasoning_turns']} | "
              f"{'yes' if check.tool_round_trip else 'no'} | {verdict} | {seconds:.0f} |", flush=True)  # type: ignore[attr-defined]
        totals["episodes"] += r["episodes"]
        totals["breaks"] += r["ledger_breaks"]
        totals["turns"] += r["turns"]
        totals["drifted"] += r["drifted_turns"]
    fraction = totals["drifted"] / max(1, totals["turns"])
    print(f"families={len(args.families.split(','))} episodes={totals['episodes']} "
          f"ledger_breaks={totals['breaks']} drifted_turn_fraction={fraction:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One backend learning the embedded default task, exactly as a user runs it: ``python -m bridges.train
backend=<b>`` with nothing else changed (tinker: against the local server), timed end to end.

Run each backend in turn on a quiet machine (``--backend grpo``, ``trl``, ``tinker``, ``verl``), then
``python -m bridges.compare runs=[runs/bench-grpo,...]`` overlays the reward curves. Extra
``key=value`` arguments pass through to ``bridges.train``.

Last line: backend=<b> steps=<n> samples=<n> seconds=<s> first5=<r> last5=<r>
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, choices=["grpo", "trl", "tinker", "verl"])
    parser.add_argument("--output-dir", default="runs")
    args, extra = parser.parse_known_args()
    run_name = f"bench-{args.backend}"
    command = [sys.executable, "-m", "bridges.train", f"backend={args.backend}", f"output_dir={args.output_dir}",
               f"run_name={run_name}", "overwrite=true", "progress=false", *extra]
    if args.backend == "tinker":
        command.append("tinker.base_url=local")
    started = time.perf_counter()
    code = subprocess.call(command)
    seconds = time.perf_counter() - started
    if code != 0:
        print(f"bridges.train exited with {code}", file=sys.stderr)
        return code
    rows = [
        json.loads(x)
        for x in (Path(args.output_dir) / run_name / "metrics.jsonl").read_text().splitlines()
        if x.strip()
    ]
    rewards = [r["reward/mean"] if r.get("reward/mean") is not None else 0.0 for r in rows]
    samples = sum(int(r.get("episodes/total", 0)) for r in rows)
    first5, last5 = sum(rewards[:5]) / len(rewards[:5]), sum(rewards[-5:]) / len(rewards[-5:])
    print(f"backend={args.backend} steps={len(rows)} samples={samples} seconds={seconds:.0f} "
          f"first5={first5:.3f} last5={last5:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

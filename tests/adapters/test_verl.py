"""``BridgesAgentLoop`` inside verl 0.9.1's real agent-loop worker on CPU.

Real: verl's hydra config composed from the overrides ``backend=verl`` builds, our parquet read by
verl's ``RLHFDataset``, our loop instantiated by verl from the YAML we write, verl's padding, masks
and ``rm_scores``. The rollout server is our ``hf`` rollout's own (``HFRolloutServer``, which answers
verl's ``generate(request_id, prompt_ids=..., sampling_params=...)`` with the tiny model), recording
what it sampled so the test can check that the ids verl trains on are exactly those. verl's whole
trainer runs in ``test_verl_main_ppo.py``.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest
from recording_server import RecordingServer as HFServerClient
from verl_harness import N, batch_of, compose, rows_of, run_worker

HERE = Path(__file__).parent


def sampled_runs(row: dict[str, Any]) -> list[list[int]]:
    """The maximal runs of mask-1 ids: one per model turn."""
    runs: list[list[int]] = []
    previous = 0
    for token, mask in zip(row["response"], row["mask"], strict=True):
        if mask and not previous:
            runs.append([])
        if mask:
            runs[-1].append(token)
        previous = mask
    return runs


def assert_trained_ids_are_the_sampled_ids(rows: list[dict[str, Any]], client: HFServerClient) -> None:
    per_trajectory = sorted(
        ([ids for ids, _ in turns], [lp for _, lps in turns for lp in lps])
        for turns in client.sampled.values()
    )
    seen = sorted(
        (sampled_runs(row), [lp for lp, m in zip(row["logprobs"], row["mask"], strict=True) if m])
        for row in rows
    )
    assert len(seen) == len(per_trajectory) == len(rows)
    for (runs, logprobs), (turns, server_logprobs) in zip(seen, per_trajectory, strict=True):
        assert runs == turns  # every sampled id, in order, turn by turn: nothing re-tokenized
        assert logprobs == pytest.approx(server_logprobs, abs=1e-6)


def test_single_turn_env_through_the_real_worker(tmp_path: Path, tiny_path: Path, tiny_tokenizer: Any):
    import bridges_test_trl_envs as envs

    cfg, files = compose(tmp_path, tiny_path, "single")
    client = HFServerClient(str(tiny_path))
    envs.GROUP_CALLS.clear()
    rows = rows_of(run_worker(cfg, batch_of(cfg, files, tiny_tokenizer), client), cfg)
    assert len(rows) == 2 * N
    # each trajectory ran in its own loop, yet the group reward function saw each whole group, once
    assert sorted(envs.GROUP_CALLS) == [[0] * N, [1] * N]
    for first in range(0, 2 * N, N):
        assert max(row["metrics"]["group_rank"] for row in rows[first : first + N]) == 1.0
    assert_trained_ids_are_the_sampled_ids(rows, client)
    for row in rows:
        assert row["valid"] and row["stop"] == "completed" and all(row["mask"])
        assert len(row["response"]) == len(row["logprobs"]) <= 8  # the env's max_tokens per turn
        metrics = row["metrics"]
        assert row["reward"] == pytest.approx(metrics["lowercase_share"] + 0.5 * metrics["group_rank"])
    for i, row in enumerate(rows):  # verl's prompt ids are the template's render of the environment's prompt
        prompt = [{"role": "user", "content": f"Say {i // N}."}]  # rows arrive repeated N times, interleaved
        assert (
            row["prompt"]
            == tiny_tokenizer.apply_chat_template(prompt, add_generation_prompt=True)["input_ids"]
        )


def test_tool_env_masks_the_tool_result_and_matches_the_ledger(
    tmp_path: Path, tool_model_path: Path, tiny_tokenizer: Any
):
    from tool_model import ADD_TOOL, TOOL_PROMPT

    cfg, files = compose(tmp_path, tool_model_path, "tool", "sampling.temperature=0.001")  # near-greedy
    client = HFServerClient(str(tool_model_path))
    rows = rows_of(run_worker(cfg, batch_of(cfg, files, tiny_tokenizer), client), cfg)
    assert_trained_ids_are_the_sampled_ids(rows, client)
    bridge = "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    for row in rows:
        masked = [t for t, m in zip(row["response"], row["mask"], strict=True) if not m]
        assert tiny_tokenizer.decode(masked) == bridge  # only the tool result (and the "\n" closing the turn)
        assert row["reward"] == 1.0 and row["metrics"]["tool_calls"] == 1.0 and row["stop"] == "completed"
        # prompt + response == a from-scratch render of the whole conversation: zero drift
        conversation = [
            *TOOL_PROMPT,
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
            {"role": "tool", "tool_call_id": "c", "content": "5"},
            {"role": "assistant", "content": "The sum is 5."},
        ]
        full = tiny_tokenizer.apply_chat_template(conversation, tools=[ADD_TOOL])["input_ids"]
        ids = row["prompt"] + row["response"]
        assert (
            full[: len(ids)] == ids and len(full) - len(ids) <= 1
        )  # the template's final "\n" is not sampled


def test_response_length_bounds_the_whole_trajectory(tmp_path: Path, tiny_path: Path, tiny_tokenizer: Any):
    cfg, files = compose(tmp_path, tiny_path, "two_turns", "trainer.max_completion_length=12")
    assert cfg.actor_rollout_ref.rollout.response_length == 12
    client = HFServerClient(str(tiny_path))
    rows = rows_of(run_worker(cfg, batch_of(cfg, files, tiny_tokenizer), client), cfg)
    assert max(client.max_tokens) <= 8 and all(len(row["response"]) <= 12 for row in rows)
    for row in rows:
        # the first turn used 8 or fewer ids, the environment's reply ~30 more: the budget ends the trajectory,
        # which is still scored and trained (verl's tool loop does the same)
        assert row["stop"] == "response_length" and row["valid"] and sum(row["mask"]) >= 1
        assert row["reward"] == pytest.approx(
            row["metrics"]["lowercase_share"] + 0.5 * row["metrics"]["group_rank"]
        )


def test_sampling_max_tokens_caps_each_turn_not_the_trajectory(tmp_path: Path, tiny_path: Path, tiny_tokenizer: Any):
    """As on grpo and Tinker: ``sampling.max_tokens`` reaches every model turn (the environment's own cap is
    8), and the trajectory's budget stays ``trainer.max_completion_length``."""
    cfg, files = compose(tmp_path, tiny_path, "two_turns", "sampling.max_tokens=3", "trainer.max_completion_length=200")
    assert cfg.actor_rollout_ref.rollout.response_length == 200
    client = HFServerClient(str(tiny_path))
    rows = rows_of(run_worker(cfg, batch_of(cfg, files, tiny_tokenizer), client), cfg)
    assert client.max_tokens and max(client.max_tokens) == 3
    for row in rows:
        assert row["valid"] and row["stop"] == "max_turns"
        runs = "".join(map(str, row["mask"])).split("0")
        assert [len(r) for r in runs if r] and all(len(r) <= 3 for r in runs if r)
        assert sum(1 for r in runs if r) == 2  # both turns sampled, neither cut by the trajectory's budget


def test_a_raising_environment_is_a_masked_sample_not_a_crash(
    tmp_path: Path, tiny_path: Path, tiny_tokenizer: Any
):
    cfg, files = compose(tmp_path, tiny_path, "raising")
    rows = rows_of(run_worker(cfg, batch_of(cfg, files, tiny_tokenizer), HFServerClient(str(tiny_path))), cfg)
    for row in rows:
        assert not row["valid"] and row["reward"] == 0.0 and not any(row["mask"])
        assert row["stop"] == "env_error" and "the game server is down" in row["error"]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_alone")
def test_the_same_through_agent_loop_manager_and_ray_actors(
    tmp_path: Path, tiny_path: Path, tiny_tokenizer: Any
):
    import ray
    from verl.experimental.agent_loop import AgentLoopManager

    cfg, files = compose(tmp_path, tiny_path, "single")
    repo = HERE.parents[1]
    paths = [str(repo), str(HERE / "envs"), str(repo / "tests" / "support")]
    env_vars = {"PYTHONPATH": os.pathsep.join(paths), "TOKENIZERS_PARALLELISM": "false"}
    env_vars["BRIDGES_CACHE_DIR"] = os.environ["BRIDGES_CACHE_DIR"]
    from local_ray import start_local_ray

    start_local_ray(num_cpus=2, runtime_env={"env_vars": env_vars})
    try:
        manager = AgentLoopManager.create(
            config=cfg, llm_client=HFServerClient(str(tiny_path)), reward_loop_worker_handles=None
        )
        out = manager.generate_sequences(batch_of(cfg, files, tiny_tokenizer))
    finally:
        ray.shutdown()
    rows = rows_of(out, cfg)
    assert len(rows) == 2 * N
    for row in rows:
        assert row["valid"] and all(row["mask"]) and len(row["response"]) <= 8
        assert row["reward"] == pytest.approx(
            row["metrics"]["lowercase_share"] + 0.5 * row["metrics"]["group_rank"]
        )
    assert any(key.startswith("agent_loop/") for key in out.meta_info["timing"])


def test_dry_run_prints_the_command_without_verl(tmp_path: Path):
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['verl'] = None\n"  # verl unimportable, as on a machine without the extra
        "from bridges.train import main\n"
        f"sys.exit(main(['backend=verl', 'env=arithmetic', 'model=tiny', 'dry_run=true', 'output_dir={tmp_path}']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout.strip().splitlines()[-1])
    env = dict(w.split("=", 1) for w in words[: words.index("-m") - 1])
    command = words[len(env) :]
    assert command[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert env["VERL_USE_EXTERNAL_MODULES"].split(",")[-1] == "bridges.adapters.verl.plugin"
    keys = dict(arg.split("=", 1) for arg in command[3:])
    assert (
        keys["algorithm.adv_estimator"] == "bridges_grpo" and keys["actor_rollout_ref.rollout.name"] == "hf"
    )  # no GPU
    assert keys["actor_rollout_ref.rollout.n"] == "16" and keys["actor_rollout_ref.rollout.mode"] == "async"
    run_dir = tmp_path / "verl-arithmetic" / "verl"
    assert keys["actor_rollout_ref.rollout.agent.agent_loop_config_path"] == str(run_dir / "agent_loops.yaml")
    (registration,) = json.loads((run_dir / "agent_loops.yaml").read_text())
    assert registration["name"] == "bridges_arithmetic" and registration["env_id"] == "arithmetic"
    assert registration["_target_"] == "bridges.adapters.verl.agent_loop.BridgesAgentLoop"
    assert registration["run_dir"] == str(run_dir.parent) and registration["provenance"]["backend"] == "verl"
    import pandas as pd

    frame = pd.read_parquet(run_dir / "train.parquet")
    assert len(frame) == 1000 and set(frame["agent_name"]) == {"bridges_arithmetic"}
    first = frame.iloc[0]
    assert first["reward_model"]["ground_truth"] == json.loads(first["extra_info"]["bridges_row"])["answer"]


@pytest.mark.usefixtures("ray_alone")
async def test_each_hf_rollout_replica_computes_on_its_first_workers_gpu(
    tiny_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Ray assigns GPU ids to the workers of a replica (here logical GPUs: the count faked at Ray's own
    resource seam); each replica's server takes its first worker's node and GPU, so eight replicas are
    eight GPUs, not eight copies on cuda:0. Where the worker reads its GPU's UUID, the server finds that
    GPU by UUID in its own order (faked at the UUID seam). Workers without a GPU give a CPU server."""
    import ray

    from bridges.adapters.verl import hf_rollout
    from bridges.adapters.verl.hf_rollout import HFRolloutServer, _first_worker_place, replica_device

    assert replica_device(["3"]) == "cuda:3" and replica_device([]) == "cpu"
    assert replica_device(["3"], "GPU-c") == "cuda-uuid:GPU-c" and replica_device([], "GPU-c") == "cpu"
    from local_ray import start_local_ray

    start_local_ray(num_cpus=2, num_gpus=2)
    try:
        worker = ray.remote(num_cpus=0, num_gpus=1)(type("Worker", (), {"ping": lambda self: 1}))
        cpu_worker = ray.remote(num_cpus=0)(type("CpuWorker", (), {"ping": lambda self: 1}))
        places = [await _first_worker_place([w.remote()]) for w in (worker, worker, cpu_worker)]
    finally:
        ray.shutdown()
    nodes = {node for node, _, _ in places}
    devices = [replica_device(gpus, uuid) for _, gpus, uuid in places]
    assert len(nodes) == 1 and None not in nodes and {uuid for _, _, uuid in places} == {None}  # no CUDA here
    assert sorted(devices[:2]) == ["cuda:0", "cuda:1"] and devices[2] == "cpu"
    assert await _first_worker_place([]) == (None, [], None)  # standalone: no workers, placed by Ray
    monkeypatch.setattr(hf_rollout, "visible_cuda_uuids", lambda: ["GPU-a", "GPU-b", "GPU-c"])
    assert hf_rollout._resolve_device("cuda-uuid:GPU-c") == "cuda:2" and hf_rollout._resolve_device("cpu") == "cpu"
    server = HFRolloutServer(str(tiny_path), device="cpu")
    assert str(server.engine.device) == "cpu"


async def test_a_reply_ended_by_a_stop_string_is_cut_there_as_on_every_backend(tiny_tokenizer: Any):
    """verl's TokenOutput drops the stop string vLLM matched; the engine finds it again in the reply, so
    the client cuts the text at it (the sampled ids stay whole), as with the hf and vLLM engines."""
    from verl.workers.rollout.replica import TokenOutput

    from bridges.adapters.verl.engine import VerlServerEngine
    from bridges.client import EngineClient
    from bridges.envs.types import SamplingParams

    sampled = tiny_tokenizer.encode("yes. END", add_special_tokens=False)  # vLLM stops once "END" is out

    class VllmServers:  # verl's server-manager seam, answering as its vLLM server does
        async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict) -> Any:
            assert sampling_params["stop"] == ["END", "never"]
            return TokenOutput(token_ids=sampled, log_probs=[-0.5] * len(sampled), stop_reason="completed")

    engine = VerlServerEngine(VllmServers(), tiny_tokenizer, base_sampling_params={"temperature": 1.0},
                              response_length=64)
    client = EngineClient(engine, model_name="tiny")
    reply = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                 stop=["END", "never"], max_tokens=32)
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].message.content == "yes. "
    [sample] = await engine.generate([1, 2, 3], SamplingParams(stop=["END", "never"]))
    assert sample.stop_str == "END" and sample.token_ids == sampled  # the ids stay whole

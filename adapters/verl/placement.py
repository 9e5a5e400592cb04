"""Where verl's workers run and with which kernels: GPUs per node and nodes, the rollout, attention.

Decided once, before the command is built:
- **GPUs.** ``verl.trainer.n_gpus_per_node`` (and ``verl.trainer.nnodes``) when the user gives them;
  else, on a Ray cluster that is already running (``RAY_ADDRESS``), the GPU resources its nodes
  declare (read by the node check once it has joined, ``cluster.check_nodes``): the driver often runs
  on a head without GPUs, so its own ``torch.cuda.device_count()`` says nothing about the workers;
  else the GPUs this process sees. ``verl.trainer.device=cpu`` asks for the CPU whatever is there.
  Zero GPUs is CPU mode: the CPU overrides below and ``BRIDGES_VERL_CPU=1`` for the plugin, set only
  then (a stale one in the shell is never forwarded).
- **Attention, as a whole.** verl's default packs a batch's sequences into one row
  (``use_remove_padding``), which is right only with flash-attention's variable-length kernels: under
  sdpa the packed sequences would attend to each other and train on garbage without an error. So:
  flash-attention 2 with remove-padding where ``flash_attn`` imports, else sdpa with remove-padding
  off. The choice is printed in the run's first lines.
- **A cluster that fits.** verl reserves, per GPU, a bundle of ``BUNDLE_CPUS`` CPUs and one GPU, all of
  a node's on that node (CPU mode asks one logical GPU); a running cluster whose nodes cannot hold that
  would wait forever, so it is one sentence saying what to start Ray with (``check_cluster_fits``).
- **Batches.** On GPUs, dynamic batch sizes (micro-batches cut by tokens, not sequences) and rollout
  tensor parallelism 1 for models below ``TP2_PARAMETERS`` (a 0.5B model split over two GPUs only
  pays communication), 2 above where the GPU count allows.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path
from typing import Any

from bridges.runs.train_config import TrainConfig
from bridges.runtime.errors import ConfigError

CPU_FLAG = "BRIDGES_VERL_CPU"  # "1" in every verl process exactly when the run chose CPU mode (launch_env)
CPU_MICRO_BATCH = 256
TP2_PARAMETERS = 7e9  # rollout tensor parallelism 2 from about this size on
TOKENS_PER_GPU = 16384  # verl's own default token budget per micro-batch under dynamic batch sizes
BUNDLE_CPUS = 3  # verl's ResourcePoolManager: max_colocate_count CPUs beside each GPU it reserves


@dataclasses.dataclass(frozen=True)
class NodeResources:
    """What one alive node of a running Ray cluster declares (``cluster.check_nodes``)."""

    address: str
    cpus: float
    gpus: int


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested settings tree (``verl.*``) as dotted keys, the form of verl's hydra overrides."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@dataclasses.dataclass(frozen=True)
class GpuLayout:
    """GPUs per node and nodes verl is told to use (0 GPUs: CPU mode), and where that came from."""

    gpus_per_node: int
    nnodes: int
    source: str

    @property
    def total(self) -> int:
        return self.gpus_per_node * self.nnodes


def gpu_layout(config: TrainConfig, cluster_gpus: list[int] | None = None) -> GpuLayout:
    """The layout for ``config``; ``cluster_gpus``: the GPU resources each alive node of a running
    cluster declares (None: no cluster was joined)."""
    verl = flatten(config.verl)
    if verl.get("trainer.device") == "cpu":
        return GpuLayout(0, 1, "verl.trainer.device=cpu")
    if "trainer.n_gpus_per_node" in verl:
        return GpuLayout(int(verl["trainer.n_gpus_per_node"]), int(verl.get("trainer.nnodes", 1)), "verl.trainer.*")
    if cluster_gpus is not None:
        with_gpus = [n for n in cluster_gpus if n > 0]
        if not with_gpus:
            return GpuLayout(0, 1, "the Ray cluster declares no GPU")
        # verl asks every node for the same number: the smallest GPU node sets it
        return GpuLayout(min(with_gpus), len(with_gpus), f"the Ray cluster's {len(with_gpus)} GPU node(s)")
    import torch

    return GpuLayout(torch.cuda.device_count(), 1, "this machine")


def rollout_name(config: TrainConfig, gpus: int) -> str:
    """``engine=`` as verl's rollout: hf (transformers, this project's backend) or vllm; auto picks vllm
    only where it can run (a GPU and the package)."""
    if config.engine == "auto":
        return "vllm" if gpus > 0 and importlib.util.find_spec("vllm") is not None else "hf"
    return config.engine


def attention(gpus: int) -> tuple[dict[str, Any], str]:
    """The attention kernel and remove-padding, chosen together, and the sentence the run prints."""
    if gpus > 0 and importlib.util.find_spec("flash_attn") is not None:
        keys = {"actor_rollout_ref.model.use_remove_padding": True,
                "+actor_rollout_ref.model.override_config.attn_implementation": "flash_attention_2"}
        return keys, "verl attention: flash_attention_2 with remove-padding (flash_attn is installed)"
    keys = {"actor_rollout_ref.model.use_remove_padding": False,
            "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa"}
    why = "no GPU" if gpus == 0 else "flash_attn is not installed; pip install flash-attn for packed batches"
    return keys, f"verl attention: sdpa without remove-padding ({why})"


def parameter_count(model_path: str) -> float:
    """About how many parameters the model at ``model_path`` has, from its config alone (0 when the
    config cannot be read here: verl reads it later and says why; tensor parallelism then stays 1)."""
    from transformers import AutoConfig

    try:
        c = AutoConfig.from_pretrained(model_path)
    except (OSError, ValueError):
        return 0.0
    hidden, layers = c.hidden_size, c.num_hidden_layers
    kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or hidden // c.num_attention_heads
    attention_params = 2 * hidden * hidden + 2 * hidden * kv * head_dim
    mlp = 3 * hidden * (getattr(c, "intermediate_size", None) or 4 * hidden)
    embeddings = c.vocab_size * hidden * (1 if getattr(c, "tie_word_embeddings", False) else 2)
    return float(layers * (attention_params + mlp) + embeddings)


def placement_overrides(config: TrainConfig, layout: GpuLayout, model_path: str | Path) -> dict[str, Any]:
    """Devices, parallelism, batching and attention for ``layout`` (the CPU's own overrides at 0 GPUs:
    the platform and patches come from the plugin, ``BRIDGES_VERL_CPU``)."""
    gpus = layout.gpus_per_node
    rollout = rollout_name(config, gpus)
    tp2 = rollout == "vllm" and layout.total % 2 == 0 and parameter_count(str(model_path)) >= TP2_PARAMETERS
    keys: dict[str, Any] = {
        "actor_rollout_ref.rollout.name": rollout,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 2 if tp2 else 1,
        "trainer.n_gpus_per_node": max(1, gpus),
        "trainer.nnodes": layout.nnodes,
        **attention(gpus)[0],
    }
    if gpus > 0:
        return keys | {"actor_rollout_ref.actor.use_dynamic_bsz": True,
                       "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": TOKENS_PER_GPU}
    if not os.environ.get("RAY_ADDRESS"):  # a cluster already running has its resources (ray start)
        keys |= {
            "+ray_kwargs.ray_init.num_gpus": 1,  # verl counts only GPU resources: one logical slot
            "ray_kwargs.ray_init.num_cpus": max(4, os.cpu_count() or 1),
        }
    return keys | {
        "trainer.device": "cpu",
        "actor_rollout_ref.actor.strategy": "fsdp2",  # FSDP1 insists on syncing module states on a device
        "actor_rollout_ref.ref.strategy": "fsdp2",
        "actor_rollout_ref.rollout.agent.num_workers": 1,
        "reward.num_workers": 1,
        "data.dataloader_num_workers": 0,
        # the hf rollout computes logprobs with the actor's own model and dtype (measured difference
        # < 3e-4), so they serve as the old logprobs and verl skips recomputing them
        "algorithm.rollout_correction.bypass_mode": True,
        # one CPU "device" holds the whole batch of a small model: fewer, larger passes (measured on
        # the default task: update_actor 1.7 s -> 0.9 s per step at 16 x 16 rollouts)
        **{
            key: min(CPU_MICRO_BATCH, config.trainer.batch_size * config.trainer.group_size)
            for key in (
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
            )
        },
    }


def check_cluster_fits(layout: GpuLayout, nodes: list[NodeResources]) -> None:
    """The running cluster holds what verl will reserve (``layout.nnodes`` nodes, each with its GPUs and
    ``BUNDLE_CPUS`` CPUs per GPU), or one sentence: verl would otherwise fail on "Total available GPUs 0"
    or wait with no end for a placement no node can take."""
    per_node = max(1, layout.gpus_per_node)
    cpus = BUNDLE_CPUS * per_node
    if sum(n.gpus >= per_node and n.cpus >= cpus for n in nodes) >= layout.nnodes:
        return
    have = "; ".join(f"{n.address} {n.cpus:g} CPU + {n.gpus} GPU" for n in nodes) or "no alive node"
    kind = "GPU(s)" if layout.gpus_per_node else "logical GPU (CPU mode counts one)"
    raise ConfigError(
        f"verl will reserve {layout.nnodes} Ray node(s) with {per_node} {kind} and {cpus} CPUs each "
        f"({BUNDLE_CPUS} CPUs beside every GPU), but the cluster's nodes declare {have}; start each with ray start "
        f"--num-cpus={cpus} --num-gpus={per_node} (or more), or set verl.trainer.n_gpus_per_node and nnodes to fit."
    )


def check_batch_fits(config: TrainConfig, layout: GpuLayout) -> None:
    """verl splits each step's ``batch_size x group_size`` rollouts evenly over its GPUs (its own assert,
    minutes in): one sentence before anything starts."""
    rollouts = config.trainer.batch_size * config.trainer.group_size
    if layout.total > 0 and rollouts % layout.total:
        raise ConfigError(
            f"trainer.batch_size x trainer.group_size = {rollouts} rollouts per step do not divide among verl's "
            f"{layout.total} GPUs ({layout.gpus_per_node} per node x {layout.nnodes} node(s), from {layout.source}); "
            "change either, or set verl.trainer.n_gpus_per_node."
        )

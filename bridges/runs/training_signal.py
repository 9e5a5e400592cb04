"""What one scored episode becomes on each backend: the one record of where the four agree and where they
keep their own behaviour. ``dry_run=true`` prints the chosen backend's column; ``docs/guide/backends.md``
holds the whole table, rendered from here (``tests/test_docs.py`` keeps the two equal).

The trained tokens are the same on all four (ids, masks, the sampler's logprobs). What follows them is
aligned where a setting has one meaning — group advantages, failed rollouts, the clip of a loss that has
none — and stated here where a framework's users expect its own: a ``trainer.*`` key that a backend would
silently ignore is refused by that backend instead (``refuse_ignored_keys`` and each backend's checks).
"""

from __future__ import annotations

BACKENDS = ("grpo", "trl", "verl", "tinker")
SAME_AS_GRPO = "as grpo"

# aspect -> its meaning on each backend (SAME_AS_GRPO where it is grpo's, to the constant)
ASPECTS: dict[str, dict[str, str]] = {
    "group advantages": {
        "grpo": "(r - mean) / (sample std + 1e-6) over the group's valid members; `dr_grpo`: r - mean; a group "
                "with < 2 valid members or one reward contributes nothing",
        "trl": "(r - mean) / (sample std + 1e-4) over the group's valid members (TRL's `scale_rewards=group`; "
               "`dr_grpo` sets `none`: r - mean)",
        "verl": "(r - mean) / (sample std + 1e-6) over the group's valid members (`algorithm.adv_estimator="
                "bridges_grpo`: verl's own function on the valid members)",
        "tinker": SAME_AS_GRPO,
    },
    "a failed rollout": {
        "grpo": "masked, out of its group's baseline, counted with its reason",
        "trl": "masked, out of its group's baseline",
        "verl": "a fully masked placeholder sample, out of its group's baseline",
        "tinker": SAME_AS_GRPO,
    },
    "loss over a step (`trainer.loss_aggregation`)": {
        "grpo": "`sample`: each sample's token mean, averaged over the samples with signal; `token`: one mean over "
                "their loss tokens; `dr_grpo`: token sums over `max_completion_length`",
        "trl": "loss_type `grpo` / `dapo` / `dr_grpo`: grpo's three, over every sequence of the step (groups "
               "without signal too): equal up to one factor a step",
        "verl": "`seq-mean-token-mean` / `token-mean` / `seq-mean-token-sum-norm` (`loss_scale_factor` = "
                "`max_completion_length`): grpo's three, over every sequence of the step: equal up to one factor",
        "tinker": "grpo's: each datum's advantages carry the step's normaliser, so the service's token sum is "
                  "the same mean",
    },
    "`sampling.max_tokens`": {
        "grpo": "tokens per model turn (None: the environment's own cap)",
        "trl": "tokens per model turn, through the `rollout_func`; also a single-turn environment's "
               "`max_completion_length`",
        "verl": "tokens per model turn, through the agent loop; also a single-turn environment's "
                "`max_response_length`",
        "tinker": SAME_AS_GRPO,
    },
    "an episode over its budget (`trainer.max_completion_length`)": {
        "grpo": "no episode budget: turns end at their own cap, episodes at the environment's stops; "
                "`max_completion_length` sizes the engine and `dr_grpo`'s constant",
        "trl": "cut after sampling at `max_completion_length`, the whole episode's reward kept",
        "verl": "each turn capped by what is left of `max_response_length`; the episode ends `response_length` "
                "and is trained",
        "tinker": SAME_AS_GRPO,
    },
    "off-policy samples (`trainer.num_batches_ahead`)": {
        "grpo": "unset: one batch ahead (generation of step k+1 overlaps training on step k); 0: synchronous; ratio "
                "against the sampler's logprobs, clipped at `epsilon`/`epsilon_high`, truncated at `ratio_cap`",
        "trl": "unset or 0: synchronous (more is refused); old logprobs recomputed, so the ratio is 1 on one "
               "iteration",
        "verl": "unset or 0: synchronous (more is refused); ratio against verl's recomputed old logprobs, dual clip "
                "at `ratio_cap`",
        "tinker": "unset: one batch ahead; 0: synchronous; `importance_sampling` has no clip (`epsilon` refused), "
                  "`ppo` clips at `epsilon`, `cispo` truncates at `ratio_cap`",
    },
    "a broken ledger (`trainer.ledger_breaks`)": {
        "grpo": "`auto`/`every`: each segment a sample with the episode's advantage; `first`: the first segment "
                "only; the rest counted in `samples/breaks`",
        "trl": "`auto`/`first`: the first segment only (its one sequence a rollout; `every` refused), the rest "
               "counted in `samples/breaks`",
        "verl": "`auto`/`first`: the first segment only (its one sequence a rollout; `every` refused), the rest "
                "counted in `samples/breaks`",
        "tinker": SAME_AS_GRPO,
    },
    "KL (`trainer.beta` > 0)": {
        "grpo": "k3 to a frozen reference, in each sample's token mean",
        "trl": "k3, weighted by the ratio",
        "verl": "verl's `kl_loss` (low_var_kl), token mean",
        "tinker": "refused",
    },
    "sampling settings": {
        "grpo": "the environment's `sampling_args` whole",
        "trl": "the environment's `sampling_args`, TRL's temperature, top_p and top_k on top; TRL's "
               "`repetition_penalty`, `min_p` and "
               "`generation_kwargs` are refused for a multi-turn environment (its turns sample without them)",
        "verl": "verl's temperature, top_p and top_k (its trainer recomputes logprobs under them); the "
                "environment's `max_tokens` and stops",
        "tinker": "the environment's `sampling_args` whole (stop strings or stop ids, one kind a request; the "
                  "local server as the service)",
    },
}


def meaning(aspect: str, backend: str) -> str:
    said = ASPECTS[aspect][backend]
    return ASPECTS[aspect]["grpo"] if said == SAME_AS_GRPO else said


def describe_signal(backend: str) -> str:
    """``dry_run=true``'s lines for one backend (none for a backend this table does not cover)."""
    if backend not in BACKENDS:
        return ""
    lines = "".join(f"#   {aspect}: {meaning(aspect, backend)}\n" for aspect in ASPECTS)
    return f"# what an episode becomes on backend={backend} (docs/guide/backends.md)\n{lines}"


def signal_table() -> str:
    """The whole table, as docs/guide/backends.md shows it."""
    head = "| | " + " | ".join(f"`{b}`" for b in BACKENDS) + " |\n|---|" + "---|" * len(BACKENDS) + "\n"
    rows = "".join(f"| {aspect} | " + " | ".join(ASPECTS[aspect][b] for b in BACKENDS) + " |\n" for aspect in ASPECTS)
    return head + rows

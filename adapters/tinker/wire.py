"""The three protobuf messages of the Tinker wire format the local server must speak.

The tinker 0.38 SDK sends ``forward_backward`` as a ``ForwardBackwardRequest`` and accepts
``SampleResponse``/``ForwardBackwardOutput`` results only as protobuf; the schema ships inside the
SDK (``tinker.proto.tinker_public_pb2``), so the server reuses it rather than a copy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from bridges.adapters.tinker.local_model import SampledSequence, TrainDatum


def parse_forward_backward(body: bytes, vocab_size: int) -> tuple[dict[str, Any], list[TrainDatum]]:
    """Request fields (model_id, seq_id, loss_fn, loss_fn_config, forward_only) and the datums.

    Token ids outside the vocabulary and non-finite loss inputs (advantages, logprobs) are refused
    in one sentence: one NaN advantage would make every weight NaN at the next optim_step.
    """
    from tinker.proto import tinker_public_pb2 as pb
    from tinker.proto.response_conv import _tensor_data_from_proto

    request = pb.ForwardBackwardRequest()
    request.ParseFromString(body)
    data: list[TrainDatum] = []
    for datum in request.data:
        tokens: list[int] = []
        for chunk in datum.model_input:
            if chunk.WhichOneof("chunk") != "encoded_text":
                raise ValueError("the local Tinker server takes text token chunks only (no images).")
            tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
        inputs = {}
        for name, tensor in datum.loss_fn_inputs.items():
            array = _tensor_data_from_proto(tensor).to_numpy()
            inputs[name] = torch.from_numpy(np.ascontiguousarray(array)).reshape(-1)
            if inputs[name].is_floating_point() and not bool(torch.isfinite(inputs[name]).all()):
                raise ValueError(f"datum {len(data)}'s loss_fn_input '{name}' holds a NaN or infinite value.")
        if "target_tokens" not in inputs or len(inputs["target_tokens"]) != len(tokens):
            raise ValueError("every datum needs target_tokens with one entry per model_input token.")
        ids = [*tokens, *inputs["target_tokens"].long().tolist()]
        if ids and not 0 <= min(ids) <= max(ids) < vocab_size:
            raise ValueError(
                f"datum {len(data)} has a token id outside the vocabulary (0..{vocab_size - 1})."
            )
        data.append(TrainDatum(tokens, inputs))
    if not all(math.isfinite(v) for v in request.loss_fn_config.values()):
        raise ValueError("loss_fn_config holds a NaN or infinite value.")
    fields = {
        "model_id": request.model_id,
        "seq_id": request.seq_id,
        "loss_fn": request.loss_fn,
        "loss_fn_config": dict(request.loss_fn_config),
        "forward_only": request.forward_only,
    }
    return fields, data


def forward_backward_output(logprobs: Sequence[Sequence[float]], loss: float) -> bytes:
    """``ForwardBackwardOutput``: one ``ArrayRecord`` with each datum's target logprobs, and ``loss:sum``."""
    from tinker.proto import tinker_public_pb2 as pb

    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    record = out.loss_fn_outputs.add()
    record.type_tag = "ArrayRecord"
    record.num_datums = len(logprobs)
    field = record.fields["logprobs"]
    field.dtype = pb.DTYPE_FLOAT32
    arrays = [np.asarray(values, dtype=np.float32) for values in logprobs]
    field.data = b"".join(a.tobytes() for a in arrays)
    offsets = np.cumsum([0, *(a.nbytes for a in arrays)], dtype=np.int64)
    field.offsets = offsets.tobytes()
    out.metrics["loss:sum"] = float(loss)
    return out.SerializeToString()


def sample_response(
    sequences: Sequence[SampledSequence], prompt_logprobs: Sequence[float] | None = None
) -> bytes:
    from tinker.proto import tinker_public_pb2 as pb

    response = pb.SampleResponse()
    for sequence in sequences:
        item = response.sequences.add()
        item.stop_reason = pb.STOP_REASON_STOP if sequence.stop_reason == "stop" else pb.STOP_REASON_LENGTH
        item.tokens = np.asarray(sequence.tokens, dtype=np.int32).tobytes()
        item.logprobs = np.asarray(sequence.logprobs, dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        response.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return response.SerializeToString()

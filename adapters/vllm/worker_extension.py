"""Runs inside each vLLM worker process (``worker_extension_cls``): receives new full weights.

vLLM's model classes accept Hugging Face parameter names in ``load_weights`` and do their own
fusing (qkv, gate/up), so the trainer can send its ``state_dict`` unchanged. The tensors do not travel
through ``collective_rpc`` themselves (pickled, they would cross to host memory and back each step):
the trainer packs them a bucket at a time into one buffer both processes map
(``bridges.models.weight_buckets``: CUDA IPC on a GPU, shared memory on a CPU), and only the buffer's
handle and each tensor's place in it are sent. The worker views the bucket in place and loads it.
"""

from __future__ import annotations

from typing import Any


class WeightSyncExtension:
    """Mixed into vLLM's worker class; ``self.model_runner`` is the worker's model runner."""

    _bucket_receiver: Any = None

    def load_weight_bucket(self, handle: Any, slots: list[Any]) -> int:
        """Load one bucket from the trainer's shared buffer (opened once per buffer); on return the
        trainer may overwrite the bucket: the copy into the model has run (synchronised on a GPU)."""
        import torch

        from bridges.models.weight_buckets import BucketReceiver

        if self._bucket_receiver is None:
            self._bucket_receiver = BucketReceiver()
        views = self._bucket_receiver.views(handle, slots)
        model = self.model_runner.model  # type: ignore[attr-defined]
        device = next(model.parameters()).device
        model.load_weights(weights=[(name, view.to(device)) for name, view in views.items()])
        count = len(views)
        del views
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return count

    def close_weight_buffer(self) -> None:
        """The update is over: drop this worker's mapping of the trainer's buffer before the trainer frees it."""
        if self._bucket_receiver is not None:
            self._bucket_receiver.close()

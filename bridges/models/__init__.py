"""Models: where a policy's weights come from and how they are placed.

Holds device/dtype/attention placement and the one model loader (``hardware``), the embedded tiny
model and the random-weight family builds (``tiny``, ``family_models``, ``local_models``, ``chat-templates/``)
and the chunked per-token logprob computation every trainer shares (``token_logprobs``), and how a
model's weights travel to another process (``weight_payload``, ``weight_channel``, ``weight_buckets``).

May import: ``bridges.runtime``. Must not import environments, the client, runs or any backend: a model
knows nothing of who samples from it or trains it.
"""

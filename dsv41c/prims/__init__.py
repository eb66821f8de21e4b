"""The model's primitive math: one plain function of tensors per primitive (spec §3).

Attention with sinks, the compressor, the indexer and its top-k, MoE, mHC, Engram,
RoPE, norms and the KV-path fake quantization. The eager reference model
(`dsv41c.frontend.model`) composes them; the `dsv41` domain ops (`dsv41c.ops`) run them as
their eager implementations, so the compiled plan and the oracle cannot drift apart. This
is a leaf package: the runtime imports it, and it imports nothing from the compiler.
"""

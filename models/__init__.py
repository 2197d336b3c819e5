"""The model library: open_clip models (built from a ``ModelSpec``), the offline default model,
embedding checkpoints, zero-shot taxonomy and the registry of model versions.

Training and the embedding API both build on it; it depends on ``p2p.shared`` only.
"""

"""Benchmarks for stair_es: sparse search latency and scale against dense (FAISS) baselines.

Config files in ``benchmarks/configs`` plus one runner (``python -m benchmarks.run CONFIG`` or
``stair-es bench CONFIG``) that writes JSON, Markdown and PNG reports into
``benchmarks/results/<config-name>/``. Corpora are generated (seeded, vectorised) and cached under
``benchmarks/.cache/``. Each system runs in its own subprocess so its peak memory is its own.
"""

"""Models to runtime formats: GGUF via the pinned llama.cpp converter, and the exact Q4_0 repack.

- :mod:`edgekit.prepare.pipeline` (above this package and edgekit.align): ``edgekit convert`` / ``repack`` /
  ``verify`` entry points;
- :mod:`edgekit.convert.gguf_stage`: one model → one checked GGUF artifact in the store;
- :mod:`edgekit.convert.qat` + :mod:`edgekit.convert.repack`: exact Q4_0 for QAT weights;
- generated test models live in :mod:`edgekit.tinymodels`.
"""

"""Research tooling for the CPU miner, apart from the runtime: the synthetic figure generator
(``synth``), the evaluators (``evaluate``, ``eval_panels``, ``eval_markers``, ``eval_captions``),
the naive XY-cut reference (``xycut``) and the trainers of the shipped model files (``train_*``,
whose commands ``p2p.mining.artifacts``' MANIFEST.json records).

Workers never import this package (``tests/test_mining_layout.py``); the CLI's ``p2p synth`` and
``p2p eval`` and the benchmarks do.
"""

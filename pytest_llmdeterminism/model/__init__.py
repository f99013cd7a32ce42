"""The ``llm_model`` fixture object above the engines: inputs (``inputs.py``), fixed-shape generation
(``llm_model.py``), the batch-invariance probe (``probe.py``), the fingerprint of a loaded model
(``fingerprint.py``), and the determinism audit on top of them (``audit.py``)."""

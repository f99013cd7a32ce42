"""The judgement of a golden check, pure: verdicts and their facts (``verdict``), golden against
actual (``compare``), the tolerance profiles (``tolerance``), what a fingerprint's fields mean
(``fingerprint``), one judgement under the effective profile (``judgement``) and what a check
decides (``decision``). No pytest, torch or I/O, and no import from the outer floors (engines,
model, run, reporting, cli): ``tests/unit/test_layers.py`` keeps it so. A check's walk comes down
here once, with this run's output and the golden, and goes back up once, with a ``Decision``."""

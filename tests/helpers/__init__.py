"""What the tests share, imported as ``tests.helpers`` (a test module never imports another, and
``tests/conftest.py`` holds fixtures and hooks only).

- ``models``: copies of the tiny model and the SmolLM2 GGUF file, changed on purpose.
- ``projects``: the suites pytester projects are made of, the project builder, the ``llm-golden``
  runner and the golden reader.
- ``llama_server``, ``fake_openai_server``, ``sessions``, ``strategies``: a llama.cpp server, a
  hostile OpenAI-compatible one, emulated Pythons run as sessions, hypothesis strategies.
- the rest: what the tests of one subject share across tiers (``tests/unit/PACKAGE/test_x.py`` and
  ``tests/pytester/test_x_runs.py`` import ``tests.helpers.x``).
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout
DATA = ROOT / "tests" / "data"  # goldens committed for the tests

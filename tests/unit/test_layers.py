"""The package's house: every module sits on a layer and imports only from layers below it.

Any import counts: absolute or relative, at module level, inside a function, under
``TYPE_CHECKING``, from the package root, or through ``importlib.import_module`` with a literal
name. A strict order of layers also rules out every import cycle. A new module must be given its
layer here (the docs' design page renders this table), so the picture cannot drift from the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

# By its path, not tests.helpers: docs/hooks.py loads this file from its path to draw the map.
PACKAGE = Path(__file__).resolve().parents[2] / "pytest_llmdeterminism"

# Each package is a block of layers, lowest first; a line may import only from the lines above it.
# The pure core sits flat at the package root; ``strategies`` and ``plugin`` are its top, and the
# root's ``__init__`` (the public surface, which exports from every layer) sits above them.
PACKAGES = {
    "core": [["errors"], ["shape", "sampling"], ["decoding"], ["generation"]],
    "compute": [["compute.profiles"],
                ["compute.numerics", "compute.determinism", "compute.threads", "compute.private_folder"],
                ["compute.environment", "compute.fixed_order"], ["compute.tensor_ops", "compute.experts"],
                ["compute.kernels"],
                ["compute"]],
    "engines": [["engines.registry", "engines.server", "engines.server.secret", "engines.cached",
                 "engines.checkpoint", "engines.defect"],
                ["engines.capture", "engines.spec"],
                ["engines.hub", "engines.loaded", "engines.server.completions"],
                ["engines.fingerprints", "engines.hf_phases", "engines.hf_speculative"], ["engines.hf"],
                ["engines.hf_load", "engines.llamacpp", "engines.server.server_client", "engines.vllm"],
                ["engines.server.prompts"], ["engines.server.server_score"],
                ["engines.server.openai", "engines.server.companions"],
                ["engines", "engines.companions"]],
    # The pure judgement (no pytest, torch or I/O: test_the_judgement_is_pure below), above the engines
    # only to read their registry (engines/registry.py: each engine's fingerprint fields, pure data).
    "judge": [["judge", "judge.verdict", "judge.eval_gate"], ["judge.compare"],
              ["judge.tolerance", "judge.fingerprint"], ["judge.judgement"], ["judge.decision"]],
    # A kind of golden is one module of goldens/kinds/ plus one line of its registry (goldens.kinds).
    "goldens": [["goldens", "goldens.fields", "goldens.atomic"],
                ["goldens.kinds.generation", "goldens.kinds.score", "goldens.kinds.eval"], ["goldens.kinds"],
                ["goldens.schema"],
                ["goldens.codec", "goldens.consistency"],
                ["goldens.store"], ["goldens.files", "goldens.judged"],
                ["goldens.review"], ["goldens.acceptance"]],
    "reporting": [["reporting", "reporting.records", "reporting.text", "reporting.audit",
                   "reporting.run_header", "reporting.progress"],
                  ["reporting.recorder", "reporting.hints", "reporting.markdown_report",
                   "reporting.html_report", "reporting.score_failure"],
                  ["reporting.failure", "reporting.terminal", "reporting.documents"],
                  ["reporting.run_comparison"]],
    # The llm_model fixture object over the engines, and the audit on top of it.
    "model": [["model", "model.inputs"], ["model.fingerprint"],
              ["model.probe", "model.concurrency", "model.served_sampling"],
              ["model.evaluate"], ["model.llm_model", "model.serving_audit"],
              ["model.decode_prefill"], ["model.audit"]],
    "run": [["run", "run.options", "run.ledger", "run.unused", "run.prune_trust"],
            ["run.configuration", "run.repro"],
            ["run.markers", "run.golden_tokens", "run.writer"],
            ["run.session", "run.suites"], ["run.shards"], ["run.merge_writer"]],
    "cli": [["cli.project", "cli.tokenizer"],
            ["cli.show", "cli.diff", "cli.accept", "cli.merge", "cli.fetch", "cli.perturb", "cli.compare",
             "cli.eval_diff"],
            ["cli.review"], ["cli"], ["cli.__main__"]],
    "top": [["strategies", "plugin"], ["__init__"]],
}
LAYERS = [line for block in PACKAGES.values() for line in block]
PACKAGE_OF = {module: name for name, block in PACKAGES.items() for line in block for module in line}
LAYER = {module: number for number, modules in enumerate(LAYERS) for module in modules}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _module_of(name: str) -> str:
    """The module of this package that ``pytest_llmdeterminism[.a.b]`` names: the longest known
    prefix; the package itself, or a name taken from it, is ``__init__``."""
    module = name.removeprefix("pytest_llmdeterminism").lstrip(".")
    while module and module not in LAYER:  # a name imported from a module: the module
        module = module.rpartition(".")[0]
    return module or "__init__"


def package_imports(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, module) for every import of a module of this package in ``path``."""
    package = ["pytest_llmdeterminism", *path.parent.relative_to(root).parts]  # what `.` means here
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            names = [f"{base}.{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and getattr(node.func, "attr", getattr(node.func, "id", ""))
              in ("import_module", "__import__")):
            names = [str(node.args[0].value)]
        else:
            continue
        modules = {_module_of(name) for name in names
                   if name == "pytest_llmdeterminism" or name.startswith("pytest_llmdeterminism.")}
        found += [(node.lineno, module) for module in sorted(modules)]
    return found


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "tiny" not in p.parts)


def test_every_module_has_a_layer():
    assert sorted(module_name(p) for p in SOURCES if module_name(p) not in LAYER) == []


@pytest.mark.parametrize("path", SOURCES, ids=module_name)
def test_imports_only_go_down(path):
    source = module_name(path)
    upward = [f"{path.name}:{line} imports {target} (layer {LAYER[target]}, "
              f"not below {source}'s {LAYER[source]})"
              for line, target in package_imports(path)
              if target != source and LAYER[target] >= LAYER[source]]
    assert upward == []


@pytest.mark.parametrize(("planted", "target"), [
    ("def f():\n    from pytest_llmdeterminism.run.session import LLMSession\n", "run.session"),
    ("from ..run.session import LLMSession\n", "run.session"),
    ("from ..run import session\n", "run.session"),
    ("from . import hf\n", "engines.hf"),
    ("from pytest_llmdeterminism.model.llm_model import LLMModel\n", "model.llm_model"),
    ("from pytest_llmdeterminism import GoldenMismatchError\n", "__init__"),
    ("import pytest_llmdeterminism\n", "__init__"),
    ("import pytest_llmdeterminism.run.session as s\n", "run.session"),
    ("import importlib\nimportlib.import_module('pytest_llmdeterminism.goldens.store')\n", "goldens.store"),
])
def test_the_checker_sees_upward_imports(tmp_path, planted, target):
    """Negative control: an upward import, in any spelling and across packages, is found."""
    root = tmp_path / "pytest_llmdeterminism"
    (root / "engines").mkdir(parents=True)
    fake = root / "engines" / "capture.py"
    fake.write_text((PACKAGE / "engines" / "capture.py").read_text() + "\n" + planted)
    source = module_name(fake, root)
    assert source == "engines.capture"
    assert [t for _, t in package_imports(fake, root) if LAYER[t] >= LAYER[source]] == [target]


def test_each_module_sits_in_the_package_its_layer_block_names():
    """The table's packages are the folders: a module moved to another folder needs a new place."""
    def folder(name: str) -> str:
        first = name.split(".")[0]
        top = {module for line in PACKAGES["top"] for module in line}
        return first if first in PACKAGES else "top" if name in top else "core"
    misplaced = [f"{name} is in the {PACKAGE_OF[name]!r} block" for name in map(module_name, SOURCES)
                 if PACKAGE_OF[name] != folder(name)]
    assert misplaced == []


def test_the_package_root_shows_its_plan_in_a_few_entries():
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    # 16: sampling.py, generation's sibling in the core; compute/, how the process computes;
    # model/, the llm_model fixture object over the engines (engines/ holds backends only);
    # judge/, the pure judgement (verdicts, compare and tolerance moved there from the root);
    # 17: decoding.py, a call's decoding settings (what is accepted, what refused), out of generation.py
    assert len(entries) <= 17, entries


# What the judgement may import: the standard library's pure parts and these data modules below it.
_PURE_PACKAGE_MODULES = {"errors", "shape", "sampling", "decoding", "generation", "compute.profiles",
                         "engines.registry"}
_IMPURE_LIBRARIES = {"pytest", "_pytest", "torch", "transformers", "os", "io", "pathlib", "shutil",
                     "subprocess", "socket", "tempfile", "ctypes", "urllib", "http", "threading", "filelock"}


def _third_party_imports(path: Path) -> set[str]:
    """The top-level names of every non-package import in ``path`` that runs (not for type checkers only)."""
    found = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for block in ast.walk(tree):  # drop the imports only type checkers read
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING":
            block.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found - {"pytest_llmdeterminism"}


def test_the_judgement_is_pure():
    """judge/ imports no pytest, torch or I/O module, and of this package only itself and the pure
    data modules below it (so it reads no file, and no engine, model, run, reporting or cli floor;
    of the engines only their registry, the table of what each engine declares)."""
    judge = sorted((PACKAGE / "judge").glob("*.py"))
    assert {path.name for path in judge} >= {"verdict.py", "compare.py", "tolerance.py", "decision.py"}
    # the kinds of golden, whose comparisons the judgement is handed, and their fields: pure as well
    kinds = [*sorted((PACKAGE / "goldens" / "kinds").glob("*.py")), PACKAGE / "goldens" / "fields.py"]
    data = [PACKAGE / (name.replace(".", "/") + ".py") for name in _PURE_PACKAGE_MODULES]
    for path in [*judge, *kinds, *data]:
        assert _third_party_imports(path) & _IMPURE_LIBRARIES == set(), path
        if path.parent.name == "judge":
            outside = {target for _, target in package_imports(path)
                       if not target.startswith("judge") and target not in _PURE_PACKAGE_MODULES}
            assert outside == set(), f"{path.name} imports {outside}"
        assert "open(" not in path.read_text(encoding="utf-8"), path

"""JSON reports as `pytest --llm-report=PATH.json` writes them, built without a run."""

from pathlib import Path

from pytest_llmdeterminism.reporting import documents
from pytest_llmdeterminism.reporting.records import CheckRecord, RunRecord


def write_report(path: Path, checks: list[CheckRecord], *, tests: tuple[str, ...] = ()) -> Path:
    """A complete, passing run of ``tests`` (node ids) with ``checks``, written to ``path``."""
    outcomes = dict.fromkeys(tests, "passed")
    modules = {nodeid.partition("::")[0] for nodeid in tests}
    run = RunRecord(suite=sorted(outcomes), selected=sorted(outcomes), outcomes=outcomes,
                    golden_files={module: f"__golden__/{Path(module).stem}.json" for module in modules},
                    used=[], stopped=[], partial=[], failed=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(documents.json_text(documents.run_report(checks, [], run=run)))
    return path

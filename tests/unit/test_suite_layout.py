"""The suite's own layout: a test module's name says what it tests in one place only (no name repeated
across tiers or folders), and every folder of test modules is a package, so pytest imports each by
its full dotted name (CONTRIBUTING.md, "Test tiers")."""

from collections import defaultdict

from tests.helpers import ROOT

TESTS = ROOT / "tests"


def test_no_test_module_name_is_repeated_across_tiers_or_folders():
    found = defaultdict(list)
    for module in TESTS.rglob("test_*.py"):
        found[module.name].append(str(module.relative_to(ROOT)))
    assert {name: paths for name, paths in found.items() if len(paths) > 1} == {}


def test_every_folder_of_test_modules_is_a_package():
    folders = {module.parent for module in TESTS.rglob("test_*.py")}
    assert sorted(str(folder.relative_to(ROOT)) for folder in folders
                  if not (folder / "__init__.py").is_file()) == []

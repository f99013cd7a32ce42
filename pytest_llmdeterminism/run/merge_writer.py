"""``llm-golden merge``, the writing half: a merge plan without problems written out, and summed up.

The plan (:func:`~pytest_llmdeterminism.run.shards.plan`) has read and checked every shard first;
here its candidate tree, its reports and, under ``--prune``, the removal of unused goldens are
written, each file atomically, and the lines that tell the user what the merge found are built.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_llmdeterminism.goldens import atomic, judged, store
from pytest_llmdeterminism.reporting import documents, terminal
from pytest_llmdeterminism.run.shards import MergePlan


def _tolerances(merge: MergePlan) -> dict[str, dict[str, dict[str, str]]]:
    """The profiles the shards' runs set for their candidates (:mod:`~pytest_llmdeterminism.goldens.judged`),
    per candidate file of the merged tree, so that the review tools judge them as the shards did."""
    found: dict[str, dict[str, dict[str, str]]] = {}
    folders = [shard.candidates for shard in merge.shards if shard.candidates is not None]
    for folder, name in ((folder, name) for folder in folders for name in merge.candidates):
        if (folder / name).is_file():
            for key, variants in judged.read(folder / name).items():
                found.setdefault(name, {}).setdefault(key, {}).update(
                    (variant, str(profile)) for variant, profile in variants.items())
    return found


@dataclass
class MergeOutput:
    """What ``write`` wrote, as :class:`~pytest_llmdeterminism.run.writer.RunOutput` is for a run."""

    lines: list[str] = field(default_factory=list)  # "wrote …" and "pruned …", for the user
    pruned: list[str] = field(default_factory=list)


def write(merge: MergePlan, *, root: Path, candidates_out: Path | None, reports: Sequence[Path],
          prune: bool, display: Callable[[Path], str] = str) -> MergeOutput:
    """Write a plan without problems: the candidate tree, the reports and, under ``prune``, the
    removal of unused goldens. Every file is written atomically, through no symbolic link out of its
    home (:func:`~pytest_llmdeterminism.goldens.atomic.output_home`): a :class:`LinkOutError` names it."""
    assert not merge.problems, "write() takes a plan without problems"
    out = MergeOutput()
    if candidates_out is not None:
        home = [atomic.output_home(candidates_out, root)]
        for name in sorted(merge.candidates):  # all refused before any is written
            atomic.refuse_link_out(candidates_out / name, home, what="candidates")
            atomic.refuse_link_out(judged.path_for(candidates_out / name), home, what="candidates")
        tolerances = _tolerances(merge)  # read (and refused, GoldenFileError) before anything is written
        for name, goldens in sorted(merge.candidates.items()):
            store.write(candidates_out / name, goldens)
            if tolerances.get(name):
                judged.merge(candidates_out / name, tolerances[name])
            count = sum(len(variants) for variants in goldens.values())
            out.lines.append(f"wrote {display(candidates_out / name)} ({count} candidate(s))")
    document = merge.document()
    markdown = documents.run_report_markdown(document) + "\n" + "\n".join(coverage_markdown(merge)) + "\n"
    for path in reports:
        chosen = documents.format_of(path)
        assert chosen is not None, path  # report_problems refused any other suffix
        text = chosen.render(document, markdown)
        atomic.write_text_atomic(path, text, homes=[atomic.output_home(path.parent, root)], what="reports",
                                 mode=atomic.new_file_mode())
        out.lines.append(f"wrote {display(path)} (report)")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary and merge.checks:
        with open(step_summary, "a", encoding="utf-8") as handle:
            handle.write(markdown)
    if prune and not merge.run.partial:
        for golden, keys in sorted(merge.unused.items()):
            store.remove(root / golden, keys)
            out.pruned += [f"{display(root / golden)} [{key!r}]" for key in keys]
    return out


def summary_lines(merge: MergePlan, *, root: Path, prune: bool, pruned: Sequence[str] = (),
                  display: Callable[[Path], str] = str) -> list[str]:
    """What the merge found: the shards and their coverage, the checks, and unused goldens or why
    they were not judged, naming every test that no shard ran."""
    covered = merge.coverage
    ran = len(covered.suite) - len(covered.not_run)
    lines = [f"merged {len(merge.shards)} shard(s): {ran} of {len(covered.suite)} test(s) of the suite ran"]
    by_verdict = documents.run_report(merge.checks, []).get("summary", {}).get("by_verdict", {})
    failed = sum(not check.passed for check in merge.checks)
    lines.append(f"golden checks: {', '.join(f'{n} {v}' for v, n in by_verdict.items()) or 'none'}"
                 + (f" ({failed} failed)" if failed else ""))
    if covered.twice:
        lines.append(f"ran in more than one shard ({len(covered.twice)}), their checks counted once per "
                     "shard: " + ", ".join(covered.twice[:10]) + (" …" if len(covered.twice) > 10 else ""))
    if merge.run.partial:
        verb = "not pruned" if prune else "not judged"
        reasons = "; ".join(merge.run.partial)
        if merge.complete:  # every test ran, so only failures are left to say
            lines.append(f"unused goldens {verb}: the shards together ran the whole suite, but {reasons}")
        else:
            lines.append(f"unused goldens {verb}: the shards together were partial ({reasons})")
        if covered.not_run:
            lines.append(f"tests that no shard ran ({len(covered.not_run)}); run their shard again, or merge "
                         "every shard's report:")
            lines += [f"  {nodeid}" for nodeid in covered.not_run]
        return lines
    return lines + terminal.unused_summary(
        {str(root / path): keys for path, keys in merge.unused.items()}, pruned, [], display,
        prune=prune, prune_command="llm-golden merge ... --prune",
        cases_kept={str(root / path): keys for path, keys in merge.cases_kept.items()})


def coverage_markdown(merge: MergePlan) -> list[str]:
    """The merged Markdown report's last section: shards, coverage, unused goldens."""
    covered = merge.coverage
    ran = len(covered.suite) - len(covered.not_run)
    return documents.shards_markdown(len(merge.shards), ran, len(covered.suite), merge.run.partial,
                                  covered.not_run, merge.unused)


def report_problems(reports: Sequence[Path]) -> str | None:
    """Why the ``--report`` paths cannot be written as given (one per format)."""
    bad = [str(path) for path in reports if documents.format_of(path) is None]
    if bad:
        return f"--report {bad[0]!r}: expected a path ending in {documents.suffixes()}"
    twice = documents.repeated_format(reports)
    if twice:
        return f"two {twice} reports; give one --report per format ({documents.suffixes(None)})"
    return None

"""Reading the docs' code blocks (test_docs.py, test_docs_run_headers.py)."""

from __future__ import annotations


def first_block(text: str, language: str) -> str:
    return text.split(f"```{language}\n", 1)[1].split("```", 1)[0]


"""Three local corpora for mixture tests, built from the running interpreter's standard library (no download):
its code, its docstrings and comments, and its plain-text files."""

from __future__ import annotations

import ast
import io
import json
import sysconfig
import tokenize
from collections.abc import Sequence
from pathlib import Path

__all__ = ["docs_and_comments", "write_mixture_corpora"]


def docs_and_comments(source: str) -> str:
    """The docstrings and ``#`` comments of a Python source, in order of appearance, one per paragraph."""
    parts: list[tuple[int, str]] = []
    try:
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    parts.append((getattr(node, "lineno", 0), doc))
    except SyntaxError:
        pass
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                parts.append((tok.start[0], tok.string.lstrip("#").strip()))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return "\n\n".join(text for _, text in sorted(parts, key=lambda p: p[0]) if text)


def write_mixture_corpora(root: Path, code_texts: Sequence[str], max_text_files: int = 8) -> list[str]:
    """Write ``code.jsonl`` (the sources), ``docs.jsonl`` (their docstrings and comments) and ``text/`` (the first
    plain-text files of the standard library, by path, outside its tests) under ``root``; returns the three paths."""
    root.mkdir(parents=True, exist_ok=True)
    code, docs, text = root / "code.jsonl", root / "docs.jsonl", root / "text"
    with code.open("w") as f:
        for t in code_texts:
            f.write(json.dumps({"text": t}) + "\n")
    with docs.open("w") as f:
        for t in code_texts:
            d = docs_and_comments(t)
            if d:
                f.write(json.dumps({"text": d}) + "\n")
    text.mkdir(exist_ok=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in stdlib.rglob("*.txt")
        if not {"test", "tests", "idle_test", "site-packages"} & set(p.relative_to(stdlib).parts)
    )
    for i, p in enumerate(files[:max_text_files]):
        (text / f"{i:03d}_{p.name}").write_text(p.read_text(encoding="utf-8", errors="replace"))
    return [str(code), str(docs), str(text)]

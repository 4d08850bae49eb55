"""The README's Python examples run as written and print what the README says they print."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks_with_output() -> list[tuple[str, str | None]]:
    """Each ```python block, with the ``` block that follows it after a line 'prints' (its expected output), if any."""
    text = README.read_text()
    pattern = re.compile(r"```python\n(.*?)```\n(?:\s*prints\s*\n\s*```\n(.*?)```)?", re.S)
    return [(m.group(1), m.group(2)) for m in pattern.finditer(text)]


def test_readme_examples_run_and_print_what_they_say(tmp_path, monkeypatch):
    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))  # the default index example builds one
    blocks = python_blocks_with_output()
    assert blocks, "the README has no python example"
    for code, expected in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
        if expected is not None:
            assert out.getvalue() == expected


def test_readme_trainer_configs_map_onto_the_dataclasses():
    import json

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    from train.config import config_from_dict

    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README shows no trainer config"
    for block in blocks:
        config = config_from_dict(tomllib.loads(block))
        for key, value in tomllib.loads(block).get("data", {}).items():
            got = getattr(config.data, key)
            assert json.loads(json.dumps(got)) == value, key  # tuples compare as the TOML's lists

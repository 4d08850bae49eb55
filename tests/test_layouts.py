"""Persisted layouts (issue 12.1): built once beside the index, opened as memory maps, equal to the in-RAM layouts
sample for sample; workers receive paths; a damaged layout is rebuilt, never served."""

from __future__ import annotations

import json
import logging
import multiprocessing
import pickle
import shutil

import numpy as np
import pytest

from detsampler.index import TokenIndex
from detsampler.index.checksums import VerifiedArray
from detsampler.index.layouts import PersistedLayout, layout_dir
from detsampler.layout import LayoutConfig, make_layout

CONFIGS = [
    LayoutConfig(kind="concat", seq_len=64, seed=1),
    LayoutConfig(kind="document", seq_len=64, seed=2),
    LayoutConfig(kind="bestfit", seq_len=128, seed=3, window_docs=5),
]


@pytest.fixture()
def index(small_index, tmp_path):
    dest = tmp_path / small_index.path.name
    shutil.copytree(small_index.path, dest, ignore=shutil.ignore_patterns("layouts", "*.lock"))
    return TokenIndex.open(dest)


def assert_same_layout(got, want) -> None:
    assert got.num_samples == want.num_samples and got.describe() == want.describe()
    ids = np.arange(want.num_samples)
    a, b = got.locate(ids), want.locate(ids)
    for field in ("offsets", "doc_ids", "starts", "stops"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.kind)
def test_a_persisted_layout_equals_the_in_ram_layout(index, config):
    layout = index.layout(config)
    assert isinstance(layout, PersistedLayout) and (layout.path / "layout.json").is_file()
    assert layout.path.parent == index.path / "layouts"
    assert_same_layout(layout, make_layout(config, np.asarray(index.lengths)))
    for value in vars(layout.inner).values():  # nothing of size D in RAM: memory maps behind checksums, or small
        assert isinstance(value, VerifiedArray) or np.size(value) < 64 or hasattr(value, "window_bins")
    record = json.loads((layout.path / "layout.json").read_text())
    again = TokenIndex.open(index.path).layout(config)  # opened, not rebuilt
    assert json.loads((again.path / "layout.json").read_text()) == record


SHARED_DIRECTORY = [
    (LayoutConfig(kind="concat", seq_len=64, window_docs=4), LayoutConfig(kind="concat", seq_len=64)),
    (LayoutConfig(kind="document", seq_len=64), LayoutConfig(kind="document", seq_len=64, window_docs=8)),
    (LayoutConfig(kind="concat", seq_len=64, epoch_order=True), LayoutConfig(kind="concat", seq_len=64)),
]


@pytest.mark.parametrize("first,then", SHARED_DIRECTORY, ids=["concat-window", "document-window", "epoch-order"])
def test_configs_of_one_directory_open_each_others_layout(index, s3_bucket, caplog, first, then):
    """A layout directory's key leaves out what does not shape its samples (``window_docs`` outside bestfit; epoch 0 of
    an ``epoch_order`` layout is the plain layout), but its record held the first builder's whole config: the other
    config found `layout.json differs in ['config']` and rebuilt it locally with a warning, and in a bucket (where
    nothing is rebuilt) it was refused (the whole CI run once, after a test built such a layout in the session index
    and another pushed it). Both open the one directory, locally and in a bucket, with no rebuild."""
    from detsampler.index.push import push_index

    built = index.layout(first)
    record = (built.path / "layout.json").read_text()
    url = f"{s3_bucket}/shared-layout-dir/{first.kind}-{first.window_docs}-{first.epoch_order}/{index.path.name}"
    push_index(index.path, url)
    want = make_layout(then, np.asarray(index.lengths))
    with caplog.at_level(logging.WARNING, logger="detsampler"):
        local = TokenIndex.open(index.path).layout(then)
        remote = TokenIndex.open(url).layout(then)
    assert local.path == built.path and (built.path / "layout.json").read_text() == record  # opened, not rebuilt
    assert not _warnings(caplog)
    assert_same_layout(local, want)
    assert_same_layout(remote, want)


def test_bestfit_packs_the_same_with_two_processes(index, tmp_path):
    config = LayoutConfig(kind="bestfit", seq_len=32, seed=4, window_docs=2)
    one = index.layout(config)
    other = TokenIndex.open(shutil.copytree(index.path, tmp_path / "other", ignore=shutil.ignore_patterns("layouts")))
    two = other.layout(config, num_proc=2)
    files = lambda lay: {k: v["sha256"] for k, v in json.loads((lay.path / "layout.json").read_text())["files"].items()}
    assert files(one) == files(two)


def test_the_key_holds_the_mapping_version_and_config(index, monkeypatch):
    base = layout_dir(index, CONFIGS[2])
    assert base.name.startswith("bestfit-L128-seed3-w5-")
    assert layout_dir(index, LayoutConfig(kind="concat", seq_len=64, seed=1, window_docs=7)) == layout_dir(
        index, CONFIGS[0]
    )
    concat = layout_dir(index, CONFIGS[0])
    monkeypatch.setattr("detsampler.index.layouts.PACKING_VERSION", 999)
    assert layout_dir(index, CONFIGS[2]) != base and layout_dir(index, CONFIGS[0]) == concat  # packing: bestfit only
    monkeypatch.setattr("detsampler.index.layouts.MAPPING_VERSION", 999)
    assert layout_dir(index, CONFIGS[0]) != concat


def test_the_packed_dataset_pickles_as_paths(index):
    from detsampler.loader.dataset import PackedDataset

    for config in CONFIGS:
        ds = PackedDataset(index, index.layout(config))
        blob = pickle.dumps(ds)
        assert len(blob) < 4096, (config.kind, len(blob))
        back = pickle.loads(blob)
        ids = np.arange(min(len(ds), 16))
        assert all(np.array_equal(back.get_batch(ids)[k], ds.get_batch(ids)[k]) for k in ("input_ids", "labels"))


def test_a_chunk_that_fails_its_checksum_while_locating_is_rebuilt(index, caplog):
    config = LayoutConfig(kind="bestfit", seq_len=8, seed=5, window_docs=16)
    index.layout(config)
    path = layout_dir(index, config)
    items = np.load(path / "bin_items.npy", mmap_mode="r+")
    assert items.nbytes > 1 << 16  # two chunks or more: the tampered first one is not read on open (the last is)
    items[len(items) // 4] -= 1
    items.flush()
    del items
    layout = TokenIndex.open(index.path).layout(config)
    with caplog.at_level(logging.WARNING, logger="detsampler"):
        assert_same_layout(layout, make_layout(config, np.asarray(index.lengths)))
    assert "bin_items.npy chunk" in caplog.text and "rebuilding the layout" in caplog.text


def _open_in_child(path: str, config: LayoutConfig, queue) -> None:
    layout = TokenIndex.open(path).layout(config)
    queue.put((layout.num_samples, json.loads((layout.path / "layout.json").read_text())["build"]["seconds"]))


@pytest.mark.slow
def test_concurrent_first_openers_build_once(index):
    """Two processes ask for the same new layout at once: one builds under the lock, both open the same files."""
    config = LayoutConfig(kind="bestfit", seq_len=16, seed=6, window_docs=8)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_open_in_child, args=(str(index.path), config, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results[0] == results[1]  # the same build record: built once
    assert [p.name for p in (index.path / "layouts").iterdir() if p.is_dir()] == [layout_dir(index, config).name]


def test_a_read_only_index_computes_the_layout_in_ram(index, caplog):
    (index.path / "layouts").mkdir(exist_ok=True)
    (index.path / "layouts").chmod(0o555)
    try:
        with caplog.at_level(logging.WARNING, logger="detsampler"):
            layout = index.layout(CONFIGS[0])
    finally:
        (index.path / "layouts").chmod(0o755)
    if not isinstance(layout, PersistedLayout):  # root ignores permissions: then it was simply written
        assert "computing it in RAM" in caplog.text
    assert_same_layout(layout, make_layout(CONFIGS[0], np.asarray(index.lengths)))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_layout_directory_without_its_layout_json_is_rebuilt(index, caplog):
    config = CONFIGS[0]
    (index.layout(config).path / "layout.json").unlink()  # e.g. removed by hand, or lost by a copy
    with caplog.at_level(logging.WARNING, logger="detsampler"):
        again = TokenIndex.open(index.path).layout(config)
    assert_same_layout(again, make_layout(config, np.asarray(index.lengths)))
    (line,) = _warnings(caplog)
    assert line.startswith("detsampler: layout ")
    assert line.endswith("has no layout.json (an incomplete copy?); rebuilding it")


def test_a_layout_file_whose_npy_header_is_damaged_is_rebuilt(index, caplog):
    config = CONFIGS[0]
    ends = index.layout(config).path / "ends.npy"
    data = bytearray(ends.read_bytes())
    data[data.index(b"}")] = ord(" ")  # an unclosed brace: numpy's header parser raises tokenize.TokenError
    ends.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="detsampler"):
        again = TokenIndex.open(index.path).layout(config)
    assert_same_layout(again, make_layout(config, np.asarray(index.lengths)))
    (line,) = _warnings(caplog)
    assert "ends.npy is not a readable .npy file (TokenError: " in line and line.endswith("; rebuilding it")

"""Mixtures over three real local corpora (stdlib code, its docstrings and comments, plain-text files): the CLI's show
names each sample's source and source epoch, verify checks every source epoch, stats reports per-source shares and
tokens;
PackedDataset samples come through MixtureDataset and a DataLoader unchanged."""

from __future__ import annotations

import json

import pytest

from detsampler.cli import main
from detsampler.index.prepare import IndexConfig, prepare_index
from detsampler.layout import LayoutConfig
from detsampler.locate import locate
from detsampler.mixture import Mixture
from detsampler.plan import Plan
from tests.mixture_corpora import write_mixture_corpora

WEIGHTS = ["0.5", "0.3", "0.2"]
NAMES = ["code", "docs", "text"]


@pytest.fixture(scope="session")
def mixture_paths(tmp_path_factory, small_corpus):
    return write_mixture_corpora(tmp_path_factory.mktemp("mixture-corpora"), small_corpus["text"][:8], max_text_files=4)


@pytest.fixture(scope="session")
def mixture_layouts(mixture_paths, small_tokenizer, cache_root):
    config = LayoutConfig(kind="concat", seq_len=64)
    return [
        prepare_index(
            IndexConfig(data=p, tokenizer=small_tokenizer.path, cache_dir=str(cache_root)), progress=False
        ).index.layout(config)
        for p in mixture_paths
    ]


@pytest.fixture()
def mixture_args(mixture_paths, small_tokenizer, cache_root, mixture_layouts):
    return [
        "--tokenizer",
        small_tokenizer.path,
        "--cache-dir",
        str(cache_root),
        "--mixture-data",
        ",".join(mixture_paths),
        "--mixture-weights",
        ",".join(WEIGHTS),
        "--mixture-names",
        ",".join(NAMES),
        "--kind",
        "concat",
        "--seq-len",
        "64",
        "--global-batch-size",
        "8",
        "--micro-batch-size",
        "2",
        "--world-size",
        "2",
    ]


def _run(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out


def _plan(layouts, schedule=None, skip_steps=None, seed=0) -> Plan:
    weights = [(0, WEIGHTS)] + (schedule or [])
    return Plan(
        source=Mixture(layouts, weights, seed),
        seed=0,
        global_batch_size=8,
        micro_batch_size=2,
        world_size=2,
        skip_steps=skip_steps,
    )


def test_show_names_each_samples_source_and_source_epoch(capsys, mixture_args, mixture_layouts):
    argv = [
        "show",
        *mixture_args,
        "--mixture-schedule",
        "3:1,1,1",
        "--skip-steps",
        "4..5",
        "--step",
        "6",
        "--rank",
        "1",
    ]
    code, out = _run(capsys, argv)
    assert code == 0 and "(data step 8)" in out and "weights 1/3, 1/3, 1/3" in out
    plan = _plan(mixture_layouts, [(3, [1, 1, 1])], [(4, 5)])
    for a in range(2):
        loc = locate(plan, mixture_layouts, 6, rank=1, micro_step=a)
        for i in range(2):
            line = (
                f"position {int(loc.positions[i])}  sample {int(loc.sample_ids[i])}  source"
                f" {NAMES[int(loc.sources[i])]}  source sample {int(loc.source_sample_ids[i])}  source epoch"
                f" {int(loc.epochs[i])}"
            )
            assert line in out
            for doc, s, e in loc.spans.sample(i):
                assert f"doc {doc}  tokens [{s}," in out


def test_verify_checks_every_source_epoch(capsys, mixture_args, mixture_layouts):
    text = mixture_layouts[2].num_samples
    steps = text * 5 // 8 + 3  # more than an epoch of the text source (weight 1/5)
    code, out = _run(capsys, ["verify", *mixture_args, "--steps", f"0:{steps}"])
    assert code == 0 and "OK: no duplicates, no gaps" in out
    for name in NAMES:
        assert f"source {name}:" in out
    assert "epoch 0:" in out and "epoch 1:" in out and ", complete" in out


def test_stats_reports_per_source_shares_tokens_and_epochs(capsys, mixture_args, mixture_layouts):
    code, out = _run(capsys, ["stats", *mixture_args, "--step", "40", "--json"])
    stats = json.loads(out)
    plan = _plan(mixture_layouts)
    report = plan.stream.report(plan.consumed(40))
    assert code == 0 and stats["position"] == 320 and stats["weights_at_step"] == ["1/2", "3/10", "1/5"]
    for row, rep, weight in zip(stats["sources"], report, [0.5, 0.3, 0.2]):
        assert row["samples"] == rep["served"] and row["tokens"] == rep["tokens"] == rep["served"] * 64
        assert row["epochs"] == rep["epochs"] and row["expected_share"] == pytest.approx(weight)
        assert abs(row["samples"] - 320 * weight) < 2  # the discrepancy bound for three sources
        assert row["token_share"] == pytest.approx(row["sample_share"])  # concat: every sample is seq_len tokens
    code, out = _run(capsys, ["stats", *mixture_args, "--step", "40"])
    assert code == 0 and "token share" in out and all(name in out for name in NAMES)


def test_mixture_options_bad_input(capsys, mixture_args, mixture_paths):
    cases = [
        (["stats", "--mixture-weights", "1,1"], "needs --mixture-data"),
        (["stats", *mixture_args, "--mixture-weights", "1,1"], "one weight per source (3)"),
        (["stats", *mixture_args, "--mixture-weights", "1,-1,1"], "must be >= 0"),
        (["stats", *mixture_args, "--data", mixture_paths[0]], "not both"),
        (["show", *mixture_args, "--step", "0", "--skip-steps", "5..3"], "reversed"),
        (
            ["show", *mixture_args, "--step", "0", "--mixture-schedule", "2:1,1,1", "--mixture-schedule", "2:1,2,1"],
            "strictly increasing",
        ),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err, (argv, message)
    with pytest.raises(SystemExit) as exc:
        main(["show", *mixture_args, "--step", "0", "--mixture-schedule", "0:1,1,1"])
    assert exc.value.code == 2 and "FIRST_STEP >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("num_workers", [0, 2])
def test_packed_mixture_dataset_through_a_dataloader(
    num_workers, mixture_paths, mixture_layouts, small_tokenizer, cache_root
):
    import torch

    from detsampler.loader.dataset import PackedDataset, collate_micro_batch
    from detsampler.loader.mixture_dataset import MixtureDataset
    from detsampler.loader.sampler import DeterministicBatchSampler

    indexes = [
        prepare_index(
            IndexConfig(data=p, tokenizer=small_tokenizer.path, cache_dir=str(cache_root)), progress=False
        ).index
        for p in mixture_paths
    ]
    packed = [PackedDataset(index, layout) for index, layout in zip(indexes, mixture_layouts)]
    plan = _plan(mixture_layouts, [(2, [1, 1, 1])])
    dataset = MixtureDataset(packed, plan.stream)
    from detsampler.loader.dataset import MicroBatch

    assert isinstance(dataset.__getitems__([0, plan.stream.offsets[2], 1]), MicroBatch)  # the batched path
    sampler = DeterministicBatchSampler(plan, rank=0, stop_step=4)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, num_workers=num_workers, collate_fn=collate_micro_batch
    )
    for step, micro_batches in sampler.steps(loader):
        for a, batch in enumerate(micro_batches):
            look = plan.stream.lookup(plan.micro_batch_positions(step, a, 0))
            assert batch["input_ids"].shape == (2, 64)
            for i in range(2):
                own = packed[int(look.source[i])][int(look.source_sample[i])]
                for key in ("input_ids", "labels", "position_ids", "document_ids"):
                    assert torch.equal(batch[key][i], own[key])


def test_an_integration_records_the_instance_filter_its_datasets_read_through(
    mixture_paths, mixture_layouts, small_tokenizer, cache_root
):
    """The integrations' data record names the datasets' instance filter (a resume through another is refused); a
    mixture whose sources read through different filters is refused (one record, one filter)."""
    from detsampler.filter import RepetitionFilter
    from detsampler.integrations.checkpoint import CheckpointData
    from detsampler.loader.dataset import PackedDataset
    from detsampler.loader.mixture_dataset import MixtureDataset

    indexes = [
        prepare_index(
            IndexConfig(data=p, tokenizer=small_tokenizer.path, cache_dir=str(cache_root)), progress=False
        ).index
        for p in mixture_paths
    ]
    plan = _plan(mixture_layouts)
    strict = RepetitionFilter(max_count=4)

    def data(filters):
        packed = [PackedDataset(i, lay, instance_filter=f) for i, lay, f in zip(indexes, mixture_layouts, filters)]
        return CheckpointData(MixtureDataset(packed, plan.stream), plan, framework="hf")

    saved = data([strict] * 3).record(2, plan)
    assert saved.instance_filter() == strict
    data([strict] * 3).check(saved.to_dict(), 2, "checkpoint-2")
    with pytest.raises(ValueError, match="changes the instance filter"):
        data([None] * 3).check(saved.to_dict(), 2, "checkpoint-2")
    with pytest.raises(ValueError, match="sources read through different instance filters"):
        data([strict, None, strict])


def test_verify_against_an_earlier_mixture_checkpoint(
    capsys, mixture_paths, mixture_layouts, small_tokenizer, cache_root, tmp_path
):
    """``verify --checkpoint NEW --against OLD`` over a mixture: a schedule entry added at OLD's step is accepted, and
    the steps from it on are reported as reading other samples (an allowed change moves them); exit 0."""
    from detsampler.record import DataRecord

    indexes = [
        prepare_index(
            IndexConfig(data=p, tokenizer=small_tokenizer.path, cache_dir=str(cache_root)), progress=False
        ).index
        for p in mixture_paths
    ]
    old, new = _plan(mixture_layouts), _plan(mixture_layouts, [(4, [1, 1, 1])])
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    DataRecord.of(4, indexes, mixture_layouts, old).save(tmp_path / "old")
    DataRecord.of(8, indexes, mixture_layouts, new).save(tmp_path / "new")
    code, out = _run(capsys, ["verify", "--checkpoint", str(tmp_path / "new"), "--against", str(tmp_path / "old")])
    moved = [s for s in range(8) if sorted(old.global_batch(s)) != sorted(new.global_batch(s))]
    assert moved and min(moved) >= 4
    assert code == 0 and "  accepted by the resume rule at step 4 (check_resume)" in out
    assert f"  steps 0..7: {len(moved)} step(s) read other samples than its plan: {moved[0]}" in out
    assert out.splitlines()[-1] == "OK: no duplicates, no gaps"

"""torchtitan's own classes over detsampler: the loader is a ``BaseDataLoader`` built from its ``Config`` as
torchtitan's trainer builds it, iterated as its training loop does, checkpointed with DCP under "dataloader" and resumed
at another dp degree (which torchtitan's own loader refuses): each global batch equals the uninterrupted run's. It
yields torchtitan's ``({"input", "positions"}, labels)``, reads every kind of index, mixtures with a schedule, skip
ranges and a batch ramp, and its saved data record refuses a resume that would read other data."""

from __future__ import annotations

import json
import struct
import sys
import warnings

import numpy as np
import pytest

if sys.version_info < (3, 11):  # torchtitan 0.3.0 requires Python >= 3.11; the test extra installs it from there on
    pytest.skip("torchtitan needs Python >= 3.11", allow_module_level=True)

import torch
import torch.distributed.checkpoint as dcp
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.loss import IGNORE_INDEX, cross_entropy_loss

from detsampler.integrations.torchtitan import DetsamplerDataLoader
from detsampler.loader.dataset import PackedDataset
from detsampler.record import DataRecord

SEQ_LEN, GLOBAL_BATCH, LOCAL_BATCH = 32, 8, 2


def build(index_paths, dp_world_size, dp_rank, **config):
    """What torchtitan's trainer calls: ``config.dataloader.build(...)`` with its runtime arguments."""
    paths = [str(p) for p in index_paths]
    config.setdefault("global_batch_size", GLOBAL_BATCH)
    cfg = DetsamplerDataLoader.Config(index_paths=paths, **config)
    return cfg.build(
        dp_world_size=dp_world_size,
        dp_rank=dp_rank,
        tokenizer=None,
        seq_len=SEQ_LEN,
        local_batch_size=LOCAL_BATCH,
        snapshot_every_n_steps=1,
    )


def draw(loaders, num_steps, global_batch=GLOBAL_BATCH):
    """Per step and rank, the ``(input_dict, labels)`` micro batches drawn as torchtitan's loop draws them:
    ``global_batch / (local_batch * dp)`` per rank and step from one long-lived iterator per rank."""
    iterators = [iter(loader) for loader in loaders]
    accumulation = global_batch // (LOCAL_BATCH * len(loaders))
    return [[[next(it) for _ in range(accumulation)] for it in iterators] for _ in range(num_steps)]


def train_steps(loaders, num_steps, global_batch=GLOBAL_BATCH):
    """Per step, the sorted rows (input tokens) of all ranks' micro batches that hold a label."""
    steps = []
    for ranks in draw(loaders, num_steps, global_batch):
        rows = []
        for micro_batches in ranks:
            for inputs, labels in micro_batches:
                assert set(inputs) == {"input", "positions"}
                assert labels.shape == inputs["input"].shape == inputs["positions"].shape == (LOCAL_BATCH, SEQ_LEN)
                rows += [tuple(r) for r, lab in zip(inputs["input"].tolist(), labels) if (lab != IGNORE_INDEX).any()]
        steps.append(sorted(rows))
    return steps


def saved_and_loaded(loader, tmp_path, loaders_to_load):
    """``loader`` saved with DCP under "dataloader" and loaded into each of ``loaders_to_load`` the same way."""
    dcp.save({"dataloader": loader}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    for other in loaders_to_load:
        dcp.load({"dataloader": other}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    return loaders_to_load


def test_checkpoint_at_dp_2_resumes_at_dp_1_and_4_with_the_same_global_batches(small_index, tmp_path):
    full = train_steps([build([small_index.path], 2, r) for r in range(2)], 5)
    loaders = [build([small_index.path], 2, r) for r in range(2)]
    assert isinstance(loaders[0], BaseDataLoader)
    assert train_steps(loaders, 3) == full[:3]
    states = [loader.state_dict() for loader in loaders]
    assert states[0] == states[1]  # no dp_rank_N keys: DCP's de-duplication keeps rank 0's
    assert {k: v for k, v in states[0].items() if k != "data_record"} == {"step": 3, "samples_in_step": 0}
    record = DataRecord.from_json(states[0]["data_record"])
    assert (record.step, record.framework, record.world_size) == (3, "torchtitan", 2)
    assert record.fingerprint == loaders[0].fingerprint
    for dp in (1, 4):
        fresh = [build([small_index.path], dp, r) for r in range(dp)]
        resumed = saved_and_loaded(loaders[0], tmp_path / f"dp{dp}", fresh)
        for loader in resumed:
            assert loader.state_dict()["step"] == 3
        assert train_steps(resumed, 2) == full[3:], f"dp {dp}"


def test_a_balanced_loader_reads_the_same_global_batches_and_resumes_at_another_dp(small_index, tmp_path):
    """``balance=True`` (issue 34): each step's rows are the unbalanced loader's, dealt to other ranks; the record
    names the cost model; a checkpoint at dp 2 resumes at dp 1 and 4 with the same global batches."""
    bestfit = dict(layout="bestfit", balance=True, balance_attention=0.5)
    full = train_steps([build([small_index.path], 2, r, layout="bestfit") for r in range(2)], 5)
    loaders = [build([small_index.path], 2, r, **bestfit) for r in range(2)]
    assert loaders[0].plan.mapping_version == 3
    assert train_steps(loaders, 3) == full[:3]
    record = DataRecord.from_json(loaders[0].state_dict()["data_record"])
    assert record.fingerprint.plan["balance"]["cost"] == {"attention": 0.5, "linear": 1.0, "fixed": 0.0}
    for dp in (1, 4):
        resumed = saved_and_loaded(
            loaders[0], tmp_path / f"dp{dp}", [build([small_index.path], dp, r, **bestfit) for r in range(dp)]
        )
        assert train_steps(resumed, 2) == full[3:], f"dp {dp}"
    with pytest.raises(ValueError, match="was trained on|changes the plan's balance"):
        unbalanced = build([small_index.path], 2, 0, layout="bestfit")
        saved_and_loaded(loaders[0], tmp_path / "off", [unbalanced])


def test_positions_restart_at_each_document_and_are_the_layouts(small_index):
    """bestfit: ``positions`` are the layout's restarting position ids; torchtitan's document mask (0.3.0
    ``get_document_mask_mod``: a document starts where positions are 0) then separates exactly the packed pieces."""
    loader = build([small_index.path], 1, 0, layout="bestfit")
    dataset = PackedDataset(small_index, small_index.layout(loader.layouts[0].config))
    for step, ranks in enumerate(draw([loader], 2)):
        for micro_step, (inputs, labels) in enumerate(ranks[0]):
            want = dataset.get_batch(loader.plan.micro_batch(step, micro_step, 0))
            assert torch.equal(inputs["input"], want["input_ids"]) and torch.equal(labels, want["labels"])
            assert torch.equal(inputs["positions"], want["position_ids"])
            docs = want["document_ids"]
            torchtitan_docs = torch.cumsum((inputs["positions"] == 0).int(), dim=1) - 1
            for row in range(LOCAL_BATCH):  # same piece <=> same document mask id (padding: each its own)
                same = docs[row, 1:] == docs[row, :-1]
                continues = inputs["positions"][row, 1:] == inputs["positions"][row, :-1] + 1
                assert torch.equal(same & (docs[row, 1:] >= 0), continues)
                assert torch.equal(torchtitan_docs[row, 1:] == torchtitan_docs[row, :-1], continues)
    concat = next(iter(build([small_index.path], 1, 0)))[0]["positions"]
    assert torch.equal(concat, torch.arange(SEQ_LEN).expand(LOCAL_BATCH, SEQ_LEN))  # labels cross documents: one


@pytest.mark.parametrize("layout", ["bestfit", "concat"])
def test_torchtitans_loss_on_what_it_yields_is_the_next_token_cross_entropy(small_index, layout):
    """torchtitan's ``cross_entropy_loss`` (sum over labels that are not IGNORE_INDEX) on logits for a yielded micro
    batch equals the next-token cross-entropy computed by hand, -100 exactly where the layout masks: a piece's last
    position and padding (bestfit), nowhere (concat)."""
    loader = build([small_index.path], 1, 0, layout=layout)
    dataset = PackedDataset(small_index, small_index.layout(loader.layouts[0].config))
    inputs, labels = next(iter(loader))
    docs = dataset.get_batch(loader.plan.micro_batch(0, 0, 0))["document_ids"]
    tokens, positions = inputs["input"], inputs["positions"]
    logits = torch.randn(LOCAL_BATCH, SEQ_LEN, small_index.vocab_size, generator=torch.Generator().manual_seed(0))
    want, masked = 0.0, 0
    for b in range(LOCAL_BATCH):
        for t in range(SEQ_LEN):
            if layout == "concat":
                target = tokens[b, t + 1] if t + 1 < SEQ_LEN else labels[b, t]  # the stream's next token
            elif t + 1 < SEQ_LEN and docs[b, t] >= 0 and docs[b, t + 1] == docs[b, t] and positions[b, t + 1] > 0:
                target = tokens[b, t + 1]
            else:
                masked += 1
                assert labels[b, t] == IGNORE_INDEX, (b, t)
                continue
            assert labels[b, t] == target, (b, t)
            want -= torch.log_softmax(logits[b, t].double(), dim=0)[target].item()
    assert (masked > 0) == (layout == "bestfit")
    assert int((labels != IGNORE_INDEX).sum()) == LOCAL_BATCH * SEQ_LEN - masked  # torchtitan's local_valid_tokens
    assert cross_entropy_loss(logits, labels).item() == pytest.approx(want, rel=1e-5)


def test_a_mixture_with_a_schedule_and_skip_ranges_resumes_and_records_them(small_index, tmp_path):
    config = {
        "weights": [0.5, 0.5],
        "mixture_schedule": [(2, [0.9, 0.1])],
        "mixture_seed": 3,
        "mixture_names": ["a", "b"],
        "layout": "bestfit",
        "skip_steps": [(1, 1)],
    }
    full = train_steps([build([small_index.path] * 2, 2, r, **config) for r in range(2)], 4)
    plain = train_steps([build([small_index.path] * 2, 2, r, **{**config, "skip_steps": []}) for r in range(2)], 5)
    assert full == [plain[0]] + plain[2:]  # data step 1 is never trained on
    first = [build([small_index.path] * 2, 2, r, **config) for r in range(2)]
    train_steps(first, 2)
    record = DataRecord.from_json(first[0].state_dict()["data_record"])
    assert record.names == ("a", "b") and len(record.indexes) == 2
    assert json.loads(json.dumps(record.fingerprint.plan["skip_steps"])) == [[1, 1]]
    assert record.fingerprint.plan["stream"]["schedule"] == [[0, ["1/2", "1/2"]], [2, ["9/10", "1/10"]]]
    resumed = saved_and_loaded(first[0], tmp_path, [build([small_index.path] * 2, 1, 0, **config)])
    assert train_steps(resumed, 2) == full[2:]
    state = first[0].state_dict()  # step 2 (data step 3): a schedule entry there is ahead, one at step 2 the past
    ahead = build([small_index.path] * 2, 1, 0, **{**config, "mixture_schedule": [(2, [0.9, 0.1]), (3, [0.1, 0.9])]})
    ahead.load_state_dict(state)
    with pytest.raises(ValueError, match="the mixture weights schedule changes the past"):
        build([small_index.path] * 2, 1, 0, **{**config, "mixture_schedule": [(2, [0.8, 0.2])]}).load_state_dict(state)
    with pytest.raises(ValueError, match="changes the mixture's seed"):
        build([small_index.path] * 2, 1, 0, **{**config, "mixture_seed": 4}).load_state_dict(state)


def test_a_batch_ramp_fills_torchtitans_fixed_micro_batch_count_with_masked_micro_batches(small_index):
    """A ramp from 4 to 8 samples: torchtitan draws 8 / (2 * dp) micro batches every step; a step of 4 samples yields
    its own, then micro batches whose labels are all IGNORE_INDEX (torchtitan's loss and global_valid_tokens skip them),
    so the trained samples are the plan's."""
    config = {"batch_size_schedule": [(0, 4), (2, 8)]}
    loaders = [build([small_index.path], 2, r, **config) for r in range(2)]
    steps = draw(loaders, 4)
    for step, ranks in enumerate(steps):
        for rank, micro_batches in enumerate(ranks):
            real = loaders[rank].plan.num_micro_steps(step)
            assert real == (1 if step < 2 else 2) and len(micro_batches) == 2
            for micro_step, (inputs, labels) in enumerate(micro_batches):
                if micro_step < real:
                    ids = loaders[rank].plan.micro_batch(step, micro_step, rank)
                    want = loaders[rank].dataset.get_batch(ids)
                    assert torch.equal(inputs["input"], want["input_ids"])
                else:
                    assert (labels == IGNORE_INDEX).all()
                    assert cross_entropy_loss(torch.randn(*labels.shape, 7), labels).item() == 0.0
    with pytest.raises(ValueError, match="exceed global_batch_size 8"):
        build([small_index.path], 2, 0, batch_size_schedule=[(0, 16), (2, 8)])


def _megatron(prefix, num_docs=40):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    rng = np.random.default_rng(0)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for _ in range(num_docs):
        builder.add_item(torch.from_numpy(np.append(rng.integers(10, 500, size=int(rng.integers(5, 60))), 7)))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")


def _megatron_by_hand(prefix, docs):
    """``docs`` in Megatron's MMIDIDX layout (detsampler.index.sources.formats.open_megatron), one sequence each."""
    flat = np.concatenate(docs)
    ends = np.cumsum([len(d) for d in docs])
    flat.astype(np.uint16).tofile(f"{prefix}.bin")
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(docs), len(docs) + 1))
        f.write(np.array([len(d) for d in docs], dtype=np.int32).tobytes())
        f.write((np.append(0, ends[:-1]) * 2).astype(np.int64).tobytes())
        f.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes())


def test_a_megatron_source_and_a_sharded_index_are_read_and_recorded(tmp_path):
    pytest.importorskip("megatron.core")
    from detsampler.index.shards import finalize, source_entries
    from detsampler.index.sources import open_source

    prefix = tmp_path / "corpus_text_document"
    _megatron(prefix)
    loader = build([f"megatron:{prefix}"], 1, 0, layout="document", source_eos_id=7)
    source = open_source("megatron", prefix, eos_id=7)
    inputs, labels = next(iter(loader))
    want = PackedDataset(source, source.layout(loader.layouts[0].config)).get_batch(loader.plan.micro_batch(0, 0, 0))
    assert torch.equal(inputs["input"], want["input_ids"]) and torch.equal(inputs["positions"], want["position_ids"])
    location = DataRecord.from_json(loader.state_dict()["data_record"]).indexes[0]
    assert location["kind"] == "megatron" and location["options"]["eos_id"] == 7

    rng = np.random.default_rng(1)
    parts = []
    for k in range(2):
        part = tmp_path / "data" / f"part-{k}"
        part.parent.mkdir(exist_ok=True)
        _megatron_by_hand(part, [np.append(rng.integers(10, 500, size=int(rng.integers(5, 60))), 7) for _ in range(30)])
        parts.append(part)
    root = tmp_path / "sharded"
    sharded = finalize(root, [], None, source_entries(root, "megatron", parts, eos_id=7))
    loader = build([sharded.path, f"megatron:{prefix}"], 1, 0, weights=[1, 1], layout="bestfit", source_eos_id=7)
    rows = train_steps([loader], 2)
    assert len(rows[0]) == GLOBAL_BATCH
    assert DataRecord.from_json(loader.state_dict()["data_record"]).indexes[0]["kind"] == "index"
    with pytest.raises(ValueError, match="neither an index directory"):
        build([tmp_path / "nothing"], 1, 0)


def test_resume_refuses_another_seed_or_layout_and_accepts_a_skip_range_ahead(small_index, tmp_path):
    first = build([small_index.path], 2, 0, layout="bestfit")
    train_steps([first, build([small_index.path], 2, 1, layout="bestfit")], 3)
    dcp.save({"dataloader": first}, checkpoint_id=tmp_path / "ckpt", no_dist=True)

    def load(**config):
        loader = build([small_index.path], 1, 0, **{"layout": "bestfit", **config})
        dcp.load({"dataloader": loader}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
        return loader

    seed_changed = r"resuming at step 3 changes the plan's seed: the checkpoint has 0, the new plan 1"
    with pytest.raises(ValueError, match=seed_changed):
        load(seed=1)
    with pytest.raises(ValueError, match="resuming at step 3 changes the layout"):
        load(layout="document")
    other = tmp_path / "other"
    _megatron_by_hand(other, [np.arange(10, 10 + n) for n in range(3, 400)])
    with pytest.raises(ValueError, match="resuming at step 3 changes the index"):
        loader = build([f"megatron:{other}"], 1, 0, layout="bestfit")
        dcp.load({"dataloader": loader}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    with pytest.raises(ValueError, match=r"skip_steps adds \[\(1, 1\)\], which lies in the past of the resume"):
        load(skip_steps=[(1, 1)])
    ahead = load(skip_steps=[(5, 6)])  # a range ahead, and another dp degree: accepted
    assert ahead.state_dict()["step"] == 3
    plain = build([small_index.path], 1, 0, layout="bestfit")
    plain.load_state_dict({"step": 3, "samples_in_step": 0, "data_record": first.state_dict()["data_record"]})
    assert train_steps([ahead], 2) == train_steps([plain], 2)  # steps 3 and 4: before the range


def test_a_state_without_a_data_record_is_refused_unless_allowed(small_index):
    loader = build([small_index.path], 1, 0)
    loader.load_state_dict({})  # torchtitan's "no loader state in the checkpoint"
    assert loader.state_dict()["step"] == 0
    with pytest.raises(ValueError, match="holds no data_record.*allow_missing_data_record=True"):
        loader.load_state_dict({"step": 3, "samples_in_step": 0})
    allowed = build([small_index.path], 1, 0, allow_missing_data_record=True)
    allowed.load_state_dict({"step": 3, "samples_in_step": 0})
    assert allowed.state_dict()["step"] == 3
    json.loads(allowed.state_dict()["data_record"])


def test_an_edited_or_truncated_data_record_is_refused_naming_the_state(small_index):
    """Issue 31: a record edited by hand (world_size 2 -> 4, step and state kept) loaded as written; a truncated one
    raised a JSONDecodeError naming nothing."""
    first = build([small_index.path], 2, 0)
    train_steps([first, build([small_index.path], 2, 1)], 3)
    state = first.state_dict()
    edited = json.dumps({**json.loads(state["data_record"]), "world_size": 4})
    loader = build([small_index.path], 1, 0)
    with pytest.raises(ValueError, match=r"data loader state: the data record fails its seal \(record_sha256\)"):
        loader.load_state_dict({**state, "data_record": edited})
    with pytest.raises(ValueError, match=r"data loader state: not valid JSON \(.*\): the file is truncated"):
        loader.load_state_dict({**state, "data_record": state["data_record"][:100]})
    loader.load_state_dict(state)
    assert loader.state_dict()["step"] == 3


def test_config_errors_are_named(small_index):
    with pytest.raises(ValueError, match="index_paths names no index"):
        build([], 1, 0)
    with pytest.raises(ValueError, match="weights needs one number per index: 1 for 2"):
        build([small_index.path] * 2, 1, 0, weights=[1.0])
    with pytest.raises(ValueError, match="mixture_schedule is set but there is no mixture"):
        build([small_index.path], 1, 0, mixture_schedule=[(3, [1.0])])
    with pytest.raises(ValueError, match="source_eos_id"):
        build(["megatron:/nowhere/x"], 1, 0, source_eos="virtual")
    with pytest.raises(ValueError, match="reads index_paths, not dataset='c4'"):
        build([small_index.path], 1, 0, dataset="c4")


def test_torchtitans_command_line_sets_every_field():
    """torchtitan's ConfigManager parses its config with tyro and its own registry: each field takes CLI overrides."""
    import tyro
    from torchtitan.config.manager import custom_registry

    args = "--index-paths a b --weights 0.7 0.3 --mixture-schedule 100 0.5 0.5 --skip-steps 5 6 9 9"
    args += " --batch-size-schedule 0 256 1000 512 --layout bestfit --overlong truncate --seed 3"
    config = tyro.cli(DetsamplerDataLoader.Config, args=args.split(), registry=custom_registry)
    assert config.mixture_schedule == [(100, [0.5, 0.5])] and config.skip_steps == [(5, 6), (9, 9)]
    assert config.batch_size_schedule == [(0, 256), (1000, 512)] and config.index_paths == ["a", "b"]
    assert (config.layout, config.overlong) == ("bestfit", "truncate")


def test_overlong_examples_are_truncated_or_refused_as_configured(small_index):
    """``overlong`` reaches the layout (SFT: whole examples): every document of the small corpus is longer than
    SEQ_LEN, so under ``truncate`` each sample is one document's first SEQ_LEN tokens, positions 0 .. SEQ_LEN-1."""
    loader = build([small_index.path], 1, 0, layout="bestfit", overlong="truncate")
    described = loader.layouts[0].describe()
    assert (described["overlong"], described["examples_truncated"], described["num_samples"]) == ("truncate", 16, 16)
    (inputs, labels), *_ = draw([loader], 1)[0][0]
    assert torch.equal(inputs["positions"], torch.arange(SEQ_LEN).expand(LOCAL_BATCH, SEQ_LEN))
    assert (labels[:, :-1] != IGNORE_INDEX).all() and (labels[:, -1] == IGNORE_INDEX).all()
    assert torch.equal(labels[:, :-1], inputs["input"][:, 1:])
    with pytest.raises(ValueError) as info:
        build([small_index.path], 1, 0, layout="bestfit", overlong="cut")
    assert str(info.value) == (
        "DetsamplerDataLoader.Config.overlong must be one of ('split', 'truncate', 'drop'), got 'cut'"
    )
    with pytest.raises(ValueError) as info:
        build([small_index.path], 1, 0, layout="concat", overlong="drop")
    assert str(info.value) == (
        "DetsamplerDataLoader.Config: overlong='drop' applies to the bestfit layout only (the concat layout packs no"
        " whole examples); use kind='bestfit' or overlong='split'"
    )


def test_epoch_order_reads_each_epoch_in_its_own_document_order(small_index):
    """``epoch_order`` reaches the layout and the plan (ids carry their epoch): past the first epoch the loader reads
    the plan's epoch-1 samples, other sample boundaries than epoch 0's; a bad value is refused naming the field."""
    loader = build([small_index.path], 1, 0, epoch_order=True)
    assert loader.layouts[0].config.epoch_order and loader.plan.epoch_ids
    n = loader.layouts[0].num_samples
    steps = -(-n // GLOBAL_BATCH) + 1  # one step into epoch 1
    drawn = draw([loader], steps)
    ds = PackedDataset(small_index, loader.layouts[0])
    for step, ranks in enumerate(drawn):
        ids = loader.plan.global_batch(step)
        got = torch.cat([inputs["input"] for inputs, _ in ranks[0]])
        assert torch.equal(got, ds.get_batch(ids)["input_ids"])
    assert int(loader.plan.global_batch(steps - 1).min()) >= n  # the last step read epoch 1's ids
    with pytest.raises(ValueError) as info:
        build([small_index.path], 1, 0, epoch_order="yes")
    assert str(info.value) == "DetsamplerDataLoader.Config.epoch_order must be True or False, got 'yes'"

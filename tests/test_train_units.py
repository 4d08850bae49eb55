"""In-process tests of the trainer's parts: configuration, the model's masking and rotary positions, fingerprints,
checkpoint discovery, metrics resolution across resumes, the LR schedule. (The multi-process behaviour is in
tests/test_train_resume.py.)"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

from detsampler.balance import CostModel
from detsampler.layout import LayoutConfig, make_layout
from detsampler.plan import Plan
from train.checkpoint import (
    COMPLETE,
    DataFingerprintError,
    check_fingerprint,
    complete_checkpoints,
    data_fingerprint,
    fingerprint_changes,
    incomplete_checkpoints,
    latest_checkpoint,
    remove_incomplete,
)
from train.config import (
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    OptimizerConfig,
    RuntimeConfig,
    ScheduleConfig,
    TrainConfig,
    config_from_dict,
    config_to_dict,
    load_config,
)
from train.metrics import read_metrics, sample_hash, token_row_hashes
from train.model import Transformer, document_causal_mask
from train.train import lr_factor

CONFIGS = Path(__file__).resolve().parent.parent / "train" / "configs"


# -- configuration
# -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny.toml", "gpu.toml", "sft.toml"])
def test_shipped_configs_load(name: str) -> None:
    cfg = load_config(CONFIGS / name)
    assert isinstance(cfg, TrainConfig)
    assert config_from_dict(config_to_dict(cfg)) == cfg


def test_overrides_map_one_to_one_onto_toml_keys() -> None:
    cfg = load_config(
        CONFIGS / "tiny.toml",
        [
            "data.seq_len=32",
            "optimizer.lr=1",
            "data.source=corpus.txt",
            "data.batch_size_schedule=[[0, 8], [4, 16]]",
            "runtime.deterministic=false",
        ],
    )
    assert cfg.data.seq_len == 32
    assert cfg.optimizer.lr == 1.0 and isinstance(cfg.optimizer.lr, float)
    assert cfg.data.source == "corpus.txt"
    assert cfg.data.batch_size_schedule == ((0, 8), (4, 16))
    assert cfg.runtime.deterministic is False


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.seq_lenn=3"], "unknown key(s) ['seq_lenn'] in config section [data]"),
        (["modle.dim=3"], "unknown config section [modle]"),
        (["data.seq_len=0"], "DataConfig.seq_len must be an integer >= 1, got 0"),
        (["data.layout=packed"], "DataConfig.layout must be one of"),
        (["model.dim=30"], "ModelConfig.dim (30) must be divisible by n_heads (4)"),
        (["schedule.decay=exp"], "ScheduleConfig.decay must be"),
        (["seq_len=3"], "--set expects section.key=value"),
        (
            ["data.mapping_version=4"],
            "DataConfig.mapping_version must be 0 (the checkpoint's, else the current one) or one of",
        ),
    ],
)
def test_bad_configuration_names_the_parameter(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError) as info:
        load_config(CONFIGS / "tiny.toml", overrides)
    assert message in str(info.value)


# -- model
# -------------------------------------------------------------------------------------------------------------------


def _model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=50, dim=32, n_layers=2, n_heads=4)).eval()


def test_document_mask_keeps_documents_apart() -> None:
    model = _model()
    ids = torch.randint(0, 50, (1, 12))
    docs = torch.tensor([[0] * 5 + [1] * 7])
    positions = torch.tensor([list(range(5)) + list(range(7))])
    changed = ids.clone()
    changed[0, :5] = (changed[0, :5] + 1) % 50  # another first document
    with torch.no_grad():
        masked = model(ids, positions, docs), model(changed, positions, docs)
        plain = model(ids, positions), model(changed, positions)
    assert torch.equal(masked[0][0, 5:], masked[1][0, 5:])  # the second document never sees the first
    assert not torch.equal(plain[0][0, 5:], plain[1][0, 5:])  # (without the mask it does)


def test_packed_document_with_restarted_positions_equals_the_document_alone() -> None:
    model = _model(1)
    a, b = torch.randint(0, 50, (1, 4)), torch.randint(0, 50, (1, 6))
    packed = torch.cat([a, b], dim=1)
    docs = torch.tensor([[3] * 4 + [8] * 6])
    positions = torch.tensor([list(range(4)) + list(range(6))])
    with torch.no_grad():
        together = model(packed, positions, docs)[0, 4:]
        alone = model(b)[0]
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)


def test_attention_is_causal() -> None:
    model = _model(2)
    ids = torch.randint(0, 50, (2, 10))
    later = ids.clone()
    later[:, 6:] = (later[:, 6:] + 7) % 50
    with torch.no_grad():
        assert torch.equal(model(ids)[:, :6], model(later)[:, :6])


def test_mask_never_leaves_a_row_empty() -> None:
    mask = document_causal_mask(torch.tensor([[0, 0, -1, -1, 1]]))
    assert mask.shape == (1, 1, 5, 5)
    assert mask.any(dim=-1).all()
    assert mask[0, 0, 4].tolist() == [False, False, False, False, True]


# -- fingerprints and checkpoint discovery
# -----------------------------------------------------------------------------------


def _fingerprint(seed: int = 0, world_size: int = 1, micro_batch_size: int = 2, seq_len: int = 64) -> dict:
    plan = Plan(
        num_samples=100, seed=seed, global_batch_size=8, micro_batch_size=micro_batch_size, world_size=world_size
    )
    layout = {"kind": "concat", "seq_len": seq_len, "seed": seed, "num_samples": 100}
    return data_fingerprint("idx", layout, plan.fingerprint())


def test_fingerprint_ignores_ranks_and_micro_batch_but_names_what_changed() -> None:
    base = _fingerprint()
    assert _fingerprint(world_size=2, micro_batch_size=4)["hash"] == base["hash"]
    other = _fingerprint(seed=1, seq_len=32)
    assert other["hash"] != base["hash"]
    changes = fingerprint_changes(base, other)
    assert "layout.seq_len: 64 -> 32" in changes
    assert any(c.startswith("plan.seed: 0 -> 1") for c in changes)
    with pytest.raises(DataFingerprintError, match="layout.seq_len: 64 -> 32"):
        check_fingerprint(Path("ckpt"), base, other)
    check_fingerprint(Path("ckpt"), base, _fingerprint(world_size=4, micro_batch_size=1))


def _fake_checkpoint(root: Path, name: str, complete: bool = True) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / ".metadata").write_bytes(b"x")
    if complete:
        (d / COMPLETE).write_text("1\n")
    return d


def test_newest_complete_checkpoint_ignores_temporary_and_incomplete(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    _fake_checkpoint(tmp_path, "step_00000002")
    newest = _fake_checkpoint(tmp_path, "step_00000010")
    _fake_checkpoint(tmp_path, ".tmp-step_00000012", complete=False)
    _fake_checkpoint(tmp_path, "step_00000014", complete=False)
    assert latest_checkpoint(tmp_path) == newest
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step_00000002", "step_00000010"]
    assert [p.name for p in incomplete_checkpoints(tmp_path)] == ["step_00000014"]  # moved aside by a run, not deleted
    removed = sorted(p.name for p in remove_incomplete(tmp_path))
    assert removed == [".tmp-step_00000012"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002", "step_00000010", "step_00000014"]


# -- metrics
# -----------------------------------------------------------------------------------------------------------------


def test_read_metrics_applies_resumes(tmp_path: Path) -> None:
    lines = [{"event": "start", "step": 0}]
    lines += [{"event": "step", "step": s, "loss": float(s)} for s in range(6)]
    lines += [{"event": "resumed_from", "step": 4, "world_size": 1}]
    lines += [{"event": "step", "step": s, "loss": 10.0 + s} for s in range(4, 8)]
    text = "\n".join(json.dumps(r) for r in lines) + '\n{"event": "step", "st'  # a line cut by a kill
    (tmp_path / "metrics.jsonl").write_text(text)
    m = read_metrics(tmp_path)
    assert sorted(m.steps) == list(range(8))
    assert [m.steps[s]["loss"] for s in range(8)] == [0.0, 1.0, 2.0, 3.0, 14.0, 15.0, 16.0, 17.0]
    assert m.superseded == 2 and [r["step"] for r in m.discarded] == [4, 5]
    assert [e["step"] for e in m.resumes] == [4]


def test_hashes_see_every_id_and_token() -> None:
    ids = np.arange(16, dtype=np.int64)
    assert sample_hash(ids) == sample_hash(ids.copy())
    assert sample_hash(ids) != sample_hash(ids[::-1])
    rows = np.arange(40, dtype=np.int64).reshape(4, 10)
    h = token_row_hashes(rows)
    changed = rows.copy()
    changed[2, 9] += 1
    h2 = token_row_hashes(changed)
    assert h.dtype == np.uint64 and h2[2] != h[2] and np.array_equal(np.delete(h, 2), np.delete(h2, 2))
    swapped = rows.copy()
    swapped[0, [0, 1]] = swapped[0, [1, 0]]
    assert token_row_hashes(swapped)[0] != h[0]


def test_learning_rate_schedule() -> None:
    cfg = load_config(None, ["schedule.steps=100", "schedule.warmup_steps=10", "schedule.min_lr_ratio=0.1"])
    assert lr_factor(cfg, 0) == pytest.approx(0.1)
    assert lr_factor(cfg, 9) == pytest.approx(1.0)
    assert lr_factor(cfg, 10) == pytest.approx(1.0)
    assert lr_factor(cfg, 100) == pytest.approx(0.1)
    values = [lr_factor(cfg, s) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_thread_prefetcher_keeps_order_raises_where_the_reader_failed_and_stops():
    import threading

    from train.data import ThreadPrefetcher

    assert list(ThreadPrefetcher(range(100), depth=3)) == list(range(100))

    def failing():
        yield from range(5)
        raise RuntimeError("corrupt batch")

    got = []
    with pytest.raises(RuntimeError, match="corrupt batch"):
        for item in ThreadPrefetcher(failing(), depth=2):
            got.append(item)
    assert got == [0, 1, 2, 3, 4]

    endless = ThreadPrefetcher(iter(int, 1), depth=2)  # never ends
    assert next(endless) == 0
    endless.close()
    assert not any(t.name == "batch-prefetch" and t.is_alive() and t is endless._thread for t in threading.enumerate())
    with pytest.raises(ValueError, match="prefetch depth must be >= 1, got 0"):
        ThreadPrefetcher(range(3), depth=0)


def test_the_mapping_version_comes_from_the_config_else_the_checkpoint_else_the_current_one() -> None:
    from train.checkpoint import saved_mapping_version
    from train.config import DataConfig
    from train.train import _data_config

    v1_meta = {"step": 4, "data": {"plan": Plan(100, 0, 8, 2, mapping_version=1).fingerprint()}}
    assert saved_mapping_version(v1_meta["data"]) == 1
    assert _data_config(DataConfig(), v1_meta).mapping_version == 1  # a run started on version 1 resumes on it
    assert _data_config(DataConfig(), None).mapping_version == 2  # a new run: the current version
    assert (
        _data_config(DataConfig(mapping_version=2), v1_meta).mapping_version == 2
    )  # as asked (the fingerprint check refuses)
    with pytest.raises(DataFingerprintError, match="records no mapping version"):
        saved_mapping_version({"plan": {"seed": 0}})


def test_balance_maps_one_to_one_onto_the_cost_model_and_keeps_its_mapping_version() -> None:
    """``[data] balance``: a table of CostModel's fields (or true), strictly checked; a balanced run is version 3, new
    or resumed, and a resume keeps the checkpoint's balance (issue 34)."""
    from detsampler.balance import Balance
    from train.config import DataConfig
    from train.train import _data_config

    data = lambda *sets: load_config(CONFIGS / "tiny.toml", list(sets)).data
    assert data().balance is None
    assert data("data.balance=true").balance == CostModel() == data("data.balance={}").balance
    assert data("data.balance={attention = 0, fixed = 2.5}").balance == CostModel(attention=0.0, fixed=2.5)
    assert data("data.balance=false").balance is None
    for bad, message in [
        ("data.balance={quadratic = 1}", r"DataConfig.balance: unknown key\(s\) \['quadratic'\]; allowed keys are"),
        ("data.balance={linear = -1}", "DataConfig.balance: CostModel.linear must be a finite number >= 0, got -1"),
        ("data.mapping_version=3", "DataConfig.mapping_version 3 is the balanced plan's: set balance"),
    ]:
        with pytest.raises(ValueError, match=message):
            data(bad)
    with pytest.raises(ValueError, match="DataConfig.mapping_version 2 with balance set: a balanced plan is mapping"):
        data("data.balance=true", "data.mapping_version=2")
    balanced = DataConfig(balance=True)
    assert _data_config(balanced, None).mapping_version == 3
    layout = make_layout(LayoutConfig(kind="bestfit", seq_len=16), np.arange(1, 50))
    v3 = Plan(layout.num_samples, 0, 8, 2, balance=Balance(layout)).fingerprint()
    v2 = Plan(layout.num_samples, 0, 8, 2).fingerprint()
    assert _data_config(balanced, {"step": 4, "data": {"plan": v3}}).mapping_version == 3
    with pytest.raises(DataFingerprintError, match=r"was not balanced \(mapping version 2\) but \[data\] balance"):
        _data_config(balanced, {"step": 4, "data": {"plan": v2}})
    with pytest.raises(DataFingerprintError, match=r"was balanced \(mapping version 3\) but \[data\] balance is off"):
        _data_config(DataConfig(), {"step": 4, "data": {"plan": v3}})


def test_metrics_are_strict_json_even_for_a_nan_loss(tmp_path: Path) -> None:
    """A NaN loss used to be written as a bare ``NaN``, which strict JSON parsers reject (issue 10 item 12)."""
    import json

    from train.metrics import MetricsLog

    log = MetricsLog(tmp_path)
    log.write({"event": "step", "step": 0, "loss": float("nan"), "extra": [float("inf"), 1.5]})
    log.close()

    def refuse(token: str) -> None:
        raise ValueError(f"non-standard JSON constant {token}")

    record = json.loads((tmp_path / "metrics.jsonl").read_text(), parse_constant=refuse)
    assert record == {"event": "step", "step": 0, "loss": None, "extra": [None, 1.5]}


# -- every configuration field checked by its declared type (issue 21 item 4)
# ----------------------------------------------------------------------------

SECTION_CLASSES = {
    "model": ModelConfig,
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "schedule": ScheduleConfig,
    "checkpoint": CheckpointConfig,
    "runtime": RuntimeConfig,
}
A_SOURCE = 'must be a path or a table {kind = "megatron", path = "..."}'


TABLES = {  # the fields declared Any: a table of a library dataclass's fields, true or false
    "instance_filter": "must be a table {max_period = 13, min_period = 1, max_count = 32}, true or false",
    "prefetch": (
        "must be a table {budget_bytes = 67108864, cache_bytes = 134217728, threads = 8, block_bytes = 65536}, true or"
        " false"
    ),
    "balance": "must be a table {"
    + ", ".join(f"{k} = {v!r}" for k, v in CostModel().describe().items())
    + "}, true or false",
}


def _wrong_values(annotation: object, string: str, name: str = "") -> list[tuple[str, str, str]]:
    """``(--set text, where in the value, the rest of the message)``: values of the wrong type for a field ``name``
    declared ``annotation`` (``string``: what the message says a string field must be)."""
    if annotation is bool:  # --set x=False is no TOML boolean: it is the string 'False', which used to be truthy
        return [
            ("False", "", "must be true or false, got 'False' (str)"),
            ("1", "", "must be true or false, got 1 (int)"),
        ]
    if annotation is int:
        return [
            ("4.5", "", "must be an integer, got 4.5 (float)"),
            ("true", "", "must be an integer, got True (bool)"),
            ('"3"', "", "must be an integer, got '3' (str)"),
        ]
    if annotation is float:
        return [
            ("nan", "", "must be a finite number, got nan (float)"),
            ("inf", "", "must be a finite number, got inf (float)"),
            ("-inf", "", "must be a finite number, got -inf (float)"),
            ("true", "", "must be a finite number, got True (bool)"),
            ('"x"', "", "must be a finite number, got 'x' (str)"),
        ]
    if annotation is str:
        return [("5", "", f"{string}, got 5 (int)"), ("[1]", "", f"{string}, got [1] (list)")]
    if annotation is typing.Any:  # data.instance_filter, data.prefetch: a table, true or false
        table = TABLES[name]
        return [("5", "", f"{table}, got 5 (int)"), ('"x"', "", f"{table}, got 'x' (str)")]
    assert typing.get_origin(annotation) is tuple, f"no wrong values for {annotation!r}"
    out = [("5", "", "must be a list, got 5 (int)")]
    item = typing.get_args(annotation)[0]
    if item is str:
        out.append(("[5]", "[0]", f"{string}, got 5 (int)"))
    elif typing.get_origin(item) is tuple:  # pairs
        out.append(("[[0]]", "[0]", "must be a list of 2 items, got [0] (list)"))
        second = "1" if typing.get_args(item)[1] is int else "[1]"
        out.append((f"[[0.5, {second}]]", "[0][0]", "must be an integer, got 0.5 (float)"))
    return out


def _every_wrong_value() -> list[tuple[str, str, str, str]]:
    cases = []
    for section, cls in SECTION_CLASSES.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            string = A_SOURCE if f.name in ("source", "mixture_sources") else "must be a string"
            for text, where, message in _wrong_values(hints[f.name], string, f.name):
                cases.append((section, f.name, text, f"{cls.__name__}.{f.name}{where} {message}"))
    return cases


@pytest.mark.parametrize("section, name, text, message", _every_wrong_value())
def test_every_field_refuses_a_value_of_the_wrong_type(section: str, name: str, text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        load_config(CONFIGS / "tiny.toml", [f"{section}.{name}={text}"])
    assert str(info.value) == message


def test_the_wrong_type_test_covers_every_field() -> None:
    covered = {(section, name) for section, name, _, _ in _every_wrong_value()}
    every = {(section, f.name) for section, cls in SECTION_CLASSES.items() for f in dataclasses.fields(cls)}
    assert covered == every and len(every) == 65


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "data.batch_size_schedule=[[0, 4.5], [2, 8]]",
            "DataConfig.batch_size_schedule[0][1] must be an integer, got 4.5 (float)",
        ),
        ("model.tie_embeddings=False", "ModelConfig.tie_embeddings must be true or false, got 'False' (str)"),
        ("runtime.deterministic=False", "RuntimeConfig.deterministic must be true or false, got 'False' (str)"),
        ("checkpoint.save_final=no", "CheckpointConfig.save_final must be true or false, got 'no' (str)"),
        ("optimizer.lr=inf", "OptimizerConfig.lr must be a finite number, got inf (float)"),
        ("model.rope_theta=nan", "ModelConfig.rope_theta must be a finite number, got nan (float)"),
        ("optimizer.grad_clip=nan", "OptimizerConfig.grad_clip must be a finite number, got nan (float)"),
        ("optimizer.lr=1e400", "OptimizerConfig.lr must be a finite number, got inf (float)"),
        ("optimizer.lr=-1", "OptimizerConfig.lr must be a number > 0, got -1.0"),
        ("model.init_seed=-1", "ModelConfig.init_seed must be an integer >= 0, got -1"),
    ],
)
def test_the_coercions_of_issue_21_are_refused(override: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        load_config(CONFIGS / "tiny.toml", [override])
    assert str(info.value) == message


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["data.loss_policy=assistnat"],
            "DataConfig.loss_policy must be one of ('assistant', 'last_turn', 'completion', 'all') or empty (plain"
            " text), got 'assistnat'",
        ),
        (
            ["data.loss_policy=completion"],
            "DataConfig.loss_policy: Got policy 'completion', allowed policies for a messages column are assistant,"
            " last_turn, all",
        ),
        (
            ["data.text_column=prompt", "data.completion_column=completion", "data.loss_policy=assistant"],
            "DataConfig.loss_policy: Got policy 'assistant', allowed policies for prompt/completion columns are"
            " completion, all",
        ),
        (
            ["data.completion_column=completion"],
            "DataConfig.completion_column ('completion') is for prompt/completion data: set loss_policy too"
            " (completion or all)",
        ),
        (["data.overlong=cut"], "DataConfig.overlong must be one of ('split', 'truncate', 'drop'), got 'cut'"),
        (
            ["data.layout=concat", "data.overlong=drop"],
            "DataConfig: overlong='drop' applies to the bestfit layout only (the concat layout packs no whole"
            " examples); use kind='bestfit' or overlong='split'",
        ),
    ],
)
def test_sft_fields_are_validated_strictly(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError) as info:
        load_config(CONFIGS / "sft.toml", ["data.loss_policy=''", *overrides])
    assert str(info.value) == message


def test_sft_fields_map_onto_the_index_and_layout_configs() -> None:
    from train.data import _layout_config, index_config

    cfg = load_config(CONFIGS / "sft.toml").data
    assert (cfg.text_column, cfg.loss_policy, cfg.completion_column, cfg.overlong) == (
        "messages",
        "assistant",
        "",
        "truncate",
    )
    index = index_config(cfg)
    assert (index.text_column, index.loss_policy, index.completion_column) == ("messages", "assistant", None)
    assert _layout_config(cfg).overlong == "truncate" and _layout_config(cfg).kind == "bestfit"
    plain = load_config(CONFIGS / "tiny.toml").data
    assert index_config(plain).loss_policy is None and index_config(plain).chat is None
    assert _layout_config(plain).overlong == "split"
    prompts = load_config(
        CONFIGS / "sft.toml",
        ["data.text_column=prompt", "data.completion_column=completion", "data.loss_policy=completion"],
    ).data
    assert index_config(prompts).chat.columns == ("prompt", "completion")


@pytest.mark.parametrize("store_tokens", [True, False], ids=["stored", "on-the-fly"])
def test_the_sft_path_trains_no_label_across_conversations_under_concat(tmp_path: Path, store_tokens: bool) -> None:
    """Issue 31 item 6 through the trainer's own data path (``build_pipeline``, its DataLoader and ``steps()``):
    ``sft.toml`` with ``layout = "concat"`` and ``loss_policy = "all"`` trained the label at each conversation's EOS,
    the next conversation's first token; now every trained label's target is of its position's example."""
    from tests.chat_data import crossing_labels
    from train.chat_corpus import write_chat_corpus
    from train.data import build_pipeline
    from train.recompute import step_batches

    corpus, tokenizer = write_chat_corpus(tmp_path / "chat", num_conversations=60)
    settings = {
        "data.source": f'"{corpus}"',
        "data.tokenizer": f'"{tokenizer}"',
        "data.cache_dir": f'"{tmp_path / "cache"}"',
        "data.layout": '"concat"',
        "data.overlong": '"split"',
        "data.loss_policy": '"all"',
        "data.seq_len": 64,
        "data.store_tokens": str(store_tokens).lower(),
    }
    cfg = load_config(CONFIGS / "sft.toml", [f"{k}={v}" for k, v in settings.items()])
    pipeline = build_pipeline(cfg.data, world_size=2)
    trained = 0
    for step in range(3):
        for rank, micro_batches in enumerate(step_batches(pipeline, step)):
            for micro_step, mb in enumerate(micro_batches):
                ids = pipeline.plan.micro_batch(step, micro_step, rank)
                spans = pipeline.layout.locate(ids)
                assert crossing_labels(spans, pipeline.layout.sample_len, mb["loss_mask"].numpy()) == 0
                assert torch.equal(mb["loss_mask"], mb["labels"] != -100)
                trained += int(mb["loss_mask"].sum())
    assert trained > 0


def test_toml_values_of_the_declared_types_are_taken() -> None:
    cfg = load_config(
        None,
        [
            "model.tie_embeddings=true",
            "runtime.deterministic=false",
            "checkpoint.save_final=false",
            "optimizer.lr=1",
            "model.rope_theta=500000",
            "data.batch_size_schedule=[[0, 4], [2, 8]]",
            "data.mixture_sources=['a.txt', {kind = 'megatron', path = 'b'}]",
            "data.mixture_weights=[1, '1/3']",
            "data.mixture_schedule=[[4, [1, 2]], {step = 8, weights = [2, 1]}]",
        ],
    )
    assert cfg.model.tie_embeddings is True and cfg.runtime.deterministic is False
    assert cfg.checkpoint.save_final is False
    assert cfg.optimizer.lr == 1.0 and type(cfg.optimizer.lr) is float
    assert cfg.model.rope_theta == 500000.0 and type(cfg.model.rope_theta) is float
    assert cfg.data.batch_size_schedule == ((0, 4), (2, 8))
    assert cfg.data.mixture_sources == ("a.txt", "megatron:b")
    assert cfg.data.mixture_weights == (1, "1/3")
    assert cfg.data.mixture_schedule == ((4, (1, 2)), (8, (2, 1)))
    assert config_from_dict(config_to_dict(cfg)) == cfg


def test_the_trainer_caches_where_the_library_does(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``data.cache_dir`` defaulted to ``.cache/detsampler`` and ignored ``$DETSAMPLER_CACHE``, so the trainer
    re-tokenized a corpus whose index ``detsampler build`` had already cached there (issue 21)."""
    from train.data import index_config

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "shared"))
    assert index_config(load_config(CONFIGS / "tiny.toml").data).cache_path == tmp_path / "shared"
    assert index_config(load_config(None, ["data.cache_dir=mine"]).data).cache_path == Path("mine")
    monkeypatch.delenv("DETSAMPLER_CACHE")
    assert index_config(load_config(CONFIGS / "tiny.toml").data).cache_path == tmp_path / ".cache" / "detsampler"


def test_redactions_map_one_to_one_and_are_checked() -> None:
    from detsampler.redaction import Redaction

    cfg = load_config(
        CONFIGS / "tiny.toml",
        ["data.redactions=[{documents = [9, 2], from_step = 5}, {documents = [4], from_step = 1}]"],
    )
    assert cfg.data.redactions == ({"documents": [4], "from_step": 1}, {"documents": [2, 9], "from_step": 5})
    assert config_from_dict(config_to_dict(cfg)) == cfg
    from train.data import _plan

    plan = _plan(cfg.data, 1, num_samples=100)
    assert plan.redactions == (Redaction([4], 1), Redaction([2, 9], 5))
    assert plan.fingerprint()["redactions"] == [[1, [4]], [5, [2, 9]]]
    for bad, message in [
        ("[{documents = [1]}]", "DataConfig.redactions[0]: a redaction is {documents = [ids], paths = [...], sha256"),
        ("[{from_step = 1}]", "DataConfig.redactions[0] names no document: give documents = [ids], paths"),
        ("[{paths = [3], from_step = 1}]", "DataConfig.redactions[0].paths must be a list of strings, got [3]"),
        ("[{documents = [1.5], from_step = 0}]", "DataConfig.redactions: Redaction.documents must hold document ids"),
        ("[{documents = [1], from_step = -2}]", "DataConfig.redactions: Redaction.from_step must be an integer >= 0"),
        (
            "[{documents = [1], from_step = 2}, {documents = [1], from_step = 3}]",
            "DataConfig.redactions: document 1 is redacted from step 2 and again from step 3",
        ),
    ]:
        with pytest.raises(ValueError) as info:
            load_config(CONFIGS / "tiny.toml", [f"data.redactions={bad}"])
        assert str(info.value).startswith(message), str(info.value)


def test_redaction_paths_resolve_against_the_dataset_path_column() -> None:
    import datasets

    from detsampler.redaction import Redaction, documents_by_path
    from train.data import resolve_redactions

    ds = datasets.Dataset.from_dict({"text": ["a", "b", "c", "d"], "path": ["x.py", "y.py", "x.py", "z.py"]})
    assert documents_by_path(ds["path"], ["x.py", "z.py"]) == [0, 2, 3]
    with pytest.raises(ValueError, match=r"paths \['nope.py'\] name no document"):
        documents_by_path(ds["path"], ["y.py", "nope.py"])
    cfg = load_config(
        CONFIGS / "tiny.toml", ['data.redactions=[{documents = [1], paths = ["z.py", "x.py"], from_step = 3}]']
    )
    assert cfg.data.redactions == ({"documents": [1], "from_step": 3, "paths": ["x.py", "z.py"]},)
    assert config_from_dict(config_to_dict(cfg)) == cfg
    assert resolve_redactions(cfg.data, ds) == [Redaction([0, 1, 2, 3], 3)]
    with pytest.raises(ValueError, match="has no path column: give document ids"):
        resolve_redactions(cfg.data, ds.remove_columns("path"))
    from train.data import _plan, check_redacted_documents

    plan = _plan(cfg.data, 1, num_samples=10, dataset=ds)
    check_redacted_documents(plan, 4)
    with pytest.raises(ValueError, match=r"from step 3 names documents \[3\]: the index holds documents 0 .. 2"):
        check_redacted_documents(plan, 3)


def test_mixture_redactions_name_their_source() -> None:
    """Over a mixture each ``data.redactions`` entry names its source (a ``mixture_names`` entry or an index), kept as
    the index; paths resolve against that source's dataset and ids are checked against that source's documents."""
    import datasets

    from detsampler.mixture import Mixture
    from detsampler.redaction import Redaction
    from train.data import _plan, check_redacted_documents, resolve_redactions

    mix = [
        'data.mixture_sources=["a.txt", "b.txt"]',
        "data.mixture_weights=[1, 1]",
        'data.mixture_names=["web", "code"]',
    ]
    entries = '[{source = "code", paths = ["x.py"], from_step = 4}, {source = 0, documents = [3], from_step = 4}]'
    cfg = load_config(CONFIGS / "tiny.toml", [*mix, f"data.redactions={entries}"])
    assert cfg.data.redactions == (
        {"documents": [3], "from_step": 4, "source": 0},
        {"documents": [], "from_step": 4, "source": 1, "paths": ["x.py"]},
    )
    assert config_from_dict(config_to_dict(cfg)) == cfg
    web = datasets.Dataset.from_dict({"text": ["a", "b", "c", "d"], "path": ["x.py", "y.py", "z.py", "w.py"]})
    code = datasets.Dataset.from_dict({"text": ["e", "f"], "path": ["y.py", "x.py"]})
    assert resolve_redactions(cfg.data, [web, code]) == [Redaction([3], 4, 0), Redaction([1], 4, 1)]
    plan = _plan(cfg.data, 1, source=Mixture([10, 10], [1, 1], 0), dataset=[web, code])
    assert plan.fingerprint()["redactions"] == [[4, [3], 0], [4, [1], 1]]
    check_redacted_documents(plan, [4, 2], cfg.data)
    with pytest.raises(
        ValueError, match=r"from step 4 \(source web\) names documents \[3\]: that source holds documents 0 .. 2"
    ):
        check_redacted_documents(plan, [3, 2], cfg.data)
    for bad, message in [
        (
            '[{source = "books", documents = [1], from_step = 1}]',
            "DataConfig.redactions[0].source 'books' is no source",
        ),
        ("[{source = 2, documents = [1], from_step = 1}]", "DataConfig.redactions[0].source 2 is no source of the"),
        ("[{documents = [1], from_step = 1}]", "DataConfig.redactions[0] names no source: over a mixture each"),
        (
            '[{source = "web", documents = [1], from_step = 1}, {source = "web", documents = [2], from_step = 1}]',
            "DataConfig.redactions: two redactions of source 0 from step 1",
        ),
    ]:
        with pytest.raises(ValueError) as info:
            load_config(CONFIGS / "tiny.toml", [*mix, f"data.redactions={bad}"])
        assert str(info.value).startswith(message), str(info.value)
    with pytest.raises(ValueError, match=r"redactions\[0\].source is for a mixture \(mixture_sources\)"):
        load_config(CONFIGS / "tiny.toml", ['data.redactions=[{source = "web", documents = [1], from_step = 1}]'])


def test_redaction_content_hashes_resolve_against_the_dataset_text() -> None:
    """``sha256 = [...]`` entries (issue 24 item 5): the sha256 of a document's UTF-8 text names it, wherever it sits
    in the corpus (a takedown names content, not ids); a hash naming no document, or not a sha256, is refused."""
    import hashlib

    import datasets

    from detsampler.redaction import Redaction, content_hash, documents_by_content_hash
    from train.data import resolve_redactions

    texts = ["alpha", "beta", "alpha", "gamma é"]
    ds = datasets.Dataset.from_dict({"text": texts, "path": ["a", "b", "c", "d"]})
    h = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
    assert content_hash("gamma é") == h[3]
    assert documents_by_content_hash(ds["text"], [h[0], h[3].upper()]) == [0, 2, 3]  # equal texts: both rows
    missing = hashlib.sha256(b"delta").hexdigest()
    with pytest.raises(ValueError, match=rf"content hashes \['{missing}'\] name no document"):
        documents_by_content_hash(ds["text"], [h[1], missing])
    with pytest.raises(ValueError, match="64 hexadecimal digits"):
        documents_by_content_hash(ds["text"], ["abc"])
    cfg = load_config(CONFIGS / "tiny.toml", [f'data.redactions=[{{sha256 = ["{h[1]}"], from_step = 2}}]'])
    assert cfg.data.redactions == ({"documents": [], "from_step": 2, "sha256": [h[1]]},)
    assert config_from_dict(config_to_dict(cfg)) == cfg
    assert resolve_redactions(cfg.data, ds) == [Redaction([1], 2)]
    with pytest.raises(ValueError, match="has no text column 'text': give document ids"):
        resolve_redactions(cfg.data, ds.remove_columns("text"))
    with pytest.raises(ValueError, match=r"DataConfig.redactions\[0\].sha256 must be a list of sha256 hex digests"):
        load_config(CONFIGS / "tiny.toml", ['data.redactions=[{sha256 = ["xyz"], from_step = 2}]'])


def test_redaction_content_hashes_resolve_against_chat_rows() -> None:
    """Issue 31: ``sha256 = [...]`` over a ``messages`` corpus (``sft.toml``) raised ``AttributeError: 'list' object has
    no attribute 'encode'``. A chat row's hash is the sha256 of the canonical JSON of its rendered columns
    (``detsampler.content``), over a mixture of chat sources too; a text's hash would name no row, and says so."""
    import hashlib

    import datasets

    from detsampler.redaction import Redaction
    from train.chat_corpus import conversations
    from train.data import resolve_redactions

    def row_hash(row: dict) -> str:
        text = json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    convs = conversations(6, seed=2)
    ds = datasets.Dataset.from_dict({"messages": convs, "id": list(range(6))})
    h = row_hash({"messages": convs[4]})
    cfg = load_config(CONFIGS / "sft.toml", [f'data.redactions=[{{sha256 = ["{h}"], from_step = 2}}]'])
    assert resolve_redactions(cfg.data, ds) == [Redaction([4], 2)]
    prompts = datasets.Dataset.from_dict({"prompt": ["p1", "p2"], "completion": ["c1", "c2"]})
    h = row_hash({"prompt": "p2", "completion": "c2"})
    pc = ["data.text_column=prompt", "data.completion_column=completion", "data.loss_policy=completion"]
    cfg = load_config(CONFIGS / "sft.toml", [*pc, f'data.redactions=[{{sha256 = ["{h}"], from_step = 1}}]'])
    assert resolve_redactions(cfg.data, prompts) == [Redaction([1], 1)]
    text = hashlib.sha256(convs[4][0]["content"].encode()).hexdigest()
    cfg = load_config(CONFIGS / "sft.toml", [f'data.redactions=[{{sha256 = ["{text}"], from_step = 2}}]'])
    with pytest.raises(ValueError, match=r"name no document .* canonical JSON of its columns \['messages'\]"):
        resolve_redactions(cfg.data, ds)


def test_instance_filter_maps_one_to_one_and_reaches_the_dataset(small_index) -> None:
    from types import SimpleNamespace

    from detsampler.filter import RepetitionFilter
    from detsampler.layout import LayoutConfig
    from train.config import config_from_dict, config_to_dict
    from train.data import _packed_dataset

    assert load_config(CONFIGS / "tiny.toml").data.instance_filter is None  # off by default
    assert load_config(CONFIGS / "tiny.toml", ["data.instance_filter=true"]).data.instance_filter == RepetitionFilter()
    cfg = load_config(CONFIGS / "tiny.toml", ["data.instance_filter={max_period = 4, max_count = 3}"])
    assert cfg.data.instance_filter == RepetitionFilter(max_period=4, min_period=1, max_count=3)
    assert config_from_dict(config_to_dict(cfg)) == cfg  # config.json round trip
    assert load_config(CONFIGS / "tiny.toml", ["data.instance_filter=false"]).data.instance_filter is None
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['period'\]"):
        load_config(CONFIGS / "tiny.toml", ["data.instance_filter={period = 4}"])
    with pytest.raises(ValueError, match="DataConfig.instance_filter: RepetitionFilter.max_count must be"):
        load_config(CONFIGS / "tiny.toml", ["data.instance_filter={max_count = 0}"])
    layout = small_index.layout(LayoutConfig(kind="concat", seq_len=64))
    ds = _packed_dataset(SimpleNamespace(index=small_index), layout, "text", cfg.data.instance_filter)
    batch = ds.get_batch(range(400))
    masked = (batch["labels"] == -100).all(1)
    assert ds.instance_filter == cfg.data.instance_filter and 0 < int(masked.sum()) < 400


def test_prefetch_maps_one_to_one_onto_prefetch_config_and_is_validated() -> None:
    from detsampler.loader import PrefetchConfig

    def data(*overrides: str) -> DataConfig:
        return load_config(CONFIGS / "tiny.toml", list(overrides)).data

    assert data().prefetch is None and data().worker_start_method == ""  # off, the start method chosen by the index
    assert data("data.prefetch=true").prefetch == PrefetchConfig() == data("data.prefetch={}").prefetch
    assert data("data.prefetch=false").prefetch is None
    cfg = load_config(
        CONFIGS / "tiny.toml",
        [
            "data.prefetch={budget_bytes = 1_048_576, cache_bytes = 2_097_152, threads = 4, block_bytes = 131_072,"
            " max_micro_batches_ahead = 16}"
        ],
    )
    assert cfg.data.prefetch == PrefetchConfig(
        budget_bytes=1 << 20, cache_bytes=2 << 20, threads=4, block_bytes=1 << 17, max_micro_batches_ahead=16
    )
    assert config_from_dict(config_to_dict(cfg)) == cfg  # config.json round trip
    node = data('data.prefetch={node_cache = "/dev/shm/detsampler", node_cache_bytes = 1_073_741_824}').prefetch
    assert (node.node_cache, node.node_cache_bytes) == ("/dev/shm/detsampler", 1 << 30)  # issue 37: a node's cache
    assert data("data.worker_start_method=spawn").worker_start_method == "spawn"
    for override, message in [
        (
            "data.prefetch={budget_mb = 64}",
            "DataConfig.prefetch: unknown key(s) ['budget_mb']; allowed keys are ['block_bytes', 'budget_bytes',"
            " 'cache_bytes', 'max_micro_batches_ahead', 'node_cache', 'node_cache_bytes', 'source_block_bytes',"
            " 'threads']",
        ),
        (
            "data.prefetch={max_micro_batches_ahead = 0}",
            "DataConfig.prefetch: PrefetchConfig.max_micro_batches_ahead must be an integer >= 1, got 0",
        ),
        (
            "data.prefetch={budget_bytes = 1_048_576, cache_bytes = 2_097_152, block_bytes = 16_777_216}",
            "DataConfig.prefetch: PrefetchConfig.cache_bytes (2097152) must be >= block_bytes (16777216): a block"
            " larger than the cache is never held, so every read would fetch it again",
        ),
        ("data.prefetch={threads = 0}", "DataConfig.prefetch: PrefetchConfig.threads must be an integer >= 1, got 0"),
        (
            "data.prefetch={threads = 2.5}",
            "DataConfig.prefetch: PrefetchConfig.threads must be an integer >= 1, got 2.5",
        ),
        (
            "data.prefetch={threads = true}",
            "DataConfig.prefetch: PrefetchConfig.threads must be an integer >= 1, got True",
        ),
        (
            'data.prefetch={budget_bytes = "64"}',
            "DataConfig.prefetch: PrefetchConfig.budget_bytes must be an integer >= 1, got '64'",
        ),
        (
            "data.prefetch={block_bytes = 1000}",
            "DataConfig.prefetch: PrefetchConfig.block_bytes must be a multiple of 65536, got 1000",
        ),
        (
            "data.prefetch={budget_bytes = 2048, cache_bytes = 1024}",
            "DataConfig.prefetch: PrefetchConfig.cache_bytes (1024) must be >= budget_bytes (2048): the cache holds"
            " what is fetched ahead",
        ),
        (
            "data.worker_start_method=thread",
            "DataConfig.worker_start_method must be one of ('', 'fork', 'forkserver', 'spawn') (empty: forkserver over"
            " an index in an object store, else the platform's default), got 'thread'",
        ),
    ]:
        with pytest.raises(ValueError) as info:
            data(override)
        assert str(info.value) == message, override
    # issue 37: a mixture is prefetched (one prefetcher over every source's reads), no longer refused
    mixed = data("data.prefetch=true", "data.mixture_sources=['a.txt', 'b.txt']", "data.mixture_weights=[1, 1]")
    assert mixed.prefetch == PrefetchConfig() and mixed.mixture_sources == ("a.txt", "b.txt")


def test_prefetch_over_a_local_index_reads_the_same_batches_and_fetches_nothing(small_index, small_tokenizer) -> None:
    from types import SimpleNamespace

    from detsampler.layout import LayoutConfig
    from train.data import DataPipeline, _packed_dataset, _plan

    layout = small_index.layout(LayoutConfig(kind="concat", seq_len=64))
    cfg = load_config(CONFIGS / "tiny.toml", ["data.prefetch=true", "data.seq_len=64"]).data
    plan = _plan(cfg, 1, num_samples=layout.num_samples)
    prepared = SimpleNamespace(index=small_index)
    on, off = (
        _packed_dataset(prepared, layout, "text", None, cfg.prefetch, plan),
        _packed_dataset(prepared, layout, "text"),
    )
    pipes = [
        DataPipeline(config=c, index=small_index, tokenizer=small_tokenizer, layout=layout, plan=plan, dataset=ds)
        for c, ds in ((cfg, on), (dataclasses.replace(cfg, prefetch=None), off))
    ]
    got, want = (list(p.loader(p.sampler(0, 0, 3), pin_memory=False, persistent_workers=False)) for p in pipes)
    assert len(got) == len(want) == 12 and all(torch.equal(a[k], b[k]) for a, b in zip(got, want) for k in b)
    assert on.prefetch == cfg.prefetch and on.prefetch_stats() is None  # a memory map: no prefetcher was made
    assert pipes[0].reads_line() == (
        "data: prefetch is on, but the index is local (memory-mapped): it is read as always, nothing fetched"
    )
    assert pipes[1].reads_line() is None and pipes[0].prefetch_summary() is None
    assert pipes[0].worker_start_method is None  # a local index: the platform's default start method
    spawned = dataclasses.replace(pipes[0], config=dataclasses.replace(cfg, worker_start_method="spawn"))
    assert spawned.worker_start_method == "spawn"


def test_a_masked_sample_leaves_the_per_token_mean_of_the_others() -> None:
    """The trainer's loss: sum over labels != -100 divided by their count (OLMo-core#452): a fully masked sample adds
    nothing to either, so the step's loss is the per-token mean over the samples kept."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    logits, labels = torch.randn(3, 5, 7), torch.randint(0, 7, (3, 5))
    masked = labels.clone()
    masked[1] = -100

    def step_loss(lab: torch.Tensor) -> torch.Tensor:
        total = F.cross_entropy(logits.flatten(0, 1), lab.flatten(), ignore_index=-100, reduction="sum")
        return total / (lab != -100).sum()

    kept = torch.tensor([0, 2])
    assert torch.allclose(step_loss(masked), F.cross_entropy(logits[kept].flatten(0, 1), labels[kept].flatten()))

"""Audit from a checkpoint (issue item 5): ``detsampler show|verify|stats --checkpoint PATH`` read the data record a
checkpoint saves (the trainer's, a Hugging Face-style record directory, a Lightning ``.ckpt``, a torchtitan DCP
directory), so nothing is re-typed; an option that contradicts the record is refused (even when its value is the
option's default); ``show`` prints the sample hash the trainer logs; ``stats`` splits trained from skipped tokens."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from detsampler.cli import main
from detsampler.cli.parser import explicit_options
from detsampler.hashing import sample_hash
from detsampler.layout import LayoutConfig
from detsampler.locate import locate
from detsampler.mixture import MixtureConfig
from detsampler.plan import Plan
from detsampler.record import RECORD_FILE, DataRecord, index_location, record_sha256
from detsampler.resume import DataFingerprint
from detsampler.verify import trained_and_skipped
from tests.test_train_mixture import setup  # noqa: F401  (the fixture: three corpora and their tokenizer)

CONFIG = str(Path(__file__).resolve().parent.parent / "train" / "configs" / "tiny.toml")
SEED, SEQ_LEN, GBS, MBS, STEPS, SKIP = 1234, 64, 8, 4, 6, (2, 3)


def _run(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _refused(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def _input_tokens(layout, ids) -> int:
    return int(np.minimum(layout.locate(np.asarray(ids, dtype=np.int64)).num_tokens, layout.config.seq_len).sum())


def _spans_in(out: str) -> list[tuple[int, int, int]]:
    return [(int(d), int(s), int(e)) for d, s, e in re.findall(r"doc (\d+)\b.*?tokens \[(\d+), (\d+)\)", out)]


def _expected_spans(plan, layout, step, lengths) -> list[tuple[int, int, int]]:
    spans = []
    for a in range(plan.num_micro_steps(step)):
        for r in range(plan.world_size):
            loc = locate(plan, layout, step, rank=r, micro_step=a)
            for i in range(len(loc.sample_ids)):
                spans += [(d, s, min(e, int(lengths[d]))) for d, s, e in loc.spans.sample(i)]
    return spans


# -- the trainer's checkpoints
# ---------------------------------------------------------------------------------------------


def _train_args(root: Path, run_dir: Path, resume: str) -> list[str]:
    """The trainer's arguments of the audited run (its tokenizer and cache under ``root``)."""
    settings = {
        "data.cache_dir": f'"{root / "cache"}"',
        "data.tokenizer": f'"{root / "tok.model"}"',
        "data.max_documents": 24,
        "data.vocab_size": 512,
        "data.layout": '"bestfit"',
        "data.window_docs": 16,
        "data.seq_len": SEQ_LEN,
        "data.seed": SEED,
        "data.global_batch_size": GBS,
        "data.micro_batch_size": MBS,
        "data.skip_steps": json.dumps([list(SKIP)]),
        "schedule.steps": STEPS,
        "schedule.warmup_steps": 1,
        "checkpoint.every": 3,
        "runtime.threads": 1,
    }
    args = ["--config", CONFIG, "--run-dir", str(run_dir), "--resume", resume]
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    return args


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real trainer run: 1 process, 6 steps (seed 1234 for layout and plan, skip range 2..3), a checkpoint every 3."""
    from detsampler.text.corpus import default_corpus
    from detsampler.text.tokenizer import train_tokenizer
    from train.launch import run_training, train_command

    root = tmp_path_factory.mktemp("audit")
    train_tokenizer(None, 512, root / "tok.model", texts=default_corpus(max_documents=24)["text"])
    args = _train_args(root, root / "run", "none")
    result = run_training(train_command(1, args, torchrun=False), timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    from train.metrics import read_metrics

    return root / "run", read_metrics(root / "run")


@pytest.fixture(scope="module")
def trained_plan(trained):
    """The trainer's layout and plan, built here from its settings (not from the record)."""
    from detsampler.index.sharded import open_index

    record = DataRecord.load(trained[0] / "checkpoints" / "step_00000006")
    index = open_index(record.indexes[0]["path"])
    layout = index.layout(LayoutConfig(kind="bestfit", seq_len=SEQ_LEN, seed=SEED, window_docs=16))
    plan = Plan(layout.num_samples, seed=SEED, global_batch_size=GBS, micro_batch_size=MBS, skip_steps=[SKIP])
    return index, layout, plan


@pytest.mark.slow
def test_the_trainer_saves_its_data_record_in_every_checkpoint(trained, trained_plan):
    run_dir, _ = trained
    index, layout, plan = trained_plan
    for step in (3, 6):
        ckpt = run_dir / "checkpoints" / f"step_{step:08d}"
        record = DataRecord.load(ckpt)
        assert record.step == step and record.framework == "train" and record.world_size == 1
        assert record.fingerprint == DataFingerprint.of(index, layout, plan)
        saved = json.loads((ckpt / "data_fingerprint.json").read_text())
        assert saved["data_fingerprint"]["hash"] == record.fingerprint.hash  # resume's file, unchanged beside it
        assert RECORD_FILE in (ckpt / "COMPLETE").read_text()  # covered by the integrity digests


@pytest.mark.slow
def test_show_from_a_trainer_checkpoint_prints_the_trained_documents_and_the_logged_hash(capsys, trained, trained_plan):
    run_dir, metrics = trained
    index, layout, plan = trained_plan
    # the run directory: its newest complete checkpoint (step 6), whose last trained step is 5
    code, out, _ = _run(capsys, ["show", "--checkpoint", str(run_dir)])
    assert code == 0
    assert "step_00000006" in out and "showing its last trained step 5" in out
    assert f"step 5 (data step 7): sample hash {metrics.steps[5]['sample_hash']}," in out
    assert _spans_in(out) == _expected_spans(plan, layout, 5, index.lengths)
    # a checkpoint directory, any trained step, another cut of the same plan: the trainer's hash of that step
    ckpt = run_dir / "checkpoints" / "step_00000003"
    for step in range(STEPS):
        code, out, _ = _run(capsys, ["show", "--checkpoint", str(ckpt), "--step", str(step), "--world-size", "2"])
        assert code == 0 and f"sample hash {metrics.steps[step]['sample_hash']}," in out
        assert "2 rank(s)" in out and _spans_in(out) == _expected_spans(plan, layout, step, index.lengths)
    # the documents' paths (the default corpus is found by its fingerprint) and their text
    code, out, _ = _run(capsys, ["show", "--checkpoint", str(ckpt), "--step", "1", "--decode", "--max-chars", "40"])
    assert code == 0 and re.search(r"doc \d+ \(\S+\.py\)", out) and "[...]" in out


@pytest.mark.slow
def test_a_flag_contradicting_the_checkpoint_is_refused_even_at_its_default(capsys, trained):
    """The issue's case: the layout seed of the run is 1234; `--layout-seed 0` (the option's default value, typed) is
    refused, naming the option, the checkpoint's value and the given one; the recorded value itself is accepted."""
    ckpt = str(trained[0] / "checkpoints" / "step_00000006")
    err = _refused(capsys, ["show", "--checkpoint", ckpt, "--step", "5", "--layout-seed", "0"])
    assert "--layout-seed 0 contradicts the checkpoint, which records 1234" in err
    for flag, value, shown, recorded in (
        ("--seed", "0", "0", "1234"),
        ("--kind", "concat", "concat", "bestfit"),
        ("--seq-len", "32", "32", "64"),
        ("--global-batch-size", "16", "16", "8"),
        ("--skip-steps", "2..4", "[[2,4]]", "[[2,3]]"),
        ("--mapping-version", "1", "1", "2"),
    ):
        err = _refused(capsys, ["verify", "--checkpoint", ckpt, flag, value])
        assert f"{flag} {shown} contradicts the checkpoint, which records {recorded}" in err
    code, out, _ = _run(capsys, ["show", "--checkpoint", ckpt, "--layout-seed", "1234", "--seed", "1234"])
    assert code == 0 and "step 5" in out
    # the corpus, given: checked against the index's (the trainer's first 24 standard library sources)
    code, out, _ = _run(capsys, ["show", "--checkpoint", ckpt, "--max-documents", "24", "--step", "0"])
    assert code == 0 and ".py)" in out
    err = _refused(capsys, ["show", "--checkpoint", ckpt, "--max-documents", "23"])
    assert "is not the corpus of the checkpoint's index" in err
    err = _refused(capsys, ["stats", "--checkpoint", ckpt, "--cache-dir", "elsewhere", "--kinds", "concat"])
    assert "--cache-dir has no effect with --checkpoint" in err


@pytest.mark.slow
def test_stats_and_verify_from_a_trainer_checkpoint(capsys, trained, trained_plan):
    run_dir, metrics = trained
    _, layout, plan = trained_plan
    ckpt = str(run_dir / "checkpoints" / "step_00000006")
    code, out, _ = _run(capsys, ["stats", "--checkpoint", ckpt, "--json"])
    split = json.loads(out)["layouts"]["bestfit"]["split"]
    trained_ids = np.concatenate([plan.global_batch(s) for s in range(STEPS)])
    skipped_ids = plan.stream.sample_ids(np.arange(plan.data_consumed(SKIP[0]), plan.data_consumed(SKIP[1] + 1)))
    assert split["trained"] == {"steps": STEPS, "samples": STEPS * GBS, "tokens": _input_tokens(layout, trained_ids)}
    assert split["skipped"] == {
        "data_steps": [list(SKIP)],
        "samples": 2 * GBS,
        "tokens": _input_tokens(layout, skipped_ids),
    }
    code, out, _ = _run(capsys, ["stats", "--checkpoint", ckpt])
    assert f"trained {split['trained']['tokens']:,} tokens (48 samples, 6 steps)" in out
    assert f"skipped {split['skipped']['tokens']:,} tokens (16 samples, data steps 2..3: never trained on)" in out
    code, out, _ = _run(capsys, ["verify", "--checkpoint", ckpt])
    assert code == 0 and "verify steps 0..5" in out and "16 skipped" in out and "OK: no duplicates, no gaps" in out


# -- integrations' records: a record directory, a Lightning .ckpt, a torchtitan DCP directory
# -------------------------------------------------------------------------------------------------


@pytest.fixture()
def small_record(small_index):
    layout = small_index.layout(LayoutConfig(kind="document", seq_len=64, seed=7))
    plan = Plan(layout.num_samples, seed=3, global_batch_size=8, micro_batch_size=2, world_size=2, skip_steps=[(1, 1)])
    return DataRecord.of(5, small_index, layout, plan, framework="hf"), layout, plan


def _lightning_ckpt(record: DataRecord, path: Path, global_step: int = 5, state: dict | None = None) -> Path:
    import torch

    torch.save(
        {
            "state_dict": {"w": torch.zeros(2)},
            "global_step": global_step,
            "DetsamplerDataModule": state or {"step": record.step, "data_record": record.to_dict()},
        },
        path,
    )
    return path


def _hf_checkpoint(record: DataRecord, path: Path, global_step: int | None = None) -> Path:
    """A Hugging Face ``checkpoint-N`` as a Trainer with the mixin saves it: the record, then ``trainer_state.json``
    written by transformers' own ``TrainerState`` at ``global_step`` (the record's step by default), its
    ``stateful_callbacks`` holding the mixin's callback state (the record's sha256)."""
    from transformers import TrainerState

    from detsampler.integrations.hf import DetsamplerDataRecord

    path.mkdir(parents=True)
    saved = record.save(path)
    named = DetsamplerDataRecord(record_sha256(saved.read_bytes()))
    state = TrainerState(global_step=record.step if global_step is None else global_step, stateful_callbacks=[named])
    state.save_to_json(str(path / "trainer_state.json"))
    return path


def _dcp_dir(record: DataRecord, path: Path, step: int = 5, train_step: int | None = None) -> Path:
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    state = {"dataloader": {"step": step, "samples_in_step": 0, "data_record": record.to_json()}, "w": torch.ones(3)}
    if train_step is not None:  # torchtitan's own TrainState: {"step", "ntokens_seen"}
        state["train_state"] = {"step": train_step, "ntokens_seen": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(path), no_dist=True)
    return path


def test_every_integration_checkpoint_form_gives_the_same_audit(capsys, small_record, small_index, tmp_path):
    record, layout, plan = small_record
    record_dir = _hf_checkpoint(record, tmp_path / "checkpoint-5")
    forms = [record_dir, _lightning_ckpt(record, tmp_path / "epoch=0-step=5.ckpt"), _dcp_dir(record, tmp_path / "dcp")]
    outs = []
    for path in forms:
        code, out, _ = _run(capsys, ["show", "--checkpoint", str(path), "--step", "3"])
        assert code == 0 and str(path) in out.splitlines()[0]
        outs.append(out.splitlines()[1:])
    assert outs[0] == outs[1] == outs[2]
    # a Hugging Face output_dir: its newest checkpoint-N holding a record
    _hf_checkpoint(dataclasses.replace(record, step=12), tmp_path / "checkpoint-12")
    code, out, _ = _run(capsys, ["show", "--checkpoint", str(tmp_path), "--step", "3"])
    assert code == 0 and "checkpoint-12 (the newest checkpoint of" in out and out.splitlines()[1:] == outs[0]
    assert f"sample hash {sample_hash(plan.global_batch(3))}," in outs[0][0]
    assert _spans_in("\n".join(outs[0])) == _expected_spans(plan, layout, 3, small_index.lengths)


def test_a_checkpoint_whose_index_changed_is_refused(capsys, small_record, small_index, tmp_path):
    record, layout, plan = small_record
    changed = DataRecord(
        step=5,
        fingerprint=DataFingerprint("0123456789abcdef", layout.describe(), plan.fingerprint()),
        indexes=(index_location(small_index),),
        world_size=2,
        micro_batch_size=2,
    )
    changed.save(tmp_path)
    err = _refused(capsys, ["show", "--checkpoint", str(tmp_path), "--step", "0"])
    assert "the data it names changed since it was saved" in err and "0123456789abcdef" in err
    gone = dataclasses.replace(record, indexes=({"kind": "index", "path": str(tmp_path / "gone")},))
    (tmp_path / "b").mkdir()
    gone.save(tmp_path / "b")
    err = _refused(capsys, ["stats", "--checkpoint", str(tmp_path / "b")])
    assert "does not open" in err and "moved or deleted" in err
    err = _refused(capsys, ["show", "--checkpoint", str(tmp_path / "nothing-here")])
    assert "no such file or directory" in err
    old = tmp_path / "step_00000004"  # a trainer checkpoint from before the record
    old.mkdir()
    (old / "data_fingerprint.json").write_text("{}")
    err = _refused(capsys, ["show", "--checkpoint", str(old)])
    assert "written before detsampler saved its data record" in err


def test_a_record_not_bound_to_its_checkpoint_is_refused_in_every_form(capsys, small_record, tmp_path):
    """Issue 31: a record is read only when it is the one its checkpoint saved: a Hugging Face checkpoint-N holding a
    re-sealed record of another step, or a truncated one; a Lightning .ckpt whose datamodule state is another
    checkpoint's (its step and record 3, Lightning's global_step 5) or whose record was edited (world_size 2 -> 4); a
    DCP checkpoint whose dataloader state names step 7 but its record step 5, or whose torchtitan train_state is at
    step 4. Each is refused naming the file (or entry), the record's step and the checkpoint's."""
    record, _, _ = small_record
    hf = _hf_checkpoint(dataclasses.replace(record, step=7), tmp_path / "checkpoint-5", global_step=5)
    err = _refused(capsys, ["show", "--checkpoint", str(hf)])
    step = "the record's step 7 is not this checkpoint's step 5 (its directory name checkpoint-5)"
    assert f"{hf / RECORD_FILE}: {step}" in err
    text = (hf / RECORD_FILE).read_text()
    (hf / RECORD_FILE).write_text(text[: len(text) // 2])
    err = _refused(capsys, ["stats", "--checkpoint", str(hf)])
    assert f"{hf / RECORD_FILE}: its sha256 is not the one trainer_state.json records" in err
    plain = tmp_path / "plain"  # a record directory of no framework: only its own JSON says it is damaged
    plain.mkdir()
    (plain / RECORD_FILE).write_text(text[: len(text) // 2])
    err = _refused(capsys, ["stats", "--checkpoint", str(plain)])
    assert f"{plain / RECORD_FILE}: not valid JSON (" in err and "the file is truncated or damaged" in err

    copied = {"step": 3, "data_record": dataclasses.replace(record, step=3).to_dict()}
    ckpt = _lightning_ckpt(record, tmp_path / "copied.ckpt", global_step=5, state=copied)
    err = _refused(capsys, ["where", "--checkpoint", str(ckpt), "--doc", "0"])
    assert f"{ckpt} (DetsamplerDataModule): the record's step 3 is not this checkpoint's step 5 (global_step)" in err
    edited = {"step": 5, "data_record": {**record.to_dict(), "world_size": 4}}
    ckpt = _lightning_ckpt(record, tmp_path / "edited.ckpt", state=edited)
    err = _refused(capsys, ["show", "--checkpoint", str(ckpt)])
    assert f"{ckpt} (DetsamplerDataModule): the data record fails its seal (record_sha256)" in err

    dcp_dir = _dcp_dir(record, tmp_path / "dcp-7", step=7)
    err = _refused(capsys, ["verify", "--checkpoint", str(dcp_dir)])
    assert "dataloader.data_record): the record's step 5 is not this checkpoint's step 7 (dataloader.step)" in err
    dcp_dir = _dcp_dir(record, tmp_path / "dcp-train-4", train_step=4)
    err = _refused(capsys, ["show", "--checkpoint", str(dcp_dir)])
    assert "the record's step 5 is not this checkpoint's step 4 (train_state.step)" in err
    code, _, _ = _run(capsys, ["show", "--checkpoint", str(_dcp_dir(record, tmp_path / "dcp-ok", train_step=5))])
    assert code == 0


def test_a_torch_checkpoint_must_state_its_step_and_a_tensor_step_is_read(capsys, small_record, tmp_path):
    """Issue 31 (re-review): a hand-made `.ckpt` whose DetsamplerDataModule entry holds a record and no `step`, with no
    `global_step`, was read bound to nothing; a `global_step` saved as `torch.tensor(7)` was ignored, so a record of
    step 5 passed. Lightning always writes `global_step` (an int) and the datamodule's `step` (checked on a real
    Lightning checkpoint in tests/integrations/test_lightning_labels.py): a state that states no step is refused, and a
    0-d integer tensor is read as its integer; any other value of a step is refused."""
    import torch

    record, _, _ = small_record
    entry = {"data_record": record.to_dict()}
    bare = tmp_path / "bare.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(2)}, "DetsamplerDataModule": entry}, bare)
    for command in (["show", "--checkpoint", str(bare)], ["verify", "--checkpoint", str(bare)]):
        err = _refused(capsys, command)
        assert err.count("\n") == 1 and f"{bare} (DetsamplerDataModule): the checkpoint states no step" in err
    for name, global_step, step, said in (
        ("tensor-7", torch.tensor(7), None, "the record's step 5 is not this checkpoint's step 7 (global_step)"),
        ("state-tensor-7", None, torch.tensor(7), "the record's step 5 is not this checkpoint's step 7 (step)"),
        ("float", torch.tensor(5.0), None, "global_step is tensor(5.), not a step (an integer"),
        ("vector", torch.tensor([5]), None, "global_step is tensor([5]), not a step (an integer"),
        ("bool", True, None, "global_step is True, not a step (an integer"),
        ("text", None, "5", "step is '5', not a step (an integer"),
    ):
        path = tmp_path / f"{name}.ckpt"
        state = {**entry, **({"step": step} if step is not None else {})}
        torch.save(
            {"DetsamplerDataModule": state, **({"global_step": global_step} if global_step is not None else {})}, path
        )
        err = _refused(capsys, ["show", "--checkpoint", str(path)])
        assert err.count("\n") == 1 and said in err, (name, err)
    good = tmp_path / "tensor-5.ckpt"
    torch.save({"global_step": torch.tensor(5), "DetsamplerDataModule": {**entry, "step": torch.tensor(5)}}, good)
    code, out, err = _run(capsys, ["show", "--checkpoint", str(good), "--step", "3"])
    assert code == 0 and err == "" and "saved at step 5" in out


def test_a_hugging_face_checkpoint_without_its_trainer_state_is_refused(capsys, small_record, small_index, tmp_path):
    """Issue 31 (re-review): a `checkpoint-N` with no `trainer_state.json` was checked against its directory name only,
    so another run's record of the same step copied in passed. A Hugging Face Trainer writes `trainer_state.json` in
    every checkpoint (and the mixin names the record's sha256 there): one without it is refused, naming the file."""
    record, layout, _ = small_record
    other_plan = Plan(layout.num_samples, seed=99, global_batch_size=8, micro_batch_size=2, world_size=2)
    other = DataRecord.of(5, small_index, layout, other_plan, framework="hf")
    checkpoint = _hf_checkpoint(record, tmp_path / "run" / "checkpoint-5")
    (checkpoint / "trainer_state.json").unlink()
    other.save(checkpoint)  # another run's record of the same step, copied in
    said = f"{checkpoint / RECORD_FILE}: its Hugging Face checkpoint has no trainer_state.json"
    for argv in (
        ["show", "--checkpoint", str(checkpoint)],
        ["stats", "--checkpoint", str(tmp_path / "run")],  # the output_dir's newest checkpoint-N
        ["where", "--checkpoint", str(checkpoint), "--doc", "0"],
    ):
        err = _refused(capsys, argv)
        assert err.startswith(f"detsampler: error: {said}") and err.count("\n") == 1, err
    with pytest.raises(ValueError, match=re.escape(said)):
        DataRecord.load(checkpoint)


def test_a_record_saved_before_seals_is_audited_with_one_warning_line(capsys, small_record, tmp_path):
    record, _, plan = small_record
    saved = {k: v for k, v in record.to_dict().items() if k != "record_sha256"}
    (tmp_path / RECORD_FILE).write_text(json.dumps(saved))
    code, out, err = _run(capsys, ["show", "--checkpoint", str(tmp_path), "--step", "3"])
    assert code == 0 and f"sample hash {sample_hash(plan.global_batch(3))}," in out
    assert err == (
        f"detsampler: warning: {tmp_path / RECORD_FILE}: the data record carries no seal (record_sha256; saved by a"
        " detsampler before records were sealed): read as written, its content unchecked\n"
    )


@pytest.mark.slow
def test_a_trainer_checkpoints_record_edited_replaced_or_uncovered_is_refused(capsys, trained, tmp_path):
    """Issue 31, the trainer's checkpoints: COMPLETE holds the sha256 of every file, the record among them, and its
    step; each audit command reads the record only when it is the one COMPLETE names and its step is the checkpoint's:
    a hand edit (step 6 -> 7), another checkpoint's record copied in, a re-sealed record of step 9 with COMPLETE
    rewritten to cover it, a record COMPLETE does not list, and another run's record of the same step copied in with
    its COMPLETE are each refused naming the file."""
    run_dir, _ = trained
    source = run_dir / "checkpoints"
    ckpt = tmp_path / "checkpoints" / "step_00000006"
    shutil.copytree(source / "step_00000006", ckpt)
    path, complete = ckpt / RECORD_FILE, json.loads((ckpt / "COMPLETE").read_text())
    original = path.read_text()

    def cover(text: str | None) -> None:
        files = dict(complete["files"])
        if text is None:
            files.pop(RECORD_FILE)
        else:
            files[RECORD_FILE] = {"size": len(text.encode()), "sha256": record_sha256(text)}
        (ckpt / "COMPLETE").write_text(json.dumps({**complete, "files": files}))

    from train.launch import run_training, train_command

    other = tmp_path / "other"  # another run (plan and layout seed 99), its checkpoint of the same step 6
    args = [*_train_args(run_dir.parent, other, "none"), "--set", "data.seed=99"]
    assert run_training(train_command(1, args, torchrun=False), timeout=300).returncode == 0
    copied_run = other / "checkpoints" / "step_00000006"
    theirs = DataRecord.load(copied_run)
    assert (
        theirs.step == 6
        and theirs.fingerprint.plan["seed"] == 99 != DataRecord.from_json(original).fingerprint.plan["seed"]
    )
    faults = {
        "edited": (original.replace('"step": 6', '"step": 7'), False, "its sha256 is not the one COMPLETE records"),
        "copied": ((source / "step_00000003" / RECORD_FILE).read_text(), False, "its sha256 is not the one COMPLETE"),
        "re-sealed": (
            dataclasses.replace(DataRecord.from_json(original), step=9).to_json(),
            True,
            "the record's step 9 is not this checkpoint's step 6 (its directory name step_00000006)",
        ),
        "uncovered": (original, None, "the checkpoint's COMPLETE does not cover it"),
        "another run": (
            (copied_run / RECORD_FILE).read_text(),
            "COMPLETE",
            "the checkpoint's .metadata is not the one its COMPLETE records (sha256 differs)",
        ),
    }
    for name, (text, covered, message) in faults.items():
        path.write_text(text)
        if covered == "COMPLETE":  # the other run's record with its COMPLETE
            shutil.copy(copied_run / "COMPLETE", ckpt / "COMPLETE")
        else:
            cover(text if covered else (None if covered is None else original))
        for command in (["show"], ["stats"], ["verify"], ["where", "--doc", "0"]):
            err = _refused(capsys, [command[0], "--checkpoint", str(ckpt), *command[1:]])
            assert f"{path}: {message}" in err, (name, command, err)
        err = _refused(capsys, ["show", "--checkpoint", str(tmp_path)])  # the run directory: its newest checkpoint
        assert f"{path}: {message}" in err, name
    # the trainer's resume reads the record the same way: the re-sealed, covered record is refused before training
    text, _, message = faults["re-sealed"]
    path.write_text(text)
    cover(text)
    result = run_training(train_command(1, _train_args(run_dir.parent, tmp_path, "auto"), torchrun=False), timeout=300)
    assert result.returncode == 2 and f"error: {path}: {message}" in result.output, result.output[-2000:]
    path.write_text(original)
    cover(original)
    assert _run(capsys, ["stats", "--checkpoint", str(ckpt)])[0] == 0


def test_explicit_options_are_told_from_defaults():
    argv = ["show", "--checkpoint", "x", "--layout-seed", "0", "--world-size", "1", "--decode"]
    assert explicit_options(argv) == {"checkpoint", "layout_seed", "world_size", "decode"}


# -- the trained/skipped split
# ---------------------------------------------------------------------------------------------


def test_trained_and_skipped_counts_exactly_for_an_index_and_a_mixture(small_index):
    layout = small_index.layout(LayoutConfig(kind="bestfit", seq_len=32, window_docs=4))
    n = layout.num_samples
    plan = Plan(n, seed=1, global_batch_size=12, micro_batch_size=3, world_size=2, skip_steps=[(3, 5), (5000, 5001)])
    step = n // 12 + 7  # past a whole epoch: the epoch shortcut and the located rest
    got = trained_and_skipped(plan, [layout], step)
    positions = np.arange(plan.consumed(step))
    skipped = np.concatenate([np.arange(plan.data_consumed(3), plan.data_consumed(6))])
    trained = np.setdiff1d(positions, skipped)
    ids = lambda p: plan.stream.sample_ids(p)
    assert got["trained"] == {"steps": step, "samples": len(trained), "tokens": _input_tokens(layout, ids(trained))}
    assert got["skipped"] == {"data_steps": [[3, 5]], "samples": 36, "tokens": _input_tokens(layout, ids(skipped))}

    layouts = [small_index.layout(LayoutConfig(kind=k, seq_len=16)) for k in ("concat", "document")]
    mixture = MixtureConfig(weights=(1, 3), schedule=((5, (1, 1)),), seed=2).build(layouts)
    mplan = Plan(source=mixture, seed=0, global_batch_size=4, micro_batch_size=2, skip_steps=[(2, 4)])
    got = trained_and_skipped(mplan, layouts, 9)
    found = mplan.stream.lookup(np.arange(mplan.consumed(9)))
    is_skipped = (np.arange(mplan.consumed(9)) >= mplan.data_consumed(2)) & (
        np.arange(mplan.consumed(9)) < mplan.data_consumed(5)
    )
    for k, row in enumerate(got["sources"]):
        for name, mask in (("trained", ~is_skipped), ("skipped", is_skipped)):
            ids_k = found.source_sample[mask & (found.source == k)]
            assert row[f"{name}_samples"] == len(ids_k)
            assert row[f"{name}_tokens"] == _input_tokens(layouts[k], ids_k)
    assert got["skipped"]["samples"] == 12 and got["trained"]["samples"] == 9 * 4


# -- a mixture trained by the trainer
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_audit_of_a_trainer_mixture_checkpoint(capsys, tmp_path, setup):
    """The trainer on the 3-source mixture of tests/test_train_mixture.py, 4 steps with data steps 1..1 skipped: show
    prints the logged hash, stats from the checkpoint equals stats from the 20 options it replaces (and splits each
    source's tokens), a contradicting weight is refused."""
    from tests.test_train_mixture import GBS as M_GBS
    from tests.test_train_mixture import MBS as M_MBS
    from tests.test_train_mixture import NAMES, WEIGHTS, _train
    from tests.test_train_mixture import SEED as M_SEED
    from tests.test_train_mixture import SEQ_LEN as M_SEQ_LEN
    from train.metrics import read_metrics

    root, paths = setup
    run = tmp_path / "run"
    result = _train(run, root, paths, stop_at=4, skip=[(1, 1)])
    assert result.returncode == 0, result.output[-4000:]
    metrics = read_metrics(run)
    code, out, _ = _run(capsys, ["show", "--checkpoint", str(run), "--rank", "0", "--micro-step", "0"])
    assert code == 0 and f"step 3 (data step 4): sample hash {metrics.steps[3]['sample_hash']}, mixture of 3" in out
    assert "source code" in out or "source docs" in out or "source text" in out

    flags = [
        *("--tokenizer", str(root / "tok.model"), "--cache-dir", str(root / "cache")),
        *("--mixture-data", ",".join(paths), "--mixture-weights", ",".join(map(str, WEIGHTS))),
        *("--mixture-names", ",".join(NAMES), "--mixture-seed", str(M_SEED), "--seed", str(M_SEED)),
        *("--layout-seed", str(M_SEED), "--kind", "concat", "--seq-len", str(M_SEQ_LEN)),
        *("--global-batch-size", str(M_GBS), "--micro-batch-size", str(M_MBS), "--skip-steps", "1..1"),
    ]
    code, out, _ = _run(capsys, ["stats", *flags, "--step", "4", "--json"])
    by_flags = json.loads(out)
    code, out, _ = _run(capsys, ["stats", "--checkpoint", str(run), "--json"])
    by_checkpoint = json.loads(out)
    assert by_checkpoint["checkpoint"]["step"] == 4
    for a, b in zip(by_flags["sources"], by_checkpoint["sources"]):
        assert {k: a[k] for k in a} == {k: b[k] for k in a}
        assert b["trained_tokens"] + b["skipped_tokens"] == b["tokens"]
    assert by_checkpoint["split"]["skipped"]["samples"] == M_GBS and by_checkpoint["split"]["trained"]["samples"] == 64
    err = _refused(capsys, ["show", "--checkpoint", str(run), "--mixture-weights", "0.3,0.3,0.4"])
    assert "--mixture-weights" in err and "records" in err and "1/2" in err
    code, _, _ = _run(capsys, ["show", "--checkpoint", str(run), "--mixture-weights", "0.5,0.3,0.2", "--step", "0"])
    assert code == 0
    # the corpora, given: each checked against its source's index; decoded with the tokenizer the indexes record
    code, out, _ = _run(capsys, ["show", "--checkpoint", str(run), "--mixture-data", ",".join(paths), "--decode"])
    assert code == 0 and any(line.startswith(("      '", '      "')) for line in out.splitlines())  # the text
    err = _refused(capsys, ["show", "--checkpoint", str(run), "--mixture-data", ",".join(paths[::-1])])
    assert "--mixture-data" in err and "is not the corpus of the checkpoint's index" in err


def test_stats_by_options_splits_trained_from_skipped_tokens(capsys, cache_root, small_tokenizer, small_index):
    base = ["--max-documents", "16", "--tokenizer", small_tokenizer.path, "--cache-dir", str(cache_root)]
    opts = ["--seq-len", "64", "--kinds", "bestfit", "--global-batch-size", "8", "--skip-steps", "1..2", "--step", "5"]
    code, out, _ = _run(capsys, ["stats", *base, *opts, "--json"])
    layout = small_index.layout(LayoutConfig(kind="bestfit", seq_len=64))
    plan = Plan(layout.num_samples, seed=0, global_batch_size=8, micro_batch_size=2, skip_steps=[(1, 2)])
    split = json.loads(out)["layouts"]["bestfit"]["split"]
    assert split == trained_and_skipped(plan, [layout], 5) and split["skipped"]["samples"] == 16
    code, out, _ = _run(capsys, ["stats", *base, *opts])
    assert "trained tokens  skipped tokens" in out and f"skipped {split['skipped']['tokens']:,} tokens" in out


def test_a_real_torchtitan_loader_checkpoint_is_audited(capsys, small_index, tmp_path):
    """The torchtitan integration's own state, saved with DCP as torchtitan saves it (under "dataloader") after 3
    steps at dp 2: show reads its record and prints the plan's step 2 with that step's hash."""
    titan = pytest.importorskip("tests.integrations.test_torchtitan")
    import warnings

    import torch.distributed.checkpoint as dcp

    loaders = [titan.build([small_index.path], 2, r, layout="bestfit", seed=5, skip_steps=[[1, 1]]) for r in (0, 1)]
    titan.draw(loaders, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"dataloader": loaders[0]}, checkpoint_id=str(tmp_path / "step-3"), no_dist=True)
    code, out, _ = _run(capsys, ["show", "--checkpoint", str(tmp_path / "step-3")])
    plan = loaders[0].plan
    assert code == 0 and "saved at step 3 by torchtitan" in out and "showing its last trained step 2" in out
    assert f"step 2 (data step 3): sample hash {sample_hash(plan.global_batch(2))}," in out
    err = _refused(capsys, ["show", "--checkpoint", str(tmp_path / "step-3"), "--seed", "0"])
    assert "--seed 0 contradicts the checkpoint, which records 5" in err


def test_where_from_a_checkpoint_reads_every_step_it_trained(capsys, small_record, tmp_path):
    from detsampler.where import where

    record, layout, plan = small_record
    record_dir = _hf_checkpoint(record, tmp_path / "checkpoint-5")
    doc = int(layout.locate(plan.global_batch(2)).doc_ids[0])  # read at step 2 (data step 3: step 1 is skipped)
    code, out, _ = _run(capsys, ["where", "--checkpoint", str(record_dir), "--doc", str(doc), "--json"])
    got = json.loads(out)
    assert code == 0 and got["steps"] == [0, 5] and got["skip_steps"] == [[1, 1]]
    assert got["reads"] == [r._asdict() for r in where(plan, layout, doc, range(5))]
    assert any(r["step"] == 2 for r in got["reads"])


def test_where_from_a_checkpoint_tells_the_reads_it_trained_from_those_after_it(
    capsys, small_record, small_index, tmp_path
):
    """Issue 31 (re-run): `where --checkpoint checkpoint-5 --doc D --steps 0:40` printed `read N time(s) by steps 0..39`
    and every read alike, those of steps 5..39 (which the checkpoint never trained) included: a contamination audit read
    the plan's future as the run's past. The reads at or after its step are now counted apart and marked."""
    from detsampler.where import where

    record, layout, plan = small_record
    record_dir = _hf_checkpoint(record, tmp_path / "checkpoint-5")
    reads = {d: where(plan, layout, d, range(40)) for d in range(small_index.num_documents)}
    doc = next(d for d, r in reads.items() if {x.step < 5 for x in r} == {True, False})
    after = [r for r in reads[doc] if r.step >= 5]
    argv = ["where", "--checkpoint", str(record_dir), "--doc", str(doc), "--steps", "0:40"]
    code, out, _ = _run(capsys, argv)
    lines = out.splitlines()
    assert code == 0 and lines[1] == (
        f"read {len(reads[doc])} time(s) by steps 0..39 (reads by data steps in skip ranges left out); {len(after)} of"
        " them at steps 5..39, after the checkpoint's step 5: planned, not trained by it:"
    )
    marked = [line for line in lines[2:] if line.endswith("  after the checkpoint: not trained by it")]
    assert [int(line.split()[1]) for line in marked] == [r.step for r in after]
    assert len(lines) == 2 + len(reads[doc])
    code, out, _ = _run(capsys, [*argv, "--json"])
    got = json.loads(out)
    assert got["checkpoint"] == {"step": 5} and got["reads"] == [r._asdict() for r in reads[doc]]
    code, out, _ = _run(capsys, argv[:-2])  # by default every step it trained: nothing after it
    assert "after the checkpoint" not in out
    assert out.splitlines()[1].endswith(" by steps 0..4 (reads by data steps in skip ranges left out):")


def test_a_torch_checkpoint_holding_two_different_data_records_is_refused(capsys, small_record, small_index, tmp_path):
    """Issue 31 (re-run): a `.ckpt` whose callback state holds another run's record before its DetsamplerDataModule
    entry was audited as that other run (`show` printed its fingerprint and samples): the first dict holding
    "data_record" was taken. Two different records are refused, naming where each is; equal ones are one record."""
    import torch

    record, layout, plan = small_record
    other_plan = Plan(layout.num_samples, seed=99, global_batch_size=8, micro_batch_size=2, world_size=2)
    other = DataRecord.of(5, small_index, layout, other_plan, framework="lightning")
    state = {"step": 5, "data_record": record.to_dict()}
    path = tmp_path / "two.ckpt"
    torch.save(
        {
            "global_step": 5,
            "callbacks": {"Recorder": {"step": 5, "data_record": other.to_dict()}},
            "DetsamplerDataModule": state,
        },
        path,
    )
    err = _refused(capsys, ["show", "--checkpoint", str(path)])
    assert err == (
        f"detsampler: error: --checkpoint {str(path)!r} holds 2 different data records (at callbacks.Recorder,"
        " DetsamplerDataModule): which one is the run's is not known; keep the DetsamplerDataModule entry's\n"
    )
    same = tmp_path / "same.ckpt"
    torch.save({"global_step": 5, "callbacks": {"Recorder": dict(state)}, "DetsamplerDataModule": state}, same)
    code, out, _ = _run(capsys, ["show", "--checkpoint", str(same), "--step", "3"])
    assert code == 0 and f"data fingerprint {record.fingerprint.hash} " in out


def test_a_bad_against_is_refused_naming_against(capsys, small_record, tmp_path):
    """Issue 31 (re-run): `verify --checkpoint C --against X` refused a missing X, or a file torch cannot read, as
    `--checkpoint ...` (the other option), the latter with torch's advice to load it with weights_only=False."""
    record, _, _ = small_record
    checkpoint = _hf_checkpoint(record, tmp_path / "checkpoint-5")
    (tmp_path / "COMPLETE").write_text("not a checkpoint")
    for against, said in (
        (tmp_path / "nothing", f"--against: no such file or directory: {str(tmp_path / 'nothing')!r}"),
        (tmp_path / "COMPLETE", f"--against {str(tmp_path / 'COMPLETE')!r} is not a checkpoint torch.load reads: "),
    ):
        err = _refused(capsys, ["verify", "--checkpoint", str(checkpoint), "--against", str(against)])
        assert err.startswith(f"detsampler: error: {said}") and err.count("\n") == 1, err
        assert "weights_only" not in err
    err = _refused(capsys, ["show", "--checkpoint", str(tmp_path / "COMPLETE")])
    assert err.startswith(f"detsampler: error: --checkpoint {str(tmp_path / 'COMPLETE')!r} is not a checkpoint")


def test_stats_and_verify_past_a_checkpoints_step_say_those_steps_are_planned(capsys, small_record, tmp_path):
    """Issue 31 (re-run): `stats --checkpoint C --step 9` of a checkpoint saved at step 5 printed `before step 9:
    trained N tokens (72 samples, 9 steps)`, and `verify --checkpoint C --steps 0:9` checked steps 5..8 alike: steps
    the checkpoint never trained were counted as trained. A line under the checkpoint's says which steps are the
    plan's."""
    record, _, _ = small_record
    checkpoint = _hf_checkpoint(record, tmp_path / "checkpoint-5")
    said = "  steps 5..8 are after the checkpoint's step 5: counted as the plan reads them, not trained by it"
    for argv in (
        ["stats", "--checkpoint", str(checkpoint), "--step", "9"],
        ["verify", "--checkpoint", str(checkpoint), "--steps", "0:9"],
    ):
        code, out, _ = _run(capsys, argv)
        lines = out.splitlines()
        assert code == 0 and lines[0].startswith(f"checkpoint {checkpoint}: saved at step 5") and lines[1] == said
        assert out.count("after the checkpoint") == 1
    code, out, _ = _run(capsys, ["stats", "--checkpoint", str(checkpoint), "--step", "9", "--json"])
    assert json.loads(out)["checkpoint"]["after"] == [5, 9]
    for argv in (
        ["stats", "--checkpoint", str(checkpoint)],
        ["verify", "--checkpoint", str(checkpoint)],
        ["stats", "--checkpoint", str(checkpoint), "--step", "5"],
    ):
        code, out, _ = _run(capsys, argv)
        assert code == 0 and "after the checkpoint" not in out
    code, out, _ = _run(capsys, ["stats", "--checkpoint", str(checkpoint), "--json"])
    assert "after" not in json.loads(out)["checkpoint"]

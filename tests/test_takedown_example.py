"""A takedown end to end (issue 32), as docs/examples/trl_takedown.py runs it and docs/usage.md shows it: TRL's
``SFTTrainer`` trains from moto's S3, is killed and resumed; the conversation a takedown request names by its id is
found in the checkpoint; the run resumes with it redacted from step 4, its stored bytes are erased in the bucket, the
run resumes again. Checked here by value against the plan over a local, unerased copy of the index:

- every step trains exactly the plan's batches: steps 0-3 as they were; steps 4-5 the same inputs with the
  conversation's labels masked; steps 6-7 its inputs the pad id and its labels masked, every other byte and label as
  they were;
- the audit of the last checkpoint names exactly the steps that trained on it (and the labels they trained, counted
  from the batches the model was given), and proves its bytes gone; the bucket's token object differs from the
  original in its bytes only."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("obstore")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "examples"))

import trl_takedown as example  # noqa: E402

from detsampler import LayoutConfig, PackedDataset, Plan  # noqa: E402
from detsampler.index import TokenIndex  # noqa: E402
from detsampler.loader.dataset import MicroBatch  # noqa: E402
from detsampler.where import where  # noqa: E402

CONVERSATION, DOC = "conv-4136", 36  # the takedown request: read at step 3 (before it) and at step 6 (after)


class Recording(example.DetsamplerSFTTrainer):
    seen: ClassVar[list] = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        batch = {k: v.clone() for k, v in inputs.items() if torch.is_tensor(v)}
        Recording.seen.append((self.state.global_step, batch, int(num_items_in_batch)))
        return super().training_step(model, inputs, num_items_in_batch)


def test_the_documented_takedown_is_the_one_run():
    import inspect

    assert inspect.getsource(example.takedown) in (ROOT / "docs" / "usage.md").read_text()


def test_a_takedown_from_a_bucket_end_to_end(s3_bucket, tmp_path, capsys):
    bucket = f"{s3_bucket}/takedown-{tmp_path.name}"
    Recording.seen = []
    assert example.takedown(tmp_path, bucket, CONVERSATION, trainer=Recording) == 0
    out = capsys.readouterr().out

    # the plan over the local, unerased index the bucket's was pushed from
    local = next((tmp_path / "cache").glob("index-*"))
    original = TokenIndex.open(local)
    packed = PackedDataset(original, original.layout(LayoutConfig(kind="bestfit", seq_len=example.SEQ_LEN)))
    plan = Plan(len(packed), seed=0, global_batch_size=4, micro_batch_size=2)
    reads = where(plan, packed.layout, DOC, (0, example.STEPS))
    assert sorted({r.step for r in reads}) == [3, 6]

    # every step the model was given: the killed run's steps 0-2, then 2-7 once each (step 2 trained again)
    steps = [s for s, _, _ in Recording.seen]
    assert steps == [0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]
    trained_before = 0
    collate = example.causal_lm_collator(packed)
    for (step, got, count), a in zip(Recording.seen, [0, 1] * 9):
        batch = packed.get_batch(plan.micro_batch(step, a, 0))
        mine = batch["document_ids"] == DOC
        if step < 4:
            trained_before += int((mine & (batch["labels"] != -100)).sum())
        if step >= 4:  # redacted: its labels leave the loss
            batch["labels"] = batch["labels"].masked_fill(mine, -100)
            batch["loss_mask"] = batch["loss_mask"] & ~mine
        for r in reads if step >= 6 else ():  # erased: its stored tokens are the pad id (its virtual EOS is kept)
            if (r.step, r.micro_step) == (step, a):
                stored = min(r.stop, int(original.lengths[DOC])) - r.start
                batch["input_ids"][r.row, r.offset : r.offset + stored] = original.pad_id
        want = collate(MicroBatch(batch))
        assert all(torch.equal(got[k], want[k]) for k in got), (step, a)
    assert any(int((b["input_ids"] == original.pad_id).sum()) for s, b, _ in Recording.seen if s == 6)

    # the steps that trained on it, from the takedown's `where` at checkpoint-4
    after = f"1 of them at steps 4..{example.STEPS - 1}, after the checkpoint's step 4: planned, not trained by it:"
    assert f"read 2 time(s) by steps 0..{example.STEPS - 1}; {after}" in out
    # the audit of the last checkpoint: exactly the steps before the redaction that trained it, and its bytes gone
    line = next(x for x in out.splitlines() if x.startswith(f"redacted doc {DOC}: "))
    assert line.startswith(f"redacted doc {DOC}: trained at steps [3] before step 4 (")
    assert f", {trained_before:,} trained, 1 read)" in line and trained_before > 0
    proof = next(x for x in out.splitlines() if x.startswith(f"erased doc {DOC} "))
    assert proof.endswith("its bytes are gone") and out.rstrip().endswith("OK: no duplicates, no gaps")

    # the bucket's tokens: every byte the original's but the conversation's own
    remote = TokenIndex.open(bucket + "/" + local.name, verify_tokens=True)
    start, stop = int(original.offsets[DOC]), int(original.offsets[DOC] + original.lengths[DOC])
    want = np.asarray(original.tokens[:]).copy()
    want[start:stop] = original.pad_id
    assert np.array_equal(np.asarray(remote.tokens[:]), want) and remote.erased_documents.tolist() == [DOC]
    mask = np.asarray(original.loss_mask[:]).copy()
    mask[start:stop] = 0
    assert np.array_equal(np.asarray(remote.loss_mask[:]), mask)
    record = json.loads((tmp_path / "run" / f"checkpoint-{example.STEPS}" / "detsampler_data.json").read_text())
    assert record["data_fingerprint"]["plan"]["redactions"] == [[4, [DOC]]]
    assert re.fullmatch(rf"{original.fingerprint}\+erasure:[0-9a-f]{{16}}", record["data_fingerprint"]["index"])
    shutil.rmtree(tmp_path / "run")


def test_the_remote_batches_example_reads_the_local_batches_from_a_bucket(small_index, s3_bucket, tmp_path, capsys):
    """docs/usage.md's ``remote_batches.py`` was referenced and not given: docs/examples/remote_batches.py, run here."""
    import remote_batches

    from detsampler.index.push import push_index
    from tests.index_copies import copy_with_layouts

    local = copy_with_layouts(small_index, tmp_path, [LayoutConfig(kind="concat", seq_len=512)])
    url = f"{s3_bucket}/remote-batches-{tmp_path.name}/{local.path.name}"
    push_index(local.path, url)
    assert remote_batches.main(url, str(local.path)) == 0
    first, second = capsys.readouterr().out.splitlines()
    n = len(PackedDataset(local, local.layout(LayoutConfig(kind="concat", seq_len=512)))) // 8 * 8
    want = rf"TokenIndex\('{re.escape(url)}', .*\): {n} samples equal to the local ones in [0-9.]+ s"
    assert re.fullmatch(want, first)
    size = (local.path / "tokens.npy").stat().st_size
    assert re.fullmatch(rf"tokens.npy: [0-9,]+ bytes fetched of {size:,} in \d+ ranged reads", second)

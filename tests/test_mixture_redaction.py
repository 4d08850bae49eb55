"""Redaction through a mixture: entries name the source whose document ids they hold (``Redaction(documents, from_step,
source=k)``). Validation and the fingerprint (single-index fingerprints unchanged), the resume rule per source, the
invariant "every step reads what it read; only the labels of the redacted (source, document) pairs change, from their
step on" on a mixture with a schedule and skip ranges across a resume, the per-row mask against ``np.isin`` per source,
and the audit trail against an exhaustive scan."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsampler.layout import LAYOUT_KINDS, LayoutConfig, make_layout
from detsampler.loader.dataset import PackedDataset, collate_micro_batch
from detsampler.loader.mixture_dataset import MixtureDataset
from detsampler.loader.redact import device_mask, redact_labels, redact_step, step_sources
from detsampler.loader.sampler import DeterministicBatchSampler
from detsampler.mixture import Mixture
from detsampler.plan import Plan
from detsampler.record import DataRecord
from detsampler.redaction import Blocklist, Redaction, normalize_redactions, redaction_mask
from detsampler.resume import DataFingerprint, check_resume
from detsampler.where import redaction_audit, where
from tests.strategies import doc_lengths, seeds, skip_ranges, weight_schedules
from tests.test_where import scan

# -- validation and the fingerprint


def test_a_redaction_names_its_source_and_the_rules_hold_per_source():
    assert Redaction([4, 1], 3, source=2).to_list() == [3, [1, 4], 2]
    assert Redaction([4, 1], 3).to_list() == [3, [1, 4]]  # no source: the form of every earlier run
    assert Redaction.from_any([3, [4], 1]) == Redaction([4], 3, 1)
    assert Redaction.from_any({"documents": [4], "from_step": 3, "source": 1}) == Redaction([4], 3, 1)
    with pytest.raises(ValueError, match=r"Redaction.source \(a mixture source\) must be an integer >= 0"):
        Redaction([1], 0, source=-1)
    # one entry per (step, source), each (source, document) once: document 4 of two sources is two documents
    out = normalize_redactions([Redaction([4], 3, 1), Redaction([4], 3, 0), Redaction([5], 1, 1)])
    assert [r.to_list() for r in out] == [[1, [5], 1], [3, [4], 0], [3, [4], 1]]
    with pytest.raises(ValueError, match="two redactions of source 1 from step 3"):
        normalize_redactions([Redaction([4], 3, 1), Redaction([5], 3, 1)])
    with pytest.raises(ValueError, match="document 4 of source 1 is redacted from step 3 and again from step 6"):
        normalize_redactions([Redaction([4], 3, 1), Redaction([4], 6, 1)])
    with pytest.raises(ValueError, match="some redactions name a source and others none"):
        normalize_redactions([Redaction([4], 3, 1), Redaction([5], 6)])


def test_a_plan_over_a_mixture_takes_redactions_of_its_sources_only():
    mixture = Mixture([50, 50], [0.5, 0.5], seed=1)
    cut = dict(global_batch_size=4, micro_batch_size=2)
    plan = Plan(source=mixture, **cut, redactions=[Redaction([1], 0, source=1)])
    assert plan.fingerprint()["redactions"] == [[0, [1], 1]]
    with pytest.raises(ValueError, match=r"a plan over a mixture of 2 sources .* source=k\), k in \[0, 2\)"):
        Plan(source=mixture, **cut, redactions=[Redaction([1], 0)])
    with pytest.raises(ValueError, match="a plan over a mixture of 2 sources"):
        Plan(source=mixture, **cut, redactions=[Redaction([1], 0, source=2)])
    with pytest.raises(ValueError, match="names a mixture source, but the plan reads one index"):
        Plan(100, **cut, redactions=[Redaction([1], 0, source=0)])
    # a single-index plan's fingerprint and hash are those of the plan before sources existed
    single = Plan(100, seed=3, **cut, redactions=[Redaction([4], 3)])
    body = json.dumps(single.fingerprint(), sort_keys=True)
    assert body.endswith(
        '"redactions": [[3, [4]]], "seed": 3, "stream": {"kind": "epochs", "num_samples": 100, "seed": 3}}'
    )
    assert (
        DataFingerprint("idx", {"kind": "concat"}, single.fingerprint()).hash == "0c65e0c4607e4f4f"
    )  # computed by the code before sources


def _fp(redactions, mixture=Mixture([50, 50, 20], [1, 1, 1], seed=1)):
    plan = Plan(source=mixture, global_batch_size=4, micro_batch_size=2, redactions=redactions)
    return DataFingerprint("a,b,c", {"mixture": [{}, {}, {}]}, plan.fingerprint())


def test_check_resume_allows_redactions_from_the_resume_step_on_per_source():
    past = Redaction([4], 3, 0)
    check_resume(_fp([past]), _fp([past, Redaction([4], 10, 1)]), 10)  # document 4 of another source, at the resume
    check_resume(_fp([past, Redaction([9], 12, 2)]).to_dict(), _fp([past, Redaction([9], 10, 2)]).to_dict(), 10)
    with pytest.raises(ValueError, match=r"drops the redaction of document 9 of source 2 from step 12"):
        check_resume(_fp([past, Redaction([9], 12, 2)]), _fp([past, Redaction([9], 12, 1)]), 10)  # another source's 9
    with pytest.raises(
        ValueError, match=r"redactions adds \[\[3, \[4\], 1\]\] \(as \[from_step, \[documents\], source\]"
    ):
        check_resume(_fp([past]), _fp([past, Redaction([4], 3, 1)]), 10)  # the same ids, another source, in the past
    with pytest.raises(
        ValueError, match=r"adds \[\[3, \[4\], 2\]\] and removes \[\[3, \[4\], 0\]\].*redact from step >= 10"
    ):
        check_resume(_fp([past]), _fp([Redaction([4], 3, 2)]), 10)


# -- the mask per row


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40)), min_size=1, max_size=30, unique=True),
    st.lists(st.integers(-1, 45), min_size=12, max_size=12),
    st.lists(st.integers(0, 2), min_size=3, max_size=3),
    st.integers(0, 3),
)
def test_the_mask_of_a_row_is_isin_with_its_sources_ids(pairs, doc_ids, sources, from_step):
    """``Blocklist.mask``, ``redact_labels`` (numpy views) and :func:`device_mask` (``torch.isin``) mark exactly the
    positions whose (row's source, document id) pair is redacted at the step."""
    by_source = {}
    for k, d in pairs:
        by_source.setdefault(k, []).append(d)
    redactions = [Redaction(docs, from_step + k, source=k) for k, docs in by_source.items()]
    blocklist = Blocklist(redactions)
    ids = np.array(doc_ids, dtype=np.int64).reshape(3, 4)
    rows = np.array(sources, dtype=np.int64)
    for step in range(6):
        want = np.zeros(ids.shape, dtype=bool)
        for row in range(3):
            k = int(rows[row])
            on = [d for r in redactions if r.source == k and r.from_step <= step for d in r.documents]
            want[row] = np.isin(ids[row], on)
        assert np.array_equal(blocklist.mask(ids, step, rows), want)
        assert np.array_equal(redaction_mask(ids, step, redactions, rows), want)
        assert torch.equal(device_mask(blocklist, torch.from_numpy(ids), step, rows), torch.from_numpy(want))
        labels = torch.arange(12).reshape(3, 4)
        batch = {"document_ids": torch.from_numpy(ids.copy()), "labels": labels}
        assert redact_labels(batch, step, blocklist, rows) == int(want.sum())
        assert torch.equal(batch["labels"] == -100, torch.from_numpy(want))


def test_the_mask_needs_the_rows_sources_over_a_mixture():
    blocklist = Blocklist([Redaction([1], 0, source=1)])
    ids = np.array([[1, 1], [1, 2]])
    with pytest.raises(ValueError, match="these redactions name mixture sources: mask"):
        blocklist.mask(ids, 0)
    with pytest.raises(ValueError, match=r"the mixture source \(an integer >= 0\) of each row of the batch \(2, 2\)"):
        blocklist.mask(ids, 0, np.array([0, 1, 1]))
    with pytest.raises(ValueError, match="these redactions name no mixture source: mask"):
        Blocklist([Redaction([1], 0)]).mask(ids, 0, np.array([0, 1]))
    assert blocklist.mask(ids, 0, np.array([0, 1])).tolist() == [[False, False], [True, False]]
    assert Blocklist([]).mask(ids, 0, np.array([0, 1])).tolist() == [[False, False], [False, False]]
    # ids beyond one lookup table (2**24 entries in all): a loop over the sources, np.isin within each
    big = Blocklist([Redaction([2**25, 1], 0, source=0), Redaction([2], 0, source=1)])
    ids = np.array([[2**25, 1, 2, -1], [2**25, 1, 2, -1], [2**25, 1, 2, -1]])
    want = [[True, True, False, False], [False, False, True, False], [False, False, False, False]]
    assert big.mask(ids, 0, np.array([0, 1, 5])).tolist() == want
    assert (
        Blocklist([Redaction([2**20, 1], 0, source=0), Redaction([2], 0, source=1)])
        .mask(ids.clip(max=2**20), 0, np.array([0, 1, 5]))
        .tolist()
        == want
    )  # the same through the end-to-end tables


# -- the invariant on real batches, across a resume

SEQ_LEN, RESUME, STOP = 256, 10, 40
SCHEDULE = [(0, [1, 3]), (20, [3, 1])]
SKIPS = [(5, 7), (30, 31)]
# document 6 of both sources, 10 of source 0 only, 9 of source 1 only (one index under both: the same ids)
REDACTIONS = [Redaction([6, 10], RESUME, source=0), Redaction([6, 9], 25, source=1)]


def _mixture_plan(layouts, redactions=None) -> Plan:
    mixture = Mixture(layouts, SCHEDULE, seed=5)
    return Plan(
        source=mixture, global_batch_size=16, micro_batch_size=2, world_size=2, skip_steps=SKIPS, redactions=redactions
    )


def _read(plan, dataset, rank, start, stop, blocklist=None):
    """``rank``'s micro batches of steps ``[start, stop)`` through a DataLoader, redacted with ``blocklist``."""
    sampler = DeterministicBatchSampler(plan, rank, start_step=start, stop_step=stop)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_micro_batch)
    out = {}
    for step, micro_batches in sampler.steps(loader):
        if blocklist is not None:
            redact_step(micro_batches, step, blocklist, plan, rank)
        out[step] = micro_batches
    return out


def test_redaction_through_a_mixture_moves_nothing_else_across_a_resume(small_index):
    layouts = [
        small_index.layout(LayoutConfig(kind="concat", seq_len=SEQ_LEN, seed=1)),
        small_index.layout(LayoutConfig(kind="bestfit", seq_len=SEQ_LEN, seed=2)),
    ]
    base, redacted = _mixture_plan(layouts), _mixture_plan(layouts, REDACTIONS)
    packed = [PackedDataset(small_index, layout) for layout in layouts]
    dataset = MixtureDataset(packed, base.stream)
    fingerprint = lambda plan: DataFingerprint.of([small_index, small_index], layouts, plan)
    check_resume(fingerprint(base), fingerprint(redacted), RESUME)  # the redactions start at the resume step
    expected = {}  # (step, micro step, rank, row) -> positions whose labels are masked
    for r in REDACTIONS:
        for d in r.documents:
            reads = where(redacted, layouts, d, (0, STOP), source=r.source)
            assert min(x.step for x in reads) < r.from_step <= max(x.step for x in reads)  # read before and after
            for x in reads:
                if x.step >= r.from_step:
                    cells = expected.setdefault((x.step, x.micro_step, x.rank, x.row), set())
                    cells.update(range(x.offset, min(x.offset + x.stop - x.start, SEQ_LEN)))
    masked = 0
    for rank in range(2):
        clean = _read(base, dataset, rank, 0, STOP)  # the run without redactions
        resumed = {
            **_read(base, dataset, rank, 0, RESUME),
            **_read(redacted, dataset, rank, RESUME, STOP, Blocklist(redacted.redactions)),
        }
        assert sorted(resumed) == sorted(clean) == list(range(STOP))
        for step in range(STOP):
            sources = step_sources(redacted, step, rank)
            for a, (want, got) in enumerate(zip(clean[step], resumed[step])):
                assert sorted(got) == sorted(want)
                ids = redacted.micro_batch(step, a, rank)
                assert sources[a].tolist() == redacted.stream.split_ids(ids)[0].tolist()
                for key in want:
                    if key != "labels":
                        assert torch.equal(got[key], want[key]), (step, a, key)
                diff = got["labels"] != want["labels"]
                assert (got["labels"][diff] == -100).all()
                for row in range(2):
                    cells = expected.get((step, a, rank, row), set())
                    cells = {p for p in cells if int(want["labels"][row, p]) != -100}
                    assert set(torch.nonzero(diff[row]).flatten().tolist()) == cells, (step, a, rank, row)
                masked += int(diff.sum())
    assert masked > 0
    # the pairs named and no others: document 10 of source 1 and document 9 of source 0 keep their labels
    for d, k in ((10, 1), (9, 0)):
        assert where(redacted, layouts, d, (RESUME, STOP), source=k)  # read, yet never masked (the check above)


# -- the audit trail


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(doc_lengths(max_docs=10, max_len=30), min_size=2, max_size=3),
    kind=st.sampled_from(LAYOUT_KINDS),
    mix_seed=seeds,
    skips=st.one_of(st.none(), skip_ranges(max_step=10, max_ranges=2, max_len=3)),
    data=st.data(),
)
def test_the_audit_of_a_mixture_equals_the_scan(lengths, kind, mix_seed, skips, data):
    config = LayoutConfig(kind=kind, seq_len=4, seed=1, window_docs=3)
    layouts = [make_layout(config, np.append(x, 9)) for x in lengths]
    schedule = data.draw(weight_schedules(len(layouts), max_step=8), label="weights")
    redactions = []
    for k, layout in enumerate(layouts):
        docs = data.draw(st.sets(st.integers(0, layout.num_documents - 1), max_size=3), label=f"docs {k}")
        if docs:
            redactions.append(Redaction(sorted(docs), data.draw(st.integers(0, 12), label=f"step {k}"), source=k))
    plan = Plan(
        source=Mixture(layouts, schedule, mix_seed),
        global_batch_size=4,
        micro_batch_size=2,
        world_size=2,
        skip_steps=skips,
        redactions=redactions or None,
    )
    stop = data.draw(st.one_of(st.none(), st.integers(0, 12)), label="stop")
    audit = redaction_audit(plan, layouts, stop)
    want = []
    for r in plan.redactions or ():  # by step, then source
        last = r.from_step if stop is None else min(r.from_step, stop)
        for d in r.documents:
            reads = scan(plan, layouts, d, 0, last, source=r.source)
            tokens = sum(min(x.stop - x.start, 4 - x.offset) for x in reads)
            row = {"source": r.source, "document": d, "from_step": r.from_step}
            want.append({**row, "steps": sorted({x.step for x in reads}), "reads": len(reads), "tokens": tokens})
    assert audit == want


def test_stats_and_verify_print_the_audit_of_a_mixture_checkpoint(capsys, small_index, tmp_path):
    from detsampler.cli import main

    layouts = [
        small_index.layout(LayoutConfig(kind="document", seq_len=64, seed=1)),
        small_index.layout(LayoutConfig(kind="document", seq_len=64, seed=2)),
    ]
    redactions = [Redaction([0, 5], 4, source=1), Redaction([5], 6, source=0)]
    plan = Plan(source=Mixture(layouts, [1, 1], seed=3), global_batch_size=8, micro_batch_size=2, redactions=redactions)
    DataRecord.of(8, [small_index, small_index], layouts, plan, names=["web", "code"]).save(tmp_path)
    audit = redaction_audit(plan, layouts, stop=8)
    assert [(row["source"], row["document"]) for row in audit] == [(1, 0), (1, 5), (0, 5)]
    assert main(["stats", "--checkpoint", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["redactions"]
    assert [{k: v for k, v in r.items() if k != "trained"} for r in rows] == audit and all("trained" in r for r in rows)
    for command in ("stats", "verify"):
        assert main([command, "--checkpoint", str(tmp_path)]) == 0
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("redacted ")]
        assert [line.split(":")[0] for line in lines] == [
            "redacted doc 0 of source code",
            "redacted doc 5 of source code",
            "redacted doc 5 of source web",
        ]
    # --redact names the source: the recorded list agrees, another contradicts it
    assert main(["verify", "--checkpoint", str(tmp_path), "--redact", "code:4:0,5", "--redact", "0:6:5"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--checkpoint", str(tmp_path), "--redact", "web:4:0,5", "--redact", "code:6:5"])
    assert exc.value.code == 2 and "contradicts the checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--checkpoint", str(tmp_path), "--redact", "books:4:0"])
    assert (
        exc.value.code == 2
        and "no source 'books': the mixture's sources are ['web', 'code']" in capsys.readouterr().err
    )

"""The audits of detsampler.verify with skip ranges: skipped data is accounted as skipped, real gaps are still found,
and a mixture's source epochs are checked for gaps whether or not a skip range lies in the audited steps (issue 11,
items 1, 2)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detsampler import Mixture, Plan
from detsampler.mixture import MixtureLookup
from detsampler.verify import verify_mixture_plan, verify_plan


def test_skipped_data_is_not_a_gap():
    """Training steps 0..11 read data steps 0, 1, 4, 5, ..., 13: data steps 2, 3 (positions 8..15) are skipped."""
    report = verify_plan(Plan(20, 1, 4, 2, 2, skip_steps=[(2, 3)]), 0, 12)
    assert report["ok"], report
    assert report["skipped"] == {"data_steps": [[2, 3]], "positions": 8}
    first, second, third = report["epochs"]
    assert (first["complete"], first["distinct_samples"], first["skipped_samples"], first["gaps"]) == (True, 12, 8, 0)
    row = (second["complete"], second["distinct_samples"], second["skipped_samples"], second["gaps"])
    assert row == (True, 20, 0, 0)
    assert not third["complete"] and third["gaps"] is None
    assert verify_plan(Plan(20, 1, 4, 2, 2), 0, 12)["skipped"] == {"data_steps": [], "positions": 0}


@dataclass(frozen=True)
class _LosingStream:
    """A deliberately broken epoch stream: position ``n - 1`` of each epoch re-reads sample 0 (sample ``n - 1`` is
    lost)."""

    num_samples: int

    def sample_ids(self, positions):
        within = np.asarray(positions) % self.num_samples
        return np.where(within == self.num_samples - 1, 0, within)

    def epochs(self, positions):
        return np.asarray(positions) // self.num_samples

    def describe(self):
        return {"kind": "broken"}

    def with_step_positions(self, consumed):
        return self

    def with_mapping_version(self, version):
        return self


def test_real_gaps_are_found_beside_skipped_data():
    report = verify_plan(
        Plan(
            source=_LosingStream(20), seed=1, global_batch_size=4, micro_batch_size=2, world_size=2, skip_steps=[(2, 3)]
        ),
        0,
        12,
    )
    assert not report["ok"]
    assert report["epochs"][0]["gaps"] == 1 and report["epochs"][0]["skipped_samples"] == 8
    assert report["epochs"][1]["gaps"] == 1 and report["epochs"][1]["duplicates"] == 1


def _mixture_plan(mixture, skip_steps=None):
    return Plan(source=mixture, seed=0, global_batch_size=8, micro_batch_size=2, world_size=2, skip_steps=skip_steps)


def test_mixture_epochs_after_a_skip_range_are_checked_for_gaps():
    """Every source epoch that the audited positions (read or skipped) cover whole is complete and checked for gaps."""
    plan = _mixture_plan(Mixture([30, 20], [(0, [1, 1]), (6, [1, 3])], seed=5), skip_steps=[(3, 4)])
    report = verify_mixture_plan(plan, 0, 40)
    assert report["ok"], report
    assert report["skipped"] == {"data_steps": [[3, 4]], "positions": 16}
    complete = [(s["source"], r["epoch"]) for s in report["sources"] for r in s["epochs"] if r["complete"]]
    assert (0, 0) in complete and (1, 0) in complete and (1, 5) in complete  # before, across and long after the range
    for src in report["sources"]:
        for r in src["epochs"]:
            assert (r["gaps"] == 0) if r["complete"] else (r["gaps"] is None)
    skipped = sum(r["skipped_samples"] for s in report["sources"] for r in s["epochs"])
    assert skipped == 16


class _LosingMixture(Mixture):
    """A deliberately broken mixture: source 1's sample 3 is read as sample 4 (a gap and a duplicate in every epoch)."""

    def lookup(self, positions):
        look = super().lookup(positions)
        sample = np.where((look.source == 1) & (look.source_sample == 3), 4, look.source_sample)
        return MixtureLookup(
            look.source, look.source_position, look.source_epoch, sample, sample + np.asarray(self.offsets)[look.source]
        )


def test_mixture_gaps_are_found_with_a_skip_range():
    plan = _mixture_plan(_LosingMixture([30, 20], [1, 1], seed=5), skip_steps=[(3, 4)])
    report = verify_mixture_plan(plan, 0, 40)
    assert not report["ok"]
    late = [r for r in report["sources"][1]["epochs"] if r["complete"] and r["epoch"] >= 2]
    assert late and all(r["gaps"] == 1 and r["duplicates"] == 1 for r in late)

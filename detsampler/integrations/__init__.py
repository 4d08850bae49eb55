"""Drop-ins for the trainers people use, each an optional extra imported only when its module is:

- :mod:`~detsampler.integrations.hf`: ``transformers.Trainer`` and ``accelerate`` (``pip install 'detsampler[hf]'``);
- :mod:`~detsampler.integrations.lightning`: a Lightning ``LightningDataModule`` (``pip install
  'detsampler[lightning]'``);
- :mod:`~detsampler.integrations.torchtitan`: a torchtitan data loader (``pip install 'detsampler[torchtitan]'``);
- :mod:`~detsampler.integrations.torchft`: each step's global batch split among the torchft replica groups alive at
  its quorum (``pip install 'detsampler[torchft]'``);
- :mod:`~detsampler.integrations.grain`: a Grain data source and index sampler of the plan's micro batches, for Grain
  pipelines (torchtitan's main branch, JAX trainers) (``pip install 'detsampler[grain]'``).

torchdata's ``StatefulDataLoader`` needs no integration: pass the sampler as its ``batch_sampler``
(docs/integrations.md). Each integration resumes from the step the trainer already checkpoints, the same on every rank,
on any world size that divides the global batch; ``import detsampler.integrations`` imports none of the trainers.
Each saves a :class:`~detsampler.record.DataRecord` with every checkpoint and refuses a resume onto other data
(:mod:`~detsampler.integrations.checkpoint`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, extra: str) -> ModuleType:
    """Import ``module``, or raise ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{module} is not installed: pip install 'detsampler[{extra}]' ({error})") from error

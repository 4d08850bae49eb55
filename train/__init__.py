"""train: a small FSDP2 trainer that resumes by step number on top of detsampler.

Entry points: ``python -m train.train`` (training, under ``torchrun`` or as one process), ``python -m train.plot`` (loss
curves with resume points), ``python -m train.demo`` (``make demo``: an interrupted run against an uninterrupted one).
"""

__all__: list[str] = []

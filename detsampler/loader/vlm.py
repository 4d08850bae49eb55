"""The batch a vision-language model takes, made in DataLoader workers: tokens from the media index, pixels from the
real transformers image processor, the planned token count checked against the processor's actual output.

``VLMDataset[sample_ids]`` (``__getitems__``: one micro batch) reads:

- ``input_ids`` ``[B, L]``: each image's placeholder already expanded to its token count (the index stores them so);
  ``labels``: the next token within each document piece, ``-100`` at each piece's end, on padding and wherever the
  target is an image token; ``document_ids``; ``position_ids``: ``[B, L]`` restarting at each piece (``rope="1d"``) or
  Qwen2-VL's ``[4, B, L]`` (``rope="qwen2_vl"``): row 0 those text positions (what the model's packed-sequence mask
  reads), rows 1-3 the multimodal rope's temporal/height/width positions, computed per piece exactly as the model's
  ``get_rope_index`` computes them per sequence (tests/test_media_loader.py compares them by value);
- ``pixel_values``: the processor's output for the micro batch's images in sample and position order (Qwen2-VL:
  ``[sum of patches, C * T * P * P]``); ``image_grid_thw`` ``[num_images, 3]``; ``images_per_sample`` ``[B]``;
- ``mm_token_type_ids`` (1 on image tokens), ``cu_seqlens`` and ``max_seqlen`` of the per-document segments;
- over chat data (an index built with ``chat=``), ``loss_mask`` (bool ``[B, L]``, ``labels != -100``): the labels are
  -100 wherever the policy trains nothing and on every image token, and none crosses from one conversation into the
  next (tests/test_media_chat.py checks them by value against the processor's ``apply_chat_template``).

Each image's bytes are read by their recorded location and checked against their CRC-32, decoded, turned by the EXIF
orientation recorded at build, and handed to the processor; its grid and patch count must equal the planned ones (a
``ValueError`` naming the image otherwise, never a truncated or overflowing sample). ``augment(image, rng)`` (seeded
augmentation, size-preserving) draws from a generator keyed by ``(seed, epoch, document, item)``: the sample's epoch
comes from the plan and the micro batch's place in it (``PlannedIds``), so a resumed run, another number of workers or
another world size makes the same pixels, bit for bit.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from detsampler.boundaries import sequence_boundaries
from detsampler.filter import RepetitionFilter
from detsampler.gather import IGNORE_INDEX
from detsampler.keys import stable_hash64
from detsampler.loader.dataset import MicroBatch, PackedDataset
from detsampler.loader.prefetch import PrefetchConfig, PrefetchStats
from detsampler.media.headers import MediaError
from detsampler.media.index import MediaIndex
from detsampler.media.layout import MediaLayout
from detsampler.plan import Plan

__all__ = ["ROPES", "FlipJitter", "VLMDataset", "augment_rng", "qwen2_vl_positions"]

ROPES = ("1d", "qwen2_vl")
# EXIF orientation -> the Pillow transpose that undoes it (as PIL.ImageOps.exif_transpose applies it)
_TRANSPOSE = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE", 6: "ROTATE_270",
              7: "TRANSVERSE", 8: "ROTATE_90"}  # fmt: skip


def augment_rng(seed: int, epoch: int, document: int, item: int) -> np.random.Generator:
    """The generator of image ``item`` of ``document`` in ``epoch``: a function of these four numbers only."""
    return np.random.Generator(np.random.PCG64(stable_hash64("vlm-augment", seed, epoch, document, item)))


class FlipJitter:
    """A seeded, size-preserving augmentation: a horizontal flip with probability ``flip`` and a brightness factor
    drawn uniformly from ``[1 - brightness, 1 + brightness]``."""

    def __init__(self, flip: float = 0.5, brightness: float = 0.2) -> None:
        if not 0.0 <= flip <= 1.0 or not 0.0 <= brightness < 1.0:
            raise ValueError(f"FlipJitter: flip must be in [0, 1] and brightness in [0, 1), got {flip}, {brightness}")
        self.flip, self.brightness = float(flip), float(brightness)

    def __call__(self, image: Any, rng: np.random.Generator) -> Any:
        from PIL import Image

        pixels = np.asarray(image, dtype=np.float32)
        if rng.random() < self.flip:
            pixels = pixels[:, ::-1]
        factor = rng.uniform(1.0 - self.brightness, 1.0 + self.brightness)
        return Image.fromarray(np.clip(np.rint(pixels * factor), 0, 255).astype(np.uint8), image.mode)


def _check_processor(processor: Any, index: MediaIndex) -> None:
    """Refuse an image processor whose settings differ from the ones the index counted tokens with."""
    counts = index.meta["counts"]
    if counts["family"] != "qwen2_vl":
        return
    size = getattr(processor, "size", None) or {}
    have = {
        "min_pixels": size.get("shortest_edge"),
        "max_pixels": size.get("longest_edge"),
        "patch_size": getattr(processor, "patch_size", None),
        "merge_size": getattr(processor, "merge_size", None),
        "temporal_patch_size": getattr(processor, "temporal_patch_size", None),
    }
    wrong = [f"{k}: {have[k]!r} (the index counted with {counts[k]!r})" for k in have if have[k] != counts[k]]
    if wrong:
        raise ValueError(
            f"image processor {type(processor).__name__} differs from the count function of the media index"
            f" {str(index.path)!r}: {'; '.join(wrong)}; make it with Qwen2VLCounts(...).processor_kwargs()"
        )


def qwen2_vl_positions(
    positions: np.ndarray, image_rows: np.ndarray, image_cols: np.ndarray, grids: np.ndarray, merge_size: int
) -> np.ndarray:
    """Qwen2-VL's multimodal rope positions ``[3, B, L]`` of a packed micro batch, each piece on its own.

    ``positions``: the 1-D positions (restarting at 0 at each piece); image ``i`` starts at ``[image_rows[i],
    image_cols[i]]`` and has the processor grid ``grids[i] = (t, h, w)``. As the model's ``get_rope_index``: a text
    token at ``p`` is ``p`` plus what the images before it in its piece shifted; an image's ``(h / m) x (w / m)``
    tokens, starting at ``s``, are ``(s, s + row, s + col)``, and the text after it continues at
    ``s + max(h, w) / m``."""
    b, length = positions.shape
    llm_h, llm_w = grids[:, 1] // merge_size, grids[:, 2] // merge_size
    tokens = grids[:, 0] * llm_h * llm_w
    shift = np.zeros((b, length + 1), np.int64)
    np.add.at(shift, (image_rows, image_cols + tokens), np.maximum(llm_h, llm_w) - tokens)
    shifted = np.cumsum(shift, axis=1)[:, :length]
    piece_start = np.arange(length)[None, :] - positions  # where each position's piece starts in its row
    text = positions + shifted - np.take_along_axis(shifted, piece_start, axis=1)
    out = np.repeat(text[None], 3, axis=0)
    if len(tokens):
        image = np.repeat(np.arange(len(tokens)), tokens)
        q = np.arange(int(tokens.sum())) - np.repeat(np.cumsum(tokens) - tokens, tokens)  # token within its image
        rows, cols = image_rows[image], image_cols[image] + q
        start = text[image_rows, image_cols][image]
        plane = q % (llm_h * llm_w)[image]
        out[0, rows, cols] = start
        out[1, rows, cols] = start + plane // llm_w[image]
        out[2, rows, cols] = start + plane % llm_w[image]
    return out


class VLMBatch(MicroBatch):
    """A VLM micro batch: its fields are not per sample (``pixel_values`` holds every image's patches), so it goes
    through :func:`~detsampler.loader.dataset.collate_micro_batch` whole."""

    def __getitem__(self, i: int | slice) -> Any:
        raise TypeError("a VLM micro batch is read whole: pass collate_fn=detsampler.loader.collate_micro_batch")


class VLMDataset(Dataset):
    """Map-style dataset of the samples of a :class:`~detsampler.media.layout.MediaLayout` over a
    :class:`~detsampler.media.index.MediaIndex`, each micro batch made with ``image_processor`` (see the module doc).

    ``plan``: the plan the batch sampler reads (needed with ``augment``: it gives each sample's epoch); ``seed``: the
    augmentation's seed; ``rope``: ``"1d"`` or ``"qwen2_vl"`` (the 4-row position ids of Qwen2-VL's rope);
    ``instance_filter``: a flagged sample's labels are -100 (its text's repetitions; its images' runs of image tokens
    never count as one); ``prefetch`` (with ``plan``): each process fetches the blocks of the images (webdataset
    shards in a bucket) and of the tokens (an index in a bucket) that its next micro batches read, exactly, before it
    reads them (:mod:`detsampler.loader.prefetch`); every image's CRC-32 is checked as it is read, with or without."""

    def __init__(
        self,
        index: MediaIndex,
        layout: MediaLayout,
        image_processor: Any,
        *,
        plan: Plan | None = None,
        seed: int = 0,
        augment: Callable[[Any, np.random.Generator], Any] | None = None,
        rope: str = "1d",
        instance_filter: RepetitionFilter | None = None,
        prefetch: PrefetchConfig | None = None,
    ) -> None:
        if not isinstance(index, MediaIndex) or not isinstance(layout, MediaLayout):
            raise TypeError(f"VLMDataset reads a MediaIndex and a MediaLayout, got {type(index).__name__} and"
                            f" {type(layout).__name__}")  # fmt: skip
        if rope not in ROPES:
            raise ValueError(f"rope must be one of {ROPES}, got {rope!r}")
        if rope == "qwen2_vl" and index.meta["counts"]["family"] != "qwen2_vl":
            raise ValueError(f"rope='qwen2_vl' needs an index counted by Qwen2VLCounts, got {index.meta['counts']}")
        if augment is not None and plan is None:
            raise ValueError("augment draws per (seed, epoch, document, item): pass plan= (the batch sampler's plan)")
        if plan is not None and plan.stream.num_samples != layout.num_samples:
            raise ValueError(
                f"the plan draws from {plan.stream.num_samples} samples, the layout has {layout.num_samples}"
            )
        _check_processor(image_processor, index)
        self.index, self.layout, self.processor = index, layout, image_processor
        self.plan, self.seed, self.augment, self.rope = plan, int(seed), augment, rope
        self.instance_filter, self.prefetch = instance_filter, prefetch
        self.packed = PackedDataset(index, layout, instance_filter=instance_filter, prefetch=prefetch, plan=plan)

    def __len__(self) -> int:
        return self.layout.num_samples

    def prefetch_stats(self) -> PrefetchStats | None:
        """What this process's prefetcher fetched (:meth:`PackedDataset.prefetch_stats`)."""
        return self.packed.prefetch_stats()

    def close(self) -> None:
        """Stop this process's prefetcher."""
        self.packed.close()

    def __getitem__(self, sample_id: int) -> dict[str, torch.Tensor]:
        return self.get_batch([sample_id])

    def __getitems__(self, sample_ids: Sequence[int]) -> VLMBatch:
        epochs = None
        if self.plan is not None and hasattr(sample_ids, "micro_step"):  # PlannedIds: where the plan puts them
            positions = self.plan.micro_batch_positions(sample_ids.step, sample_ids.micro_step, sample_ids.rank)
            epochs = self.plan.stream.epochs(positions)
        return VLMBatch(self.get_batch(sample_ids, epochs))

    def _decode(self, image: int, data: bytes, row: dict, k: int, epoch: int | None) -> Any:
        """Image ``image`` (its bytes ``data``, its record row ``k`` of ``row``) decoded, oriented as recorded, in RGB,
        augmented."""
        from PIL import Image

        stored = (int(row["width"][k]), int(row["height"][k]))
        if int(row["orientation"][k]) >= 5:
            stored = stored[::-1]
        try:
            with Image.open(io.BytesIO(data)) as opened:
                opened.load()
                decoded = opened.convert("RGB")
        except (OSError, SyntaxError, ValueError) as exc:
            raise MediaError(f"{self.index.image_name(image)}: cannot be decoded ({exc})") from None
        if decoded.size != stored:
            raise MediaError(f"{self.index.image_name(image)}: decoded {decoded.size}, its header said {stored}")
        turn = _TRANSPOSE.get(int(row["orientation"][k]))
        if turn is not None:
            decoded = decoded.transpose(getattr(Image.Transpose, turn))
        if self.augment is not None:
            rng = augment_rng(self.seed, int(epoch), int(row["doc"][k]), int(row["item"][k]))
            decoded = self.augment(decoded, rng)
        return decoded

    def _pixels(self, images: np.ndarray, rows: dict, epochs: np.ndarray | None, held: dict) -> dict[str, torch.Tensor]:
        """The processor's output for ``images``, checked against their planned grids and patch counts; ``held``: the
        prefetcher's objects holding their blocks."""
        if not len(images):
            return {"pixel_values": torch.zeros((0, 0)), "image_grid_thw": torch.zeros((0, 3), dtype=torch.long)}
        data = self.index.read_images(images, rows, held)  # every image's CRC-32 checked
        decoded = [self._decode(int(i), data[k], rows, k, None if epochs is None else epochs[k])
                   for k, i in enumerate(images)]  # fmt: skip
        out = self.processor(images=decoded, return_tensors="np")
        pixels = np.asarray(out["pixel_values"])
        grid = np.asarray(out["image_grid_thw"]) if "image_grid_thw" in out else None
        planned = np.stack([rows["grid_t"], rows["grid_h"], rows["grid_w"]], axis=1)
        if grid is not None and not np.array_equal(grid, planned):
            k = int(np.flatnonzero((grid != planned).any(axis=1))[0])
            raise ValueError(
                f"{self.index.image_name(int(images[k]))}: the processor made grid {grid[k].tolist()}"
                f" ({int(grid[k].prod())} patches), the index planned {planned[k].tolist()} ({int(rows['patches'][k])}"
                f" patches, {int(rows['tokens'][k])} tokens) from its header's {int(rows['width'][k])}x"
                f"{int(rows['height'][k])}: the sample would not hold its image tokens"
            )
        if grid is not None and len(pixels) != int(rows["patches"].sum()):
            raise ValueError(f"the processor made {len(pixels)} patch rows, the index planned {rows['patches'].sum()}")
        result = {"pixel_values": torch.from_numpy(np.ascontiguousarray(pixels))}
        result["image_grid_thw"] = torch.from_numpy(planned.astype(np.int64))
        return result

    def get_batch(self, sample_ids: Sequence[int] | np.ndarray, epochs: np.ndarray | None = None) -> dict:
        """The micro batch of ``sample_ids`` (see the module doc); ``epochs``: each sample's epoch (for ``augment``)."""
        ids = np.asarray(sample_ids, dtype=np.int64).reshape(-1)
        if self.augment is not None and epochs is None:
            raise ValueError(
                "augment draws per (seed, epoch, document, item): read through DeterministicBatchSampler (its"
                " PlannedIds carry the step) or pass epochs="
            )
        offsets, images = self.layout.sample_images(ids)
        rows = self.index.image_rows(images)
        sample_of = np.repeat(np.arange(len(ids)), np.diff(offsets))
        image_epochs = None if epochs is None else np.asarray(epochs, np.int64).reshape(-1)[sample_of]
        with self.packed.reading(sample_ids) as (batch, held):  # the images read while their blocks are held
            batch.update(self._pixels(images, rows, image_epochs, held))
        input_ids = batch["input_ids"].numpy()
        image_id = self.index.image_token_id
        is_image = input_ids == image_id
        planned = np.bincount(sample_of, weights=rows["tokens"], minlength=len(ids)).astype(np.int64)
        if not np.array_equal(is_image.sum(axis=1), planned):
            s = int(np.flatnonzero(is_image.sum(axis=1) != planned)[0])
            raise ValueError(
                f"sample {int(ids[s])}: {int(is_image[s].sum())} image tokens, its images plan {planned[s]}"
            )
        labels = batch["labels"]
        labels[labels == image_id] = IGNORE_INDEX
        if "loss_mask" in batch:  # chat data: the stored mask is 0 on image tokens already; kept equal to the labels'
            batch["loss_mask"] &= labels != IGNORE_INDEX
        batch["mm_token_type_ids"] = torch.from_numpy(is_image.astype(np.int64))
        batch["images_per_sample"] = torch.from_numpy(np.diff(offsets).astype(np.int64))
        positions = batch["position_ids"].numpy()
        cu, longest = sequence_boundaries(positions, batch["document_ids"].numpy())
        batch["cu_seqlens"], batch["max_seqlen"] = torch.from_numpy(cu), int(longest)
        if self.rope == "qwen2_vl":
            where = self._image_starts(rows, is_image)
            grids = batch["image_grid_thw"].numpy()
            mrope = qwen2_vl_positions(positions, *where, grids, int(self.index.meta["counts"]["merge_size"]))
            batch["position_ids"] = torch.from_numpy(np.concatenate([positions[None], mrope]))
        return batch

    @staticmethod
    def _image_starts(rows: dict, is_image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each image's (row, column) in the micro batch: its images' tokens are the image tokens in row-major order
        (sample, then position), each image's run its planned count long."""
        r, c = np.nonzero(is_image)
        first = (np.cumsum(rows["tokens"]) - rows["tokens"]).astype(np.int64)
        return r[first], c[first]

    def __reduce__(self):
        return (
            _rebuild_vlm,
            (self.index, self.layout, self.processor, self.plan, self.seed, self.augment, self.rope,
             self.instance_filter, self.prefetch),
        )  # fmt: skip


def _rebuild_vlm(index, layout, processor, plan, seed, augment, rope, instance_filter, prefetch) -> VLMDataset:
    return VLMDataset(index, layout, processor, plan=plan, seed=seed, augment=augment, rope=rope,
                      instance_filter=instance_filter, prefetch=prefetch)  # fmt: skip

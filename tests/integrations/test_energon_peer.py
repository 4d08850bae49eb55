"""The peers on the same generated image-text corpus (issue 33), driven through their own public APIs: megatron-energon
(its packing with Megatron-LM's multimodal task encoder's greedy knapsack, and its resume) and a plain webdataset
pipeline. Energon refuses a resume on another data-parallel size where the plan continues the same global batches; our
two-axis best fit fills at least as well as Energon's packing of the same sizes; both peers' decoders hand the
processor images without their EXIF orientation, which transformers' ``load_image`` applies and the media index
records."""

from __future__ import annotations

import bisect
import dataclasses
import io

import numpy as np
import pytest
from PIL import Image
from transformers.image_utils import load_image

from detsampler import Plan
from detsampler.media import MediaLayoutConfig, Qwen2VLCounts
from detsampler.media.build import build_media_index
from detsampler.media.sources import webdataset_source
from train.vlm_corpus import corpus_documents, make_vlm_tokenizer, write_shards

COUNTS = Qwen2VLCounts(min_pixels=4 * 28 * 28, max_pixels=64 * 28 * 28)
SEQ_LEN = 1024
EXTENTS: dict[str, int] = {}  # sample key -> its positions in our index: the same sizes for both packers


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from megatron.energon.flavors.webdataset.prepare import WebdatasetPreparator

    root = tmp_path_factory.mktemp("peers")
    shards = write_shards(corpus_documents(240, seed=4), root / "wds", per_shard=60)
    tokenizer = make_vlm_tokenizer(root / "tok")
    index = build_media_index(webdataset_source(shards, cache_dir=root), tokenizer, COUNTS, cache_dir=root / "cache")
    WebdatasetPreparator.prepare_dataset(root / "wds", [s.name for s in shards], split_parts_ratio=[("train", 1.0)],
                                         workers=1)  # fmt: skip
    (root / "wds" / ".nv-meta" / "dataset.yaml").write_text(
        "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
    )
    lengths = np.asarray(index.lengths[0 : index.num_documents], np.int64)
    EXTENTS.update({f"{int(row):06d}": int(n) + 1 for row, n in zip(index.doc_rows[0 : index.num_documents], lengths)})
    return root / "wds", shards, index


def greedy_knapsack(sizes: list[int], samples: list, capacity: int) -> list[list]:
    """Megatron-LM's packer for Energon (examples/multimodal/dataset_helpers.py, `greedy_knapsack`, after
    LLaMA-Factory): sizes sorted ascending; each knapsack takes the largest that fits (a bisect), until none does."""
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    left_sizes, left = [sizes[i] for i in order], [samples[i] for i in order]
    out = []
    while left_sizes:
        bag, room = [], capacity
        while (i := bisect.bisect(left_sizes, room) - 1) >= 0:
            room -= left_sizes.pop(i)
            bag.append(left.pop(i))
        out.append(bag)
    return out


def energon_loader(path, rank: int, world_size: int, buffer: int, repeat: bool = True):
    from megatron.energon import (
        Cooker,
        DefaultTaskEncoder,
        Sample,
        WorkerConfig,
        basic_sample_keys,
        get_savable_loader,
        get_train_dataset,
        stateless,
    )

    @dataclasses.dataclass
    class Doc(Sample):
        total_len: int

    @stateless
    def cook(crude: dict) -> Doc:
        return Doc(**basic_sample_keys(crude), total_len=EXTENTS[crude["__key__"]])

    class Encoder(DefaultTaskEncoder):
        cookers = (Cooker(cook),)
        decoder = None  # the raw bytes: sizes come from our index, nothing is decoded

        def select_samples_to_pack(self, samples):
            return greedy_knapsack([s.total_len for s in samples], samples, SEQ_LEN)

        @stateless
        def pack_selected_samples(self, samples):
            return Doc(**basic_sample_keys(dataclasses.asdict(samples[0])), total_len=sum(s.total_len for s in samples))

        def batch(self, samples):
            return samples

        def encode_batch(self, batch):
            return batch

    config = WorkerConfig(rank=rank, world_size=world_size, num_workers=0)
    dataset = get_train_dataset(path, worker_config=config, batch_size=1, shuffle_buffer_size=None,
                                max_samples_per_sequence=None, task_encoder=Encoder(), packing_buffer_size=buffer,
                                repeat=repeat)  # fmt: skip
    return get_savable_loader(dataset)


def test_energon_refuses_a_resume_on_another_data_parallel_size(corpus):
    path, _, index = corpus
    loaders = [energon_loader(path, r, 2, buffer=16) for r in (0, 1)]
    for loader in loaders:
        stream = iter(loader)
        for _ in range(3):
            next(stream)
    states = [loader.save_state_rank() for loader in loaders]
    one = energon_loader(path, 0, 1, buffer=16)
    with pytest.raises(AssertionError, match="State must be a list of size world_size"):
        one.restore_state_global(states)  # megatron/energon/savable_loader.py
    layout = index.layout(MediaLayoutConfig(seq_len=SEQ_LEN, max_patches=1 << 20, window_docs=16))
    two = Plan(layout.num_samples, seed=0, global_batch_size=4, micro_batch_size=1, world_size=2)
    for step in (3, 50):  # ours: the step number resumes on one rank, the same global batch
        assert np.array_equal(two.with_world(1, 2).global_batch(step), two.global_batch(step))


@pytest.mark.parametrize("buffer", [64, 256])
def test_best_fit_fills_at_least_energons_packing_of_the_same_sizes(corpus, buffer):
    """Our windows of ``buffer`` documents against Energon's packing buffer of ``buffer`` samples (measured: 96.6% and
    92.9% at 64, 96.6% both at 256, the corpus's optimum of 25 samples; at 16, 77.9% against 80.5%: Energon's buffer
    carries what it did not pack into the next selection, our windows are packed each on its own)."""
    path, _, index = corpus
    packs = [p for batch in energon_loader(path, 0, 1, buffer, repeat=False) for p in batch]
    assert sum(p.total_len for p in packs) == sum(EXTENTS.values())  # one epoch, every document once
    energon = sum(p.total_len for p in packs) / (len(packs) * SEQ_LEN)
    ours = index.layout(MediaLayoutConfig(seq_len=SEQ_LEN, max_patches=1 << 20, window_docs=buffer)).describe()
    assert ours["llm_fill"] >= energon, (ours["llm_fill"], energon)


def test_the_peers_decoders_drop_the_exif_orientation_that_transformers_applies(corpus):
    import tarfile

    import webdataset as wds

    _, shards, index = corpus
    rotated = int((index.image_rows(np.arange(index.num_images))["orientation"] >= 5).sum())
    raw = {}
    for shard in shards:
        with tarfile.open(shard) as tar:
            raw.update({m.name: tar.extractfile(m).read() for m in tar.getmembers() if not m.name.endswith(".txt")})
    sideways = 0
    for sample in wds.WebDataset([str(s) for s in shards], shardshuffle=False).decode("pil"):  # a plain wds pipeline
        for ext, image in sample.items():
            if isinstance(image, Image.Image):
                upright = load_image(Image.open(io.BytesIO(raw[f"{sample['__key__']}.{ext}"])))  # transformers'
                sideways += image.size != upright.size
    assert rotated > 0 and sideways == rotated  # every EXIF-rotated image reaches the processor sideways

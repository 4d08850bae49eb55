"""A takedown end to end, as an SFT team on TRL runs one: chat data whose rows carry a ``conversation_id``, indexed
once and pushed to a bucket; TRL's ``SFTTrainer`` trains from the bucket, is killed and resumed; a takedown request
names a conversation by its id; ``where`` says which steps trained on it; the run resumes with it redacted from the
resume step, then its stored bytes are erased in the bucket and the run resumes again; the audit of the last checkpoint
lists exactly the steps that trained on it and proves its bytes gone.

    export AWS_ENDPOINT_URL=... AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... AWS_DEFAULT_REGION=...
    python docs/examples/trl_takedown.py WORKDIR s3://BUCKET/PREFIX conv-4107

(``tests/test_takedown_example.py`` runs it against moto's S3 on loopback, in about half a minute on 2 CPU cores.)
TRL's ``SFTConfig`` defaults to ``bf16=True`` and ``gradient_checkpointing=True`` (``activation_checkpointing`` in
transformers 5); on CPU both are turned off below.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import trl
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, TrainerCallback

from detsampler import LayoutConfig, PackedDataset, Plan
from detsampler.cli import main as detsampler
from detsampler.content import documents_by_id
from detsampler.index import TokenIndex
from detsampler.index.prepare import IndexConfig, load_dataset_for, prepare_index
from detsampler.index.push import push_index
from detsampler.integrations.hf import DetsamplerTrainerMixin, causal_lm_collator, sample_id_dataset
from detsampler.redaction import Redaction

SEQ_LEN, STEPS, SAVE_EVERY = 256, 8, 2


class DetsamplerSFTTrainer(DetsamplerTrainerMixin, trl.SFTTrainer):
    """TRL's SFTTrainer whose data is a detsampler plan: the lines to add to a TRL script."""


class StopAt(TrainerCallback):
    """Ends a run after step ``step``, as a job's time limit or a kill does: what it trained after its last checkpoint
    (every ``SAVE_EVERY`` steps) is lost and trained again on resume."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True


def corpus(workdir: Path) -> tuple[Path, Path]:
    """``support.jsonl``: 40 conversations, each row with a ``conversation_id``; and a chat tokenizer directory (the
    repository's: train/chat_corpus.py writes both, nothing downloaded)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from train.chat_corpus import write_chat_corpus

    chat, tokenizer = write_chat_corpus(workdir, num_conversations=40, seed=0)
    rows = [json.loads(line) for line in chat.read_text().splitlines()]
    support = workdir / "support.jsonl"
    lines = [json.dumps({"conversation_id": f"conv-{4100 + i}", **row}) + "\n" for i, row in enumerate(rows)]
    support.write_text("".join(lines))
    return support, tokenizer


def index_in_bucket(support: Path, tokenizer: Path, bucket: str, workdir: Path) -> str:
    """The chat index (assistant-only loss) and its layout built once and pushed; every run reads them from the
    bucket."""
    config = IndexConfig(data=str(support), text_column="messages", tokenizer=str(tokenizer),
                         cache_dir=str(workdir / "cache"), loss_policy="assistant")  # fmt: skip
    index = prepare_index(config, progress=False).index
    index.layout(LayoutConfig(kind="bestfit", seq_len=SEQ_LEN))  # persisted beside it, pushed with it
    url = f"{bucket}/{index.path.name}"
    push_index(index.path, url)
    return url


def train(url: str, tokenizer: Path, out: Path, stop_at: int, redactions=(), resume: bool = False, trainer=None):
    """One run of TRL's SFTTrainer over the bucket's index, from the newest checkpoint of ``out`` when ``resume``."""
    index = TokenIndex.open(url)
    packed = PackedDataset(index, index.layout(LayoutConfig(kind="bestfit", seq_len=SEQ_LEN)))
    plan = Plan(len(packed), seed=0, global_batch_size=4, micro_batch_size=2, redactions=list(redactions) or None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=index.vocab_size, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=SEQ_LEN))  # fmt: skip
    args = trl.SFTConfig(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,  # 4 = 1 process x 2 per device x 2 micro steps
        save_steps=SAVE_EVERY,
        logging_steps=1,
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,  # TRL's default is True
        activation_checkpointing=False,  # TRL sets gradient_checkpointing=True (its old name) by default
        report_to=[],
        disable_tqdm=True,
    )
    run = (trainer or DetsamplerSFTTrainer)(
        model=model,
        args=args,
        train_dataset=sample_id_dataset(packed),
        data_collator=causal_lm_collator(packed, model),
        processing_class=AutoTokenizer.from_pretrained(str(tokenizer)),
        plan=plan,
        callbacks=[StopAt(stop_at)],
    )
    run.train(resume_from_checkpoint=True if resume else None)
    return run


def takedown(workdir: Path, bucket: str, conversation: str, trainer=None) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    support, tokenizer = corpus(workdir)
    url = index_in_bucket(support, tokenizer, bucket, workdir)
    out = workdir / "run"
    train(url, tokenizer, out, stop_at=3, trainer=trainer)  # killed after steps 0-2; its last checkpoint: checkpoint-2
    train(url, tokenizer, out, stop_at=4, resume=True, trainer=trainer)  # resumed: steps 2 (again) and 3, checkpoint-4
    # the takedown request names a conversation by its id: which steps trained on it, and which will read it
    checkpoint = out / "checkpoint-4"
    where = ["where", "--checkpoint", str(checkpoint), "--data", str(support), "--quiet"]
    detsampler([*where, "--id-column", "conversation_id", "--id", conversation, "--steps", f"0:{STEPS}"])
    rows = load_dataset_for(IndexConfig(data=str(support), text_column="messages", cache_dir=str(workdir / "cache")))
    doc = documents_by_id(rows, "conversation_id", [conversation])[0]  # the id as the API takes it
    # redacted from the resume step on: nothing else moves, its labels leave the loss
    redacted = [Redaction([doc], from_step=4)]
    train(url, tokenizer, out, stop_at=6, redactions=redacted, resume=True, trainer=trainer)
    # a legal erasure of the stored bytes, in the bucket: every length kept, the run resumes across it
    detsampler(["erase", url, "--doc", str(doc)])
    train(url, tokenizer, out, stop_at=STEPS, redactions=redacted, resume=True, trainer=trainer)
    # the audit from the last checkpoint: the steps that trained on it, and the proof its bytes are gone
    detsampler(["stats", "--checkpoint", str(out / f"checkpoint-{STEPS}"), "--quiet"])
    return detsampler(["verify", "--checkpoint", str(out / f"checkpoint-{STEPS}"), "--quiet"])


if __name__ == "__main__":
    sys.exit(takedown(Path(sys.argv[1]), sys.argv[2], sys.argv[3]))

"""From a configuration to an opened index: load the corpus, load (or train) the tokenizer, build (or open) the index.

:class:`IndexConfig` is what the CLI's index options and a TOML ``[index]`` table map onto, one field per option.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from detsampler.checks import check_int, check_local_path, check_positive_int
from detsampler.index.build import build_index, build_key
from detsampler.index.format import default_cache_dir
from detsampler.index.reader import TokenIndex
from detsampler.storage import is_remote
from detsampler.text.chat import ChatConfig
from detsampler.text.corpus import DEFAULT_VOCAB_SIZE, default_corpus, default_tokenizer, load_corpus
from detsampler.text.load import load_tokenizer
from detsampler.text.policy import SpecialTokens
from detsampler.text.protocol import TokenizerLike

__all__ = ["IndexConfig", "Prepared", "prepare_index", "prepare_sources"]


@dataclass(frozen=True, kw_only=True)
class IndexConfig:
    """Where the documents come from, how they are tokenized, and where the index is cached.

    ``data``: None for the default corpus (the interpreter's standard library sources), else a local file, a directory
    of text/json/jsonl/parquet files, a ``save_to_disk`` directory, or a pre-tokenized source ``KIND:PATH``
    (:mod:`detsampler.index.sources`: ``megatron``, ``olmo``, ``datatrove``, ``nanogpt``; opened, never copied).
    ``tokenizer``: a sentencepiece ``.model``, a Hugging Face ``tokenizer.json`` or a local transformers tokenizer
    directory, or None to train a ``vocab_size``-piece BPE model on the corpus once (cached); a pre-tokenized source
    takes its EOS, pad id and vocabulary size from it when given. ``add_bos`` / ``add_eos``: the BOS/EOS policy
    (:class:`SpecialTokens`; ``add_eos`` None is ``"virtual"`` for text and ``"real"`` for a pre-tokenized source, whose
    stored tokens are read as they are). ``max_documents``: keep only the first N rows. ``cache_dir``: None for
    ``$DETSAMPLER_CACHE`` or ``./.cache/detsampler``. ``loss_policy``: chat or instruction data
    (:class:`~detsampler.text.chat.ChatConfig`): ``text_column`` then holds each example's messages, rendered with the
    tokenizer's chat template (``assistant``, ``last_turn``, ``all``), or with ``completion_column`` its prompt
    (``completion``, ``all``); a loss mask is stored beside the tokens. None: plain text.
    """

    data: str | None = None
    text_column: str = "text"
    tokenizer: str | None = None
    vocab_size: int = DEFAULT_VOCAB_SIZE
    cache_dir: str | None = None
    num_proc: int = 1
    store_tokens: bool = True
    max_documents: int | None = None
    add_bos: bool = False
    add_eos: str | None = None
    loss_policy: str | None = None
    completion_column: str | None = None

    def __post_init__(self) -> None:
        for name in ("data", "cache_dir"):  # file:// is the local path, everywhere (detsampler.storage.parse_location)
            value = getattr(self, name)
            if isinstance(value, str) and value[:7].lower() == "file://":
                object.__setattr__(self, name, check_local_path(value, name))
        _ = self.special_tokens  # validates add_bos / add_eos
        if self.completion_column is not None and self.loss_policy is None:
            raise ValueError("completion_column is for chat data: pass loss_policy too (completion or all)")
        _ = self.chat  # validates loss_policy / completion_column
        if self.data is not None and not str(self.data).strip():  # Path("") is the current directory: never that
            raise ValueError(f"data: got an empty path {self.data!r}; pass a file, a directory of files or KIND:PATH")
        if not isinstance(self.text_column, str) or not self.text_column:
            raise ValueError(f"text_column must be a non-empty string, got {self.text_column!r}")
        check_int(self.vocab_size, "vocab_size", minimum=300)
        check_positive_int(self.num_proc, "num_proc")
        if self.cache_dir is not None and (
            not isinstance(self.cache_dir, (str, Path)) or not str(self.cache_dir).strip()
        ):
            raise ValueError(f"cache_dir must be a directory path or None (the default cache), got {self.cache_dir!r}")
        if self.cache_dir is not None and "://" in str(self.cache_dir) and not _in_object_store(str(self.cache_dir)):
            raise ValueError(  # NOTE: else a local directory named "hf:" would be created and built into
                f"cache_dir {str(self.cache_dir)!r} is a URL of no supported object store: pass a local directory or "
                "an s3://, gs://, az:// or https:// prefix"
            )
        if self.cache_dir is not None and Path(self.cache_dir).exists() and not Path(self.cache_dir).is_dir():
            raise ValueError(f"cache_dir {str(self.cache_dir)!r} is a file, not a directory")
        if not isinstance(self.store_tokens, bool):
            raise ValueError(f"store_tokens must be a bool, got {self.store_tokens!r}")
        if self.max_documents is not None:
            check_positive_int(self.max_documents, "max_documents (or None)")

    @property
    def special_tokens(self) -> SpecialTokens:
        return SpecialTokens(add_bos=self.add_bos, add_eos=self.add_eos or "virtual")

    @property
    def chat(self) -> ChatConfig | None:
        """The chat configuration of ``loss_policy`` (None: plain text)."""
        if self.loss_policy is None:
            return None
        return ChatConfig(column=self.text_column, completion_column=self.completion_column, policy=self.loss_policy)

    @property
    def cache_path(self) -> Path:
        """The local cache: ``cache_dir``, or the default one (also when ``cache_dir`` is an object store URL: the
        tokenizer, the corpus parse and the build are staged there, and the built index is pushed to the URL)."""
        if self.cache_dir is None or _in_object_store(str(self.cache_dir)):
            return default_cache_dir()
        return Path(self.cache_dir)


@dataclass(frozen=True)
class Prepared:
    """The corpus, its tokenizer and its index, checked to belong together."""

    config: IndexConfig
    dataset: Any
    tokenizer: TokenizerLike | None
    index: TokenIndex  # or a pre-tokenized TokenSource (then dataset is None, and tokenizer None unless given)


def load_dataset_for(config: IndexConfig) -> Any:
    """The corpus of ``config`` (first ``max_documents`` rows when set)."""
    if config.data is None:
        ds = default_corpus(max_documents=config.max_documents)
    else:
        ds = load_corpus(config.data, config.text_column, cache_dir=config.cache_path)
        if config.max_documents is not None and config.max_documents < len(ds):
            ds = ds.select(range(config.max_documents))
    return ds


def _prepare_sharded(config: IndexConfig) -> Prepared:
    """A sharded index directory given as ``data`` (built by ``detsampler build --shard/--finalize``), opened as one
    index; there is no dataset (its shards hold the tokens). Its tokenizer is required and checked when any shard was
    tokenized by detsampler; optional (checked when given) when every shard is a pre-tokenized file (the manifest's
    entries record the EOS and pad ids they are read with)."""
    from detsampler.index.sharded import TOKENIZED_KIND, ShardedIndex

    if config.loss_policy is not None:
        raise ValueError(f"loss_policy: {config.data!r} is a sharded index, which holds no loss mask")
    index = ShardedIndex.open(config.data)
    tokenized = sum(entry["kind"] == TOKENIZED_KIND for entry in index.meta["shards"])
    if config.tokenizer is None and tokenized:
        raise ValueError(
            f"data {config.data!r} is a sharded index and {tokenized} of its {len(index.shards)} shards are tokenized: "
            "pass the tokenizer they were built with (--tokenizer)"
        )
    _check_as_built(config, index)
    tokenizer = None if config.tokenizer is None else load_tokenizer(config.tokenizer)
    if tokenizer is not None:
        index.check_tokenizer(tokenizer)
    return Prepared(config, None, tokenizer, index)


def _check_as_built(config: IndexConfig, index: Any) -> None:
    """Refuse an option of ``config`` that asks a built index given as ``data`` for another build (NOTE: they were
    dropped in silence: ``--max-documents 4`` read every document); what the index was built with is accepted."""
    special, chat = getattr(index, "special_tokens", None), getattr(index, "chat", None)
    wrong = []
    if config.max_documents is not None:
        wrong.append(("max_documents", config.max_documents, f"it holds its {index.num_documents} documents"))
    if not config.store_tokens:
        wrong.append(("store_tokens", False, "it stores its tokens"))
    if config.text_column != "text" and config.text_column != getattr(index, "text_column", "text"):
        wrong.append(("text_column", config.text_column, f"it was built from {getattr(index, 'text_column', '?')!r}"))
    if special is not None and config.add_bos and not special.add_bos:
        wrong.append(("add_bos", True, "it was built without a BOS"))
    if special is not None and config.add_eos is not None and config.add_eos != special.add_eos:
        wrong.append(("add_eos", config.add_eos, f"its EOS is {special.add_eos!r}"))
    for name, built in (("loss_policy", "policy"), ("completion_column", "completion_column")):
        value = getattr(config, name)
        if value is not None and (chat is None or getattr(chat, built) != value):
            why = (
                "it was built without a loss policy" if chat is None else f"it was built with {getattr(chat, built)!r}"
            )
            wrong.append((name, value, why))
    if wrong:
        flag = {"store_tokens": "--no-store-tokens"}
        said = "; ".join(
            f"{name} {value!r} ({flag.get(name, '--' + name.replace('_', '-'))}): {why}" for name, value, why in wrong
        )
        raise ValueError(
            f"data {config.data!r} is a built index, read as it was built: {said}; drop the option, or build an index"
            " with it"
        )


def _in_object_store(data: str) -> bool:
    """Whether ``data`` is a URL of an object store (another scheme, ``hf://``, is refused by the corpus loader)."""
    try:
        return is_remote(data)
    except ValueError:
        return False


def _prepare_built(config: IndexConfig) -> Prepared:
    """A built index given as ``data``: in an object store (``s3://…/index-…``, uploaded by ``detsampler push``, read by
    ranged requests) or a local index directory (one holding ``meta.json``), opened as it is, as the one and the other;
    there is no dataset, so it must store its tokens. Its tokenizer is checked when given."""
    from detsampler.index.sharded import MANIFEST, open_index
    from detsampler.storage import as_path

    root = as_path(config.data)
    if not (root / "meta.json").is_file() and not (root / MANIFEST).is_file():
        raise ValueError(
            f"data {config.data!r} holds no index (no meta.json or {MANIFEST}): an index in an object store is read "
            "from where `detsampler push` uploaded it; a text corpus is read from a local path only (copy it, then "
            "build)"
        )
    index = open_index(config.data)
    if not getattr(index, "store_tokens", True):
        raise ValueError(
            f"data {config.data!r} is an index that stores no tokens (built with --no-store-tokens): opened as data it "
            "has no dataset to tokenize; build it with stored tokens"
            + (" and push it again" if _in_object_store(config.data) else "")
        )
    _check_as_built(config, index)
    tokenizer = None if config.tokenizer is None else load_tokenizer(config.tokenizer)
    if tokenizer is not None:
        index.check_tokenizer(tokenizer)
    return Prepared(config, None, tokenizer, index)


def open_prepared_source(config: IndexConfig) -> Prepared:
    """The pre-tokenized source ``config.data`` (``KIND:PATH``) opened, with ``config.tokenizer`` when given."""
    from detsampler.index.sources import no_tokenizer, open_source, parse_source_spec

    kind, path = parse_source_spec(str(config.data))
    if config.loss_policy is not None:  # NOTE: it would be ignored: every token trained
        raise ValueError(
            f"loss_policy: the pre-tokenized source {config.data!r} is read as stored, not rendered from chat rows;"
            " open its own mask with detsampler.index.sources.open_source(..., loss_mask=PATH)"
        )
    if config.tokenizer is None:
        raise no_tokenizer(kind, path)
    if config.add_bos:
        raise ValueError(f"add_bos: the pre-tokenized source {config.data!r} is read as stored; it cannot insert a BOS")
    tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer is not None else None
    source = open_source(kind, path, tokenizer=tokenizer, eos="virtual" if config.add_eos == "virtual" else "real")
    return Prepared(config, None, tokenizer, source)


def prepare_index(config: IndexConfig, progress: bool = True) -> Prepared:
    """Load the corpus and tokenizer of ``config`` and build (or open the cached) index; open a pre-tokenized source, or
    a sharded index directory, as it is.

    Args:
        config: where the documents are, the tokenizer, the BOS/EOS policy and the cache.
        progress: show progress bars and a summary line on stderr while building.

    Returns:
        The :class:`Prepared` dataset (None for a pre-tokenized source or a sharded index), tokenizer and index,
        the index checked against both.
    """
    from detsampler.index.sharded import MANIFEST
    from detsampler.index.sources import is_source_spec

    if is_source_spec(config.data):
        return open_prepared_source(config)
    if config.data is not None and (_in_object_store(config.data) or (Path(config.data) / "meta.json").is_file()):
        return _prepare_built(config)
    if config.data is not None and (Path(config.data) / MANIFEST).is_file():
        return _prepare_sharded(config)
    dataset = load_dataset_for(config)
    if config.tokenizer is not None:
        tokenizer = load_tokenizer(config.tokenizer)
    else:
        tokenizer = default_tokenizer(
            config.cache_path,
            vocab_size=config.vocab_size,
            corpus=dataset if config.data is not None else None,
            text_column=config.text_column,
        )
    if config.cache_dir is not None and _in_object_store(str(config.cache_dir)):
        return Prepared(config, dataset, tokenizer, _index_in_bucket(config, dataset, tokenizer, progress))
    return Prepared(config, dataset, tokenizer, _build_local(config, dataset, tokenizer, progress))


def _build_local(config: IndexConfig, dataset: Any, tokenizer: TokenizerLike, progress: bool) -> TokenIndex:
    """The index of ``dataset`` in the local cache ``config.cache_path``: opened when built before, else built."""
    return build_index(
        dataset,
        tokenizer,
        text_column=config.text_column,
        cache_dir=config.cache_path,
        num_proc=config.num_proc,
        store_tokens=config.store_tokens,
        progress=progress,
        special_tokens=config.special_tokens,
        chat=config.chat,
    )


def _index_in_bucket(config: IndexConfig, dataset: Any, tokenizer: TokenizerLike, progress: bool) -> TokenIndex:
    """The index of ``dataset`` in the object store ``config.cache_dir`` (``URL/index-<key>``, the key as on disk):
    opened there when it was pushed before, else built in the local cache and pushed (``meta.json`` last), then opened
    from the bucket; checked against the dataset and the tokenizer either way."""
    from detsampler.index.push import push_index
    from detsampler.storage import as_path, join

    key = build_key(dataset, tokenizer, config.text_column, config.store_tokens, config.special_tokens, config.chat)
    url = join(str(config.cache_dir), f"index-{key}")
    if not (as_path(url) / "meta.json").is_file():
        push_index(_build_local(config, dataset, tokenizer, progress).path, url)
    return TokenIndex.open(url, dataset=dataset, tokenizer=tokenizer)


def prepare_sources(base: IndexConfig, sources: Sequence[str], progress: bool = True) -> list[Prepared]:
    """One prepared index per mixture source (``base`` with ``data`` set to each source), all with one tokenizer.

    Invariant: every source is tokenized by the same model: ``base.tokenizer``, or else the default one trained once on
    the standard library (never a model trained per source, which would make token ids incomparable across sources).

    Args:
        base: the index options shared by every source.
        sources: one ``data`` value per source (a local corpus, or ``KIND:PATH`` of a pre-tokenized one).
        progress: as for :func:`prepare_index`.

    Returns:
        One :class:`Prepared` per source, in the order of ``sources``.
    """
    tokenizer = base.tokenizer or str(default_tokenizer(base.cache_path, vocab_size=base.vocab_size).path)
    configs = [replace(base, data=src, tokenizer=str(tokenizer)) for src in sources]
    if len(configs) > 1 and all(_opened_as_it_is(c.data) for c in configs):
        # NOTE: opening reads nothing but a few small files per source, and in a bucket each read is a round trip:
        # the sources' requests go out together (a build, which takes a lock and the cores, stays one at a time)
        with ThreadPoolExecutor(min(len(configs), _OPEN_THREADS), thread_name_prefix="detsampler-open") as pool:
            return list(pool.map(lambda c: prepare_index(c, progress=progress), configs))
    return [prepare_index(c, progress=progress) for c in configs]


_OPEN_THREADS = 8  # sources opened at once


def _opened_as_it_is(data: Any) -> bool:
    """Whether ``data`` is opened, never built: a pre-tokenized source (``KIND:PATH``) or an index in a bucket."""
    from detsampler.index.sources import is_source_spec

    return is_source_spec(data) or (data is not None and _in_object_store(data))

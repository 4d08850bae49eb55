"""Pushing a sharded index to moto's S3 (issue 31's leftovers): every shard's files checked as they are uploaded, a push
of another sharded index to a prefix held by one refused before any of its objects is written (as for one index), and
the line says what went where."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from detsampler.cli import main
from detsampler.index import TokenIndexError
from detsampler.index.push import CLAIM, push
from detsampler.index.sharded import ShardedIndex, shard_location
from detsampler.storage import RemotePath, store_for


def _sharded(tmp_path: Path, name: str, texts: list[str], tokenizer) -> ShardedIndex:
    """A sharded index of three jsonl files of ``texts`` (split 3 ways), built in its own cache ``tmp_path/name``."""
    data = tmp_path / f"{name}-data"
    data.mkdir()
    for j in range(3):
        (data / f"part-{j}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[j::3]))
    cache = tmp_path / name
    args = ["build", "--sharded", "--data", str(data), "--tokenizer", tokenizer.path, "--cache-dir", str(cache)]
    assert main([*args, "--quiet"]) == 0
    (root,) = cache.glob("sharded-*")
    return ShardedIndex.open(root)


def _shard_urls(index: ShardedIndex, url: str) -> list[str]:
    return [str(shard_location(RemotePath(url), e["path"])) for e in index.meta["shards"]]


@pytest.fixture()
def two(tmp_path, small_corpus, small_tokenizer) -> tuple[ShardedIndex, ShardedIndex]:
    """Two different sharded indexes: B's files are A's with one document more in its file 2 (shards 0 and 1 shared)."""
    texts = list(small_corpus["text"])
    a = _sharded(tmp_path, "a", texts, small_tokenizer)
    b = _sharded(tmp_path, "b", [*texts[:-1], "one more document, in b only", texts[-1]], small_tokenizer)
    assert a.fingerprint != b.fingerprint
    return a, b


def test_a_push_of_another_sharded_index_to_a_held_prefix_writes_none_of_its_shards(two, s3_bucket, capsys):
    """A pushed to URL, then B to the same URL: B's shards were uploaded first (into the bucket's `shards/`) and only
    its manifest was refused, leaving B's own shards there; now the prefix is checked and claimed before any shard is
    written, as a single index's push claims its prefix before writing any object."""
    a, b = two
    store = store_for(s3_bucket)
    url = f"{s3_bucket}/held/sharded"
    assert main(["push", str(a.path), url]) == 0
    only_b = [u for u in _shard_urls(b, url) if u not in _shard_urls(a, url)]
    assert only_b  # the shards of the files B changed
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["push", str(b.path), url])
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and captured.out == "" and "already holds a different sealed record" in captured.err
    assert store.list(only_b[0]) == []  # nothing of B was written
    assert ShardedIndex.open(url).fingerprint == a.fingerprint


def test_racing_pushes_of_two_sharded_indexes_one_wins_and_the_loser_writes_nothing(two, s3_bucket):
    """A and B pushed at once to one fresh URL: exactly one succeeds; the other is refused at the claim, before any of
    its shards is written; the prefix opens as the winner."""
    a, b = two
    url = f"{s3_bucket}/race/sharded"
    results: dict[str, object] = {}
    barrier = threading.Barrier(2)

    def run(name: str, index: ShardedIndex) -> None:
        barrier.wait()
        try:
            results[name] = push(index.path, url)
        except TokenIndexError as exc:
            results[name] = exc

    threads = [threading.Thread(target=run, args=(n, i)) for n, i in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lost = [n for n, r in results.items() if isinstance(r, TokenIndexError)]
    assert len(lost) == 1, results
    winner, loser = (b, a) if lost == ["a"] else (a, b)
    assert ShardedIndex.open(url).fingerprint == winner.fingerprint
    only_loser = [u for u in _shard_urls(loser, url) if u not in _shard_urls(winner, url)]
    assert only_loser and all(store_for(s3_bucket).list(u) == [] for u in only_loser)


def test_a_damaged_shard_is_refused_and_its_claim_released_then_the_line_says_what_went_where(two, s3_bucket, capsys):
    """A byte flipped in shard 1's tokens.npy: refused naming the file, no manifest, the prefix's claim released (the
    claim used to be left by nothing: now taken first, it is removed); once repaired, the push's line names the shards
    and where they went (it said `pushed N objects to URL`, the shards being outside URL)."""
    a, _ = two
    store = store_for(s3_bucket)
    url = f"{s3_bucket}/damaged/sharded"
    tokens = Path(a.shards[1].path) / "tokens.npy"
    raw = bytearray(tokens.read_bytes())
    raw[-1] ^= 1
    tokens.write_bytes(bytes(raw))
    with pytest.raises(SystemExit) as exit_:
        main(["push", str(a.path), url])
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and "tokens.npy" in captured.err and "fails its checksum" in captured.err
    assert store.list(url) == []  # no manifest, no claim left on the prefix
    raw[-1] ^= 1
    tokens.write_bytes(bytes(raw))
    assert main(["push", str(a.path), url]) == 0
    line = capsys.readouterr().out.strip()
    parent = _shard_urls(a, url)[0].rsplit("/", 1)[0]
    assert line.startswith(f"pushed 3 shard indexes to {parent}/ (each sealed by its meta.json, every file")
    assert f"to {url}, manifest.json last" in line
    assert f"{url}/{CLAIM}" in store.list(url)

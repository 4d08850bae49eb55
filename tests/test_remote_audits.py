"""Issue 31: what the audits and pushes of object storage say is what they did (moto's real S3 server on loopback).

- ``verify --tokens`` / ``build --verify-tokens`` of an index in a bucket read every block of every object, check each
  chunk and each object's sha256 (streamed, bounded memory), and no path prints "verified" for a check that did not run;
- two pushes racing to one prefix: exactly one succeeds, the other is refused naming the prefix, and the prefix opens as
  the winner's index (create-only writes where the store has them; read back and said so where it does not).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from detsampler.cli import main
from detsampler.index import TokenIndex, build_index
from detsampler.index.checksums import CHUNK_BYTES, ChecksumError
from detsampler.index.format import TokenIndexError
from detsampler.index.push import push_index
from detsampler.storage import DEFAULT_BLOCK_BYTES, store_for
from tests.more_servers import precondition_dropping_proxy
from tests.s3_server import create_bucket, moto_server


@pytest.fixture(scope="module")
def two_block_index(small_corpus, small_tokenizer, tmp_path_factory) -> TokenIndex:
    """An index whose ``tokens.npy`` spans two 1 MiB blocks: an edit past the first block is not met on open."""
    from datasets import Dataset

    corpus = Dataset.from_dict({"text": [t + f"\n# copy {k}\n" for k in range(3) for t in small_corpus["text"]]})
    index = build_index(corpus, small_tokenizer, cache_dir=tmp_path_factory.mktemp("two-blocks"), progress=False)
    assert (index.path / "tokens.npy").stat().st_size > DEFAULT_BLOCK_BYTES + CHUNK_BYTES
    return index


def _tampered(index: TokenIndex, url: str) -> int:
    """Push ``index`` to ``url``, flip one bit of its ``tokens.npy`` object in the last chunk; returns the chunk."""
    push_index(index.path, url)
    raw = bytearray((index.path / "tokens.npy").read_bytes())
    raw[-10] ^= 1
    store_for(url).put(f"{url}/tokens.npy", bytes(raw))
    return (len(raw) - 10) // CHUNK_BYTES


def _plan(tokenizer) -> list[str]:
    return ["--tokenizer", str(tokenizer.path), "--seq-len", "64", "--global-batch-size", "4", "--steps", "0:2"]


def test_verify_tokens_of_an_index_in_a_bucket_reads_every_block(two_block_index, small_tokenizer, s3_bucket, capsys):
    url = f"{s3_bucket}/audit/{two_block_index.path.name}"
    push_index(two_block_index.path, url)
    assert main(["verify", "--data", url, *_plan(small_tokenizer), "--tokens"]) == 0
    captured = capsys.readouterr()
    n = two_block_index.num_tokens
    assert f"index files: every chunk checksum and sha256 verified ({n} tokens)" in captured.out
    size = (two_block_index.path / "tokens.npy").stat().st_size
    assert f"verify: reading {url}/tokens.npy in full ({size:,} bytes)" in captured.err


def test_verify_tokens_of_a_tampered_index_in_a_bucket_is_refused(two_block_index, small_tokenizer, s3_bucket, capsys):
    """Before issue 31 this printed "every chunk checksum and sha256 verified" and exited 0: nothing was read."""
    url = f"{s3_bucket}/audit-tampered/{two_block_index.path.name}"
    chunk = _tampered(two_block_index, url)
    index = TokenIndex.open(url)  # opening reads the first block only: the edit is not met
    assert index.tokens._array.source.fetched_bytes <= DEFAULT_BLOCK_BYTES
    for argv in (
        ["verify", "--data", url, *_plan(small_tokenizer), "--tokens"],
        ["build", "--data", url, "--tokenizer", str(small_tokenizer.path), "--verify-tokens"],
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        captured = capsys.readouterr()
        assert exit_.value.code == 2 and "verified" not in captured.out, argv
        assert f"tokens.npy chunk {chunk} (bytes {chunk * CHUNK_BYTES}.." in captured.err
        assert "fails its checksum" in captured.err and captured.err.count("detsampler: error:") == 1
    with pytest.raises(ChecksumError, match=f"tokens.npy chunk {chunk} "):
        index.tokens.verify_all()  # the array's own full check reads the blocks (it only marked them before)


def test_a_full_check_of_a_remote_array_streams_its_blocks_and_hashes_them_once(two_block_index, s3_bucket):
    url = f"{s3_bucket}/audit-stream/{two_block_index.path.name}"
    push_index(two_block_index.path, url)
    tokens = TokenIndex.open(url).tokens
    source = tokens._array.source
    before = source.fetched_bytes
    tokens.verify_all()
    size = (two_block_index.path / "tokens.npy").stat().st_size
    assert tokens.verified == -(-size // CHUNK_BYTES)  # every chunk
    assert tokens.sha256() == two_block_index.meta["files"]["tokens.npy"]["sha256"]  # no second read
    assert len(source._recent) <= 8 and source.fetched_bytes == before  # its own blocks untouched: read beside them


def test_verify_tokens_of_a_pre_tokenized_source_says_nothing_was_verified(tmp_path, small_tokenizer, capsys):
    """Before: "every chunk checksum and sha256 verified (0 tokens); 1 pre-tokenized file(s) record no checksum"."""
    path = tmp_path / "train.bin"
    np.array([11, 12, 2, 13, 2] * 40, dtype=np.uint16).tofile(path)
    argv = ["--data", f"nanogpt:{path}", "--cache-dir", str(tmp_path / "cache")]
    assert main(["verify", *argv, *_plan(small_tokenizer), "--tokens"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("index files: nothing verified: 1 pre-tokenized file(s) record no checksum\n")


# -- two pushes racing to one prefix ----------------------------------------------------------------------------------


def _race(directories: list, url: str) -> tuple[list, list]:
    """Push each of ``directories`` to ``url`` from its own thread, all released at once by a barrier; returns (the
    directories whose push returned, the errors of the others)."""
    import threading

    barrier = threading.Barrier(len(directories))
    won, lost, threads = [], [], []

    def push(directory) -> None:
        barrier.wait()
        try:
            push_index(directory, url)
            won.append(directory)
        except Exception as exc:  # collected and checked by the caller
            lost.append(exc)

    for directory in directories:
        threads.append(threading.Thread(target=push, args=(directory,)))
        threads[-1].start()
    for thread in threads:
        thread.join()
    return won, lost


@pytest.fixture(scope="module")
def rivals(tmp_path_factory) -> list[TokenIndex]:
    """Two different lengths-only indexes (4.8 MB of lengths each) to push to one prefix."""
    from detsampler.index.synthetic import synthetic_index

    root = tmp_path_factory.mktemp("rivals")
    return [synthetic_index(root / name, 1_200_000 + k, mean_length=300) for k, name in enumerate("ab")]


def test_two_pushes_racing_to_one_prefix_one_wins_the_other_is_refused(rivals, s3_bucket):
    """Before issue 31 both pushes returned (both CLIs printed "pushed ..."), and the prefix held one meta.json over the
    objects of both."""
    for attempt in range(3):
        url = f"{s3_bucket}/race-{attempt}/index"
        won, lost = _race([index.path for index in rivals], url)
        assert len(won) == 1 and len(lost) == 1, (won, lost)
        assert isinstance(lost[0], TokenIndexError) and url in str(lost[0]) and "\n" not in str(lost[0])
        assert "another push" in str(lost[0])
        assert push_index(won[0], url).exclusive  # moto enforces If-None-Match
        winner = next(index for index in rivals if index.path == won[0])
        assert TokenIndex.open(url, verify_tokens=True).fingerprint == winner.fingerprint


def _opens_as_or_is_refused(url: str, winner: TokenIndex) -> None:
    """Without create-only writes a loser's PUT still in flight may land after the winner returned: the prefix then
    opens (every chunk and sha256 checked) as the winner's index, or is refused when opened; never read as a mix."""
    try:
        opened = TokenIndex.open(url, verify_tokens=True)
    except (TokenIndexError, ChecksumError):
        return
    assert opened.fingerprint == winner.fingerprint


def test_without_create_only_writes_racing_pushes_never_both_succeed_and_the_push_says_so(
    rivals, monkeypatch, caplog, capsys
):
    """S3 with conditional puts disabled (``AWS_CONDITIONAL_PUT=disabled``, as for a store that has none): the claim
    (before each object too), the ETags and the seal are read back; a race is detected (both may be refused), never two
    successes."""
    monkeypatch.setenv("AWS_CONDITIONAL_PUT", "disabled")
    with moto_server() as (endpoint, _server):
        bucket = create_bucket(endpoint, "no-create-only")
        for attempt in range(3):
            url = f"{bucket}/race-{attempt}/index"
            won, lost = _race([index.path for index in rivals], url)
            assert len(won) <= 1 and len(won) + len(lost) == 2, (won, lost)
            for exc in lost:
                assert isinstance(exc, TokenIndexError) and url in str(exc) and "\n" not in str(exc), exc
            if won:
                _opens_as_or_is_refused(url, next(index for index in rivals if index.path == won[0]))
        assert "the store does not enforce create-only writes" in caplog.text
        capsys.readouterr()
        assert main(["push", str(rivals[0].path), f"{bucket}/alone/index"]) == 0
        line = capsys.readouterr().out.rstrip()
        assert line.endswith(
            "meta.json last; the store does not enforce create-only writes: the claim, the objects' ETags and the"
            " seal were read back, so a concurrent push to this prefix is detected, not excluded"
        )


def test_a_store_that_ignores_the_create_only_precondition_is_found_out(rivals, monkeypatch, caplog):
    """An S3-compatible store that ignores ``If-None-Match`` (a real proxy to moto that drops it): the second create of
    the claim succeeds where it must be refused, so the push reads back as without create-only writes."""
    with moto_server() as (endpoint, _server), precondition_dropping_proxy(endpoint) as proxy:
        bucket = create_bucket(endpoint, "ignores-preconditions")
        with monkeypatch.context() as env:  # undone before the server's own environment is restored
            env.setenv("AWS_ENDPOINT_URL", proxy)
            assert not push_index(rivals[0].path, f"{bucket}/alone/index").exclusive
            assert "the store does not enforce create-only writes" in caplog.text
            for attempt in range(3):
                url = f"{bucket}/race-{attempt}/index"
                won, lost = _race([index.path for index in rivals], url)
                assert len(won) <= 1 and len(won) + len(lost) == 2, (won, lost)
                assert all(isinstance(e, TokenIndexError) and f"push to {url} refused" in str(e) for e in lost), lost
                if won:
                    _opens_as_or_is_refused(url, next(index for index in rivals if index.path == won[0]))


# -- file:// is the local path everywhere; a built index given as --data opens as that index ---------------------------


def test_a_built_index_opens_as_data_from_a_bucket_a_local_directory_and_a_file_url(
    small_index, small_tokenizer, s3_bucket, tmp_path, capsys
):
    """Before issue 31 the bucket URL opened, the local directory was read as a corpus and refused ("holds 6 file(s) of
    no readable kind"), and ``file://`` was refused as remote storage, which the storage layer calls local."""
    import shutil

    local = tmp_path / "copy" / small_index.path.name
    shutil.copytree(small_index.path, local, ignore=shutil.ignore_patterns("layouts", "*.lock"))
    url = f"{s3_bucket}/as-data/{local.name}"
    push_index(f"file://{local}", url)  # push reads a file:// directory too
    plan = ["--tokenizer", str(small_tokenizer.path), "--kind", "document", "--seq-len", "64"]
    plan += ["--global-batch-size", "8", "--micro-batch-size", "2", "--step", "3"]
    shown = {}
    for data in (url, str(local), f"file://{local}"):
        assert main(["show", "--data", data, *plan]) == 0, data
        shown[data] = capsys.readouterr().out
    assert shown[url] == shown[str(local)] == shown[f"file://{local}"] and "doc " in shown[url]
    assert main(["build", "--data", f"file://{local}", "--tokenizer", str(small_tokenizer.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fingerprint"] == small_index.fingerprint


def test_file_urls_are_local_paths_for_cache_dirs_and_pre_tokenized_sources(small_tokenizer, tmp_path, capsys):
    from detsampler.index.sources import open_source

    path = tmp_path / "train.bin"
    np.array([11, 12, 50256, 13, 50256] * 40, dtype=np.uint16).tofile(path)
    assert open_source("nanogpt", f"file://{path}").fingerprint == open_source("nanogpt", path).fingerprint
    args = ["build", "--max-documents", "4", "--tokenizer", str(small_tokenizer.path)]
    assert main([*args, "--cache-dir", f"file://{tmp_path}/cache", "--json"]) == 0
    built = json.loads(capsys.readouterr().out)["path"]
    assert built.startswith(f"{tmp_path}/cache/index-") and (tmp_path / "cache").is_dir()
    assert not (tmp_path / "file:").exists() and not list(tmp_path.glob("**/file:"))


def test_build_prints_the_summary_of_a_built_index_given_without_its_tokenizer(
    small_index, small_tokenizer, s3_bucket, capsys
):
    """Issue 31 (re-run): `build --data INDEX` (a directory or its bucket URL) without --tokenizer ended in `detsampler:
    error: expected str, bytes or os.PathLike object, not NoneType` (exit 2), its --json form printed: the summary's
    tokenizer row read the path of a tokenizer not loaded. It names the tokenizer the index records."""
    url = f"{s3_bucket}/summary/{small_index.path.name}"
    push_index(small_index.path, url)
    recorded = small_index.meta["tokenizer"]

    def rows(out: str) -> dict[str, str]:  # print_rows: the key padded to the longest ("dataset fingerprint")
        return {line[:19].strip(): line[21:] for line in out.splitlines()}

    for data in (str(small_index.path), url):
        assert main(["build", "--data", data, "--quiet"]) == 0, data
        summary = rows(capsys.readouterr().out)
        assert summary["tokenizer"] == (
            f"{recorded['path']} (recorded by the index, not loaded: --tokenizer checks it) (sha256"
            f" {recorded['sha256'][:16]}..., vocab {recorded['vocab_size']}, eos {recorded['eos_id']}, pad"
            f" {recorded['pad_id']})"
        )
        assert summary["index fingerprint"] == small_index.fingerprint
        assert main(["build", "--data", data, "--tokenizer", str(small_tokenizer.path), "--quiet"]) == 0
        given = rows(capsys.readouterr().out)
        assert given["tokenizer"].startswith(f"{small_tokenizer.path} (sha256 {recorded['sha256'][:16]}...")
        assert {k: v for k, v in given.items() if k != "tokenizer"} == {
            k: v for k, v in summary.items() if k != "tokenizer"
        }


@pytest.mark.parametrize(
    ("option", "field", "said"),
    [
        (["--max-documents", "4"], {"max_documents": 4}, "max_documents 4 (--max-documents)"),
        (["--no-store-tokens"], {"store_tokens": False}, "store_tokens False (--no-store-tokens)"),
        (["--add-bos"], {"add_bos": True}, "add_bos True (--add-bos)"),
        (["--add-eos", "real"], {"add_eos": "real"}, "add_eos 'real' (--add-eos)"),
        (["--text-column", "content"], {"text_column": "content"}, "text_column 'content' (--text-column)"),
        (["--loss-policy", "all"], {"loss_policy": "all"}, "loss_policy 'all' (--loss-policy)"),
    ],
)
def test_an_option_that_shapes_a_build_is_refused_with_a_built_index_as_data(
    small_index, small_tokenizer, s3_bucket, capsys, option, field, said
):
    """Issue 31 (re-run): `show --data INDEX --max-documents 4` showed the index's 16 documents (the option was dropped
    in silence), and so were --no-store-tokens, --add-bos, --add-eos, --text-column and --loss-policy: an index opened
    as data is read as it was built. An option that asks for another build is refused, naming it and the index's own."""
    from dataclasses import replace

    from detsampler.index.prepare import IndexConfig, prepare_index

    url = f"{s3_bucket}/shaped/{small_index.path.name}"
    push_index(small_index.path, url)
    plan = ["--tokenizer", str(small_tokenizer.path), "--seq-len", "64", "--step", "0", "--quiet"]
    for data in (str(small_index.path), url):
        with pytest.raises(SystemExit) as exit_:
            main(["show", "--data", data, *plan, *option])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"detsampler: error: data {data!r} is a built index, read as it was built: {said}")
        with pytest.raises(ValueError, match=re.escape(f"is a built index, read as it was built: {said}")):
            prepare_index(replace(IndexConfig(data=data), **field))
    # what the index was built with is accepted as given (it changes nothing)
    recorded = ["--text-column", "text", "--add-eos", "virtual", "--no-add-bos", "--store-tokens"]
    assert main(["show", "--data", url, *plan, *recorded]) == 0 and "doc " in capsys.readouterr().out


def test_a_push_of_a_file_of_an_index_names_the_directory_to_give(small_index, s3_bucket):
    """Issue 31 (re-run): `push INDEX/meta.json URL` said `'INDEX/meta.json' holds no index (no meta.json)`."""
    from detsampler.index.push import push

    for given in (small_index.path / "meta.json", small_index.path / "tokens.npy"):
        said = f"{str(given)!r} is a file: push takes the index directory that holds it ({str(small_index.path)!r})"
        for call in (push, push_index):
            with pytest.raises(TokenIndexError, match=re.escape(said)):
                call(given, f"{s3_bucket}/file-given")


# -- a push checks every chunk it uploads, as it reads it --------------------------------------------------------------


def _flip(path, at: int) -> int:
    """Flip one bit of the byte at ``at`` (negative: from the end) of ``path``; returns its chunk."""
    raw = bytearray(path.read_bytes())
    raw[at] ^= 1
    path.write_bytes(bytes(raw))
    return (at % len(raw)) // CHUNK_BYTES


def test_a_push_refuses_a_file_that_fails_its_checksums_and_leaves_nothing_that_opens(
    small_index, s3_bucket, tmp_path, capsys
):
    """Issue 31 (re-review): a byte flipped near the end of a local layout's ``ends.npy`` was pushed and the push said
    success; `TokenIndex.open(url).layout(cfg)` was then refused with a ChecksumError. `push_index` opened the index
    only: no layout's checksums, and no chunk of ``tokens.npy``, were read. Each chunk uploaded is now checked as it is
    read for the upload, and a push refuses naming the file and the chunk before any seal is written."""
    from detsampler.layout import LayoutConfig
    from tests.index_copies import copy_with_layouts

    config = LayoutConfig(kind="concat", seq_len=64)
    cases = {
        "ends": lambda d: next((d / "layouts").glob("concat-L64-*")) / "ends.npy",
        "tokens": lambda d: d / "tokens.npy",
    }
    for case, file_of in cases.items():
        copy = copy_with_layouts(small_index, tmp_path / case, [config])
        path = file_of(copy.path)
        chunk = _flip(path, -3)
        size = path.stat().st_size
        rel = path.relative_to(copy.path)
        said = f"{rel} chunk {chunk} (bytes {chunk * CHUNK_BYTES}..{min(size, (chunk + 1) * CHUNK_BYTES) - 1})"
        url = f"{s3_bucket}/damaged-{case}/{copy.path.name}"
        with pytest.raises(ChecksumError, match=re.escape(said)) as refused:
            push_index(copy.path, url)
        assert f"push to {url} refused" in str(refused.value) and "\n" not in str(refused.value)
        assert not store_for(url).exists(f"{url}/meta.json")  # nothing that opens
        assert not any(u.endswith("layout.json") for u in store_for(url).list(url))
        assert not store_for(url).exists(f"{url}/{rel}")  # the damaged bytes were never uploaded
        assert not store_for(url).exists(f"{url}/push-claim.json")  # released: an index built again can be pushed
        with pytest.raises(SystemExit) as exit_:
            main(["push", str(copy.path), f"{url}-cli"])
        captured = capsys.readouterr()
        assert exit_.value.code == 2 and captured.out == "" and said in captured.err
        assert captured.err.count("detsampler: error:") == 1


def test_a_push_refuses_an_edited_checksum_file_or_layout_record(small_index, s3_bucket, tmp_path):
    from detsampler.layout import LayoutConfig
    from tests.index_copies import copy_with_layouts

    config = LayoutConfig(kind="concat", seq_len=64)
    for case, name, said in (
        ("sums", "ends.sums.npy", "ends.sums.npy differs from the one recorded"),
        ("record", "layout.json", "layout.json fails its seal"),
    ):
        copy = copy_with_layouts(small_index, tmp_path / case, [config])
        path = next((copy.path / "layouts").glob("concat-L64-*")) / name
        if name == "layout.json":
            path.write_text(path.read_text().replace('"num_samples": ', '"num_samples": 1'))
        else:
            _flip(path, -1)
        url = f"{s3_bucket}/edited-{case}/{copy.path.name}"
        with pytest.raises(TokenIndexError, match=re.escape(said)):
            push_index(copy.path, url)
        assert not store_for(url).exists(f"{url}/meta.json")


def test_a_re_push_of_a_damaged_copy_leaves_the_pushed_index_as_it_was(s3_bucket, tmp_path):
    """A file over the multipart threshold (5 MiB) damaged in its last chunk, pushed over a good push of the same
    index: the upload is aborted, so the object in the bucket is still the good one and the prefix opens and
    verifies."""
    import shutil

    from detsampler.index.synthetic import synthetic_index

    good = synthetic_index(tmp_path / "good", 1_600_000, mean_length=300)
    url = f"{s3_bucket}/re-push/{good.path.name}"
    push_index(good.path, url)
    damaged = tmp_path / "damaged" / good.path.name
    shutil.copytree(good.path, damaged)
    assert (damaged / "lengths.npy").stat().st_size > 5 * 2**20
    chunk = _flip(damaged / "lengths.npy", -2)
    with pytest.raises(ChecksumError, match=f"lengths.npy chunk {chunk} "):
        push_index(damaged, url)
    TokenIndex.open(url, verify_tokens=True)  # every chunk and sha256 of what is there: the good push's
    assert store_for(url).exists(f"{url}/push-claim.json")  # the sealed index's claim stays

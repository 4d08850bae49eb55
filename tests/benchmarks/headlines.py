"""The README's benchmark table, row by row, read from the tables of docs/benchmarks.md's sections.

Each row is (what is measured, detsampler's figure, the contenders strongest first). A row is computed from a section's
markdown tables only (never from numbers kept elsewhere), so the README cannot disagree with docs/benchmarks.md. A
section whose tables are not the expected ones (a benchmark changed its report) gets a generic row: its title and its
verdicts, pointing at docs/benchmarks.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tests.benchmarks.report import Section, section_verdicts

__all__ = ["MdTable", "headline_rows", "parse_tables", "readme_table"]

Row = tuple[str, str, str]
_UNITS = {"µs": 1e-6, "ms": 1e-3, "s": 1.0, "h": 3600.0, "days": 86400.0, "B": 1.0, "kB": 1e3, "MB": 1e6, "GB": 1e9}


@dataclass(frozen=True)
class MdTable:
    """A markdown table of a section: its bold title line and its rows as column -> cell."""

    title: str
    columns: list[str]
    rows: list[dict[str, str]]

    def where(self, column: str, prefix: str) -> list[dict[str, str]]:
        return [r for r in self.rows if r[column].startswith(prefix)]


def parse_tables(markdown: str) -> list[MdTable]:
    """Every ``**title**`` followed by a markdown table in ``markdown``."""
    tables, lines = [], markdown.splitlines()
    for i, line in enumerate(lines):
        if not (line.startswith("**") and line.endswith("**")) or i + 3 >= len(lines):
            continue
        header, sep = lines[i + 2], lines[i + 3]
        if not (header.startswith("|") and sep.startswith("|---")):
            continue
        columns = [c.strip() for c in header.strip("|").split("|")]
        rows = []
        for row in lines[i + 4 :]:
            if not row.startswith("|"):
                break
            rows.append(dict(zip(columns, (c.strip() for c in row.strip().strip("|").split("|")), strict=False)))
        tables.append(MdTable(line.strip("*"), columns, rows))
    return tables


def _table(markdown: str, prefix: str) -> MdTable:
    found = [t for t in parse_tables(markdown) if t.title.startswith(prefix)]
    if not found:
        raise LookupError(f"no table titled {prefix!r}")
    return found[-1]


def value(cell: str) -> float:
    """The number a cell states: ``3.24e+07 tokens/s``, ``95 µs``, ``4.8 GB``, ``97%``; an extrapolation wins."""
    cell = cell.split("extrapolated:")[-1] if "extrapolated:" in cell else cell
    m = re.search(r"([\d.,]+(?:e[+-]?\d+)?)\s*(µs|ms|s|h|days|B|kB|MB|GB|%)?", cell)
    if not m:
        raise ValueError(f"no number in {cell!r}")
    return float(m[1].replace(",", "")) * _UNITS.get(m[2] or "", 1.0)


def _best_per(rows: list[dict[str, str]], by: str, col: str, higher: bool) -> list[dict[str, str]]:
    """For each distinct ``rows[by]``, its best row by ``col``; strongest first."""
    best: dict[str, dict[str, str]] = {}
    for r in rows:
        if r[col] in ("—", "") or (r[by] in best and (value(r[col]) > value(best[r[by]][col])) != higher):
            continue
        best[r[by]] = r
    return sorted(best.values(), key=lambda r: value(r[col]), reverse=higher)


def _listing(rows: list[dict[str, str]], fmt: Callable[[dict[str, str]], str]) -> str:
    return "; ".join(fmt(r) for r in rows) or "—"


def _short(cell: str) -> str:
    return cell.replace(" tokens/s", "").replace(" indices/s", "")


def _verdict(markdown: str, words: str) -> str:
    """ "met" when every verdict line of the section that mentions ``words`` is met."""
    found = [v for v in section_verdicts(markdown) if words in v]
    if not found:
        return "no verdict"
    return "met" if all(v.startswith("- **MET**") for v in found) else "**missed**"


def _resume(md: str) -> list[Row]:
    t = _table(md, "Resume at step 1e9")
    step0 = _table(md, "Resume at step 0").where("contender", "detsampler")[0]["time to first batch"]
    ours = t.where("contender", "detsampler")[0]
    peers = sorted((r for r in t.rows if r is not ours), key=lambda r: value(r["time to first batch"]))
    return [
        (
            "first batch after resuming at step 10⁹ (10⁸ samples per epoch; benchmark 1)",
            f"{ours['time to first batch']} ({step0} at step 0)",
            _listing(peers, lambda r: f"{r['contender']}: {r['time to first batch']} ({r['how']})"),
        )
    ]


def _memory(md: str) -> list[Row]:
    t = _table(md, "N = 1e+08")
    ours = t.where("contender", "detsampler")[0]
    top = _table(md, "N = 1e+12").where("contender", "detsampler")[0]
    peers = [r for r in t.rows if r is not ours]
    return [
        (
            "sampler start-up and memory at 10⁸ samples per epoch, 8 ranks (benchmark 2)",
            f"{ours['time to first index']}, {ours['RSS growth']} ({top['time to first index']}, {top['RSS growth']}"
            " at 10¹²)",
            _listing(peers, lambda r: f"{r['contender']}: {r['time to first index']}, {r['RSS growth']}"),
        )
    ]


def _floor(md: str) -> str:
    """What torch's DataLoader alone costs at 8 x 2,048 with no workers, and the share of the ceiling it leaves."""
    try:
        floors = _table(md, "torch's DataLoader alone").rows
    except LookupError:  # a section written before benchmark 3 timed the floor
        return ""
    zero = [r for r in floors if r["micro batch"] == "8 x 2,048" and r["num_workers"] == "0"]
    if not zero:
        return ""
    r = zero[0]
    return (
        f"; torch's DataLoader alone takes {r['list of index lists']} per batch, at most {r['/ ceiling']} of the"
        f" ceiling, where 70% allows {r['70% of the ceiling allows']}"
    )


def _loader(md: str) -> list[Row]:
    def per(t: MdTable, col: str) -> tuple[list, list]:
        best = _best_per(t.rows, "contender", col, higher=True)
        return [r for r in best if r["contender"].startswith("detsampler")], [
            r for r in best if not r["contender"].startswith("detsampler")
        ]

    def fmt(col: str) -> Callable[[dict[str, str]], str]:
        return lambda r: f"{r['contender']} ({r['num_workers']} workers): {_short(r[col])}"

    stored, onfly = _table(md, "Stored tokens: tokens/s"), _table(md, "Tokenized on the fly: tokens/s")
    copies = _table(md, "The ceiling").rows  # the loader rows are 8 x 2,048: the ceiling of that shape
    copies = [r for r in copies if r.get("micro batch", "8 x 2,048") == "8 x 2,048"]
    ceiling = _best_per(copies, "copy", "tokens/s", higher=True)
    ours_s, peers_s = per(stored, "tokens/s")
    ours_f, peers_f = per(onfly, "tokens/s")
    top = ceiling[0]

    def share(r: dict[str, str]) -> str:
        return f"{value(r['tokens/s']) / value(top['tokens/s']):.1%}"

    rows = [
        ("tokens/s into the training loop, stored tokens (8 x 2,048; benchmark 3)", _listing(ours_s, fmt("tokens/s")))
    ]
    rows[0] += (_listing(peers_s, fmt("tokens/s")),)
    rows.append(
        (
            f"the same against the ceiling ({top['copy']} from the memory map: {_short(top['tokens/s'])} tokens/s)",
            _listing(ours_s, lambda r: f"{r['contender']} {share(r)}")
            + f" (target 70%: {_verdict(md, 'of the ceiling')}{_floor(md)})",
            _listing(peers_s[:1] + ceiling[1:], lambda r: f"{r.get('contender') or r['copy']}: {share(r)}"),
        )
    )
    rows.append(
        (
            "tokens/s into the training loop, tokenized on the fly (benchmark 3)",
            _listing(ours_f, fmt("tokens/s")),
            _listing(peers_f, fmt("tokens/s")),
        )
    )
    rows.extend(_zero_workers(md))
    resume = _table(md, "Tokenized on the fly: time to the first batch")
    ours_r = resume.where("contender", "detsampler")
    peers_r = sorted((r for r in resume.rows if r not in ours_r), key=lambda r: value(r["time to first batch"]))
    rows.append(
        (
            "first batch after resuming on the fly (benchmark 3)",
            _listing(ours_r, lambda r: r["time to first batch"]),
            _listing(peers_r, lambda r: f"{r['contender']}: {r['time to first batch']}"),
        )
    )
    return rows


def _zero_workers(md: str) -> list[Row]:
    """Issue 35's comparison: get_batch with the four fields against the stored-token peers at num_workers=0, by CPU
    time (wall beside), at each micro batch shape; none for a section written before benchmark 3 had it."""
    try:
        t = _table(md, "Stored tokens, num_workers=0")
    except LookupError:
        return []
    out = []
    for shape in dict.fromkeys(r["micro batch"] for r in t.rows):
        rows = [r for r in t.rows if r["micro batch"] == shape and not r["tokens/s (CPU)"].startswith("failed")]
        ours = [r for r in rows if r["contender"].startswith("detsampler concat, get_batch")]
        theirs = sorted(
            (r for r in rows if not r["contender"].startswith("detsampler")),
            key=lambda r: value(r["tokens/s (CPU)"]),
            reverse=True,
        )

        def fmt(r: dict[str, str]) -> str:
            return f"{r['contender']}: {_short(r['tokens/s (CPU)'])} (wall {_short(r['tokens/s (wall)'])})"

        out.append(
            (
                f"get_batch with the four fields, num_workers=0, {shape}, tokens/s by CPU time (benchmark 3)",
                _listing(
                    ours,
                    lambda r: (
                        f"{_short(r['tokens/s (CPU)'])} = {r['/ strongest peer (CPU)']} the"
                        f" strongest peer (wall {r['/ strongest (wall)']})"
                    ),
                )
                + f" (target 2x: {_verdict(md, 'get_batch with the four fields')})",
                _listing(theirs, fmt),
            )
        )
    return out


def _sft_mask(md: str) -> list[Row]:
    t = _table(md, "PackedDataset.get_batch with and without the stored loss mask")
    return [
        (
            "the stored loss mask: get_batch with it / without it, 8 x 2,048 (benchmark 15)",
            _listing(t.rows, lambda r: f"{r['layout']}: {r['time with / without']}")
            + f" (target <= 1.1x: {_verdict(md, 'stored-mask loader')})",
            "no peer measured (TRL masks in its collator, after the read)",
        )
    ]


def _index(md: str) -> list[Row]:
    t = {r["quantity"]: r["value"] for r in _table(md, "Results").rows}
    build, raw = value(t["build_tokens_per_s"]), value(t["raw_encode_tokens_per_s"])
    return [
        (
            "index build, sentencepiece tokenizer (benchmark 4)",
            f"{build:.3g} tokens/s = {build / raw:.0%} of the encode (target 80%: {_verdict(md, 'build_index')})",
            f"sentencepiece batched encode alone ({t['num_proc']} threads): {raw:.3g} tokens/s",
        )
    ]


def _permutation(md: str) -> list[Row]:
    t = _table(md, "Throughput at N")
    n = re.search(r"N = ([\d,]+)", t.title)
    ours = t.where("contender", "detsampler permute, version 2")[0]
    peers = sorted((r for r in t.rows if r is not ours), key=lambda r: -value(r["indices/s"]))
    broken = sorted(
        {r["N"].split(" (")[1].rstrip(")") for r in _table(md, "Bijectivity").rows if r["result"].startswith("NOT")}
    )
    return [
        (
            f"keyed permutation, one core, N = {n[1] if n else '?'} (benchmark 5)",
            f"{_short(ours['indices/s'])} indices/s, O(1) memory, bijective",
            _listing(peers, lambda r: f"{r['contender']}: {_short(r['indices/s'])}")
            + (f"; Grain's shuffle not a bijection at N = {', '.join(broken)}" if broken else ""),
        )
    ]


def _trainer(md: str) -> list[Row]:
    rows = _table(md, "Tiny trainer").rows
    first = rows[0]
    return [
        (
            "tiny trainer, 2 CPU ranks: data wait per step (benchmark 6)",
            f"{first['data wait / step']} of a {first['step time']} step ({first['wait / step time']})",
            _listing(
                rows[1:],
                lambda r: (
                    f"num_workers={r['num_workers']}, prefetch {r['prefetch_batches']}: {r['data wait / step']}"
                    f" of {r['step time']}"
                ),
            ),
        )
    ]


def _scale(md: str) -> list[Row]:
    singles = [t for t in parse_tables(md) if t.title.startswith("One dataset")]
    t = max(singles, key=lambda t: value(t.title.split(":")[1]))
    size = re.search(r"([\d,]+) documents", t.title)[1]

    def fmt(r: dict[str, str]) -> str:
        return f"{r['contender']}: {r['cold: first batch']}, {r['RSS growth']}; {r['resume at step k']}"

    ours = t.where("contender", "detsampler")
    peers = sorted((r for r in t.rows if r not in ours), key=lambda r: value(r["cold: first batch"]))
    rows = [(f"{size} documents: cold first batch, RSS; resume at half an epoch (benchmark 7)",)]
    rows[0] += (_listing(ours, fmt), _listing(peers, fmt))
    mixes = [t for t in parse_tables(md) if t.title.startswith("Mixture of three sources")]
    if mixes:
        m = mixes[-1]
        ours_m = m.where("contender", "detsampler")
        peers_m = [r for r in m.rows if r not in ours_m]
        msize = re.search(r"([\d,]+) documents", m.title)[1]

        def fmt_m(r: dict[str, str]) -> str:
            return f"{fmt(r)}; {r['on disk']} on disk"

        rows.append(
            (
                f"mixture of three sources, {msize} documents (same columns)",
                _listing(ours_m, fmt_m),
                _listing(peers_m, fmt_m),
            )
        )
    return rows


def _hf_build(md: str) -> list[Row]:
    t = [x for x in parse_tables(md) if " tokens of " in x.title][-1].rows
    ours = next(r for r in t if r["contender"].startswith("detsampler"))
    peers = sorted((r for r in t if r is not ours), key=lambda r: -value(r["tokens/s"]))
    return [
        (
            "index build, Hugging Face tokenizer.json (benchmark 8)",
            f"{_short(ours['tokens/s'])} tokens/s (target 90% of encode_batch: {_verdict(md, 'encode_batch')})",
            _listing(peers, lambda r: f"{r['contender']}: {_short(r['tokens/s'])}"),
        )
    ]


def _onthefly(md: str) -> list[Row]:
    t = [x for x in parse_tables(md) if x.title.startswith("Real tokens/s")][-1]
    best = _best_per(t.rows, "contender", "real tokens/s", higher=True)
    ours = [r for r in best if r["contender"].startswith("detsampler")]
    peers = [r for r in best if r not in ours]

    def fmt(r: dict[str, str]) -> str:
        return f"{r['contender']} ({r['num_workers']} workers): {_short(r['real tokens/s'])}"

    return [("on the fly, documents shorter than a sample (benchmark 9)", _listing(ours, fmt), _listing(peers, fmt))]


def _corpus_scale(md: str) -> list[Row]:
    sized = [t for t in parse_tables(md) if re.match(r"1e\+\d+ documents", t.title)]
    t = max(sized, key=lambda t: value(t.title))
    ours = [r for r in t.rows if "persisted" in r["contender"]]
    peers = sorted((r for r in t.rows if r not in ours), key=lambda r: value(r["open + first micro batch"]))

    def fmt(r: dict[str, str]) -> str:
        return f"{r['contender']}: {r['open + first micro batch']}, {r['RSS growth']}"

    return [
        (
            f"open + first micro batch, RSS, at {t.title.split(' (')[0]} (benchmark 11)",
            _listing(ours, fmt),
            _listing(peers, fmt),
        )
    ]


def _source_open(md: str) -> list[Row]:
    t = [x for x in parse_tables(md) if x.title.startswith("Opening")][-1]

    def fmt(r: dict[str, str]) -> str:
        return f"{r['file']}: {r['open']}, +{r['RSS growth']}"

    return [
        (
            f"{t.title.split(' (')[0]}, fresh process, per file (benchmark 10)",
            _listing(t.rows, fmt) + f" (targets < 1 s, < 50 MB: {_verdict(md, 'open < 1 s')})",
            "no peer measured (each peer opens only its own format)",
        )
    ]


def _shard_build(md: str) -> list[Row]:
    t = [x for x in parse_tables(md) if " shards, " in x.title][-1]
    one = next(r for r in t.rows if r["processes"] == "1")
    parallel = sorted((r for r in t.rows if r is not one), key=lambda r: value(r["wall (median)"]))

    def fmt(r: dict[str, str]) -> str:
        return f"{r['contender'].split(' (')[0]}: {r['wall (median)']}, {r['speed-up']}"

    return [
        (
            f"sharded index build, {t.title.split(' (')[0]}, 2 processes against 1 (benchmark 12)",
            _listing(parallel, fmt) + f" (target 1.6x: {_verdict(md, 'shards with W processes')})",
            f"{one['contender'].split(' (')[0]}: {one['wall (median)']} (no peer builds a sharded token index)",
        )
    ]


def _where(md: str) -> list[Row]:
    t = [x for x in parse_tables(md) if x.title.startswith("where over")][-1]

    def ours(r: dict[str, str]) -> str:
        return f"{r['layout']}: {r['where: median / max ms'].split(' / ')[0]} ms"

    def scan(r: dict[str, str]) -> str:
        return f"{r['layout']}: {r[next(c for c in r if c.startswith('scan of'))]}"

    return [
        (
            f"document -> steps, {t.title.removeprefix('where over ').split(' (')[0]}, median (benchmark 13)",
            _listing(t.rows, ours) + f" (target < 50 ms: {_verdict(md, 'where for one document')})",
            "a locate scan of every step (no peer answers it): " + _listing(t.rows, scan) + " (extrapolated)",
        )
    ]


def _sft_packing(md: str) -> list[Row]:
    t = _table(md, "Packing efficiency")
    out = []
    for seq_len in sorted({r["seq_len"] for r in t.rows}, key=int):
        rows = {r["packing"]: r["efficiency"] for r in t.rows if r["seq_len"] == seq_len}
        peers = [
            (rows["Axolotl multipack (lengths cut at seq_len)"], "Axolotl multipack"),
            (rows["TRL pack_dataset bfd (truncates)"], "TRL bfd"),
        ]
        examples = t.title.split(" of ")[1].split(" examples")[0]
        out.append(
            (
                f"SFT packing efficiency, seq_len {seq_len}, {examples} examples (benchmark 16)",
                f"bestfit, truncate: {rows['detsampler bestfit, truncate, window 1,024']} (default window), "
                f"{rows['detsampler bestfit, truncate, one window']} (one window) (targets: "
                f"{_verdict(md, f'seq_len {seq_len}: packing')})",
                "; ".join(f"{name} {cell}" for cell, name in sorted(peers, key=lambda p: -value(p[0]))),
            )
        )
    return out


def _filter(md: str) -> list[Row]:
    t = [x for x in parse_tables(md) if x.title.startswith("get_batch with and without")][-1]

    def ours(r: dict[str, str]) -> str:
        flags = r["filter alone, µs: median / mean / max"].split(" / ")[1]
        return f"{r['layout']}: {r['throughput lost']} lost, flags {flags} µs"

    def former(r: dict[str, str]) -> str:
        return f"{r['layout']}: {r['former filter, µs: median / mean'].split(' / ')[1]} µs"

    r = [x for x in parse_tables(md) if x.title.startswith("get_batch, then redact_labels")][-1]

    def redaction(row: dict[str, str]) -> str:
        mean = row["redact_labels, µs: median / mean"].split(" / ")[1]
        return f"{row['layout']}: {row['throughput lost']} lost, {mean} µs"

    return [
        (
            "instance filter (OLMo-core's repetition filter) against get_batch, 8 x 2,048 tokens, mean (benchmark 14)",
            _listing(t.rows, ours) + f" (target <= 5%: {_verdict(md, 'filtering costs')})",
            "the former implementation's flags (OLMo-core filters in its own loader, not measured): "
            + _listing(t.rows, former),
        ),
        (
            "redaction (redact_labels, a third of the documents) against get_batch, 8 x 2,048 tokens (benchmark 14)",
            _listing(r.rows, redaction) + f" (target <= 5%: {_verdict(md, 'redaction costs')})",
            "no peer redacts",
        ),
    ]


def _sft_open(md: str) -> list[Row]:
    t = _table(md, "An SFT index")
    r = t.rows[-1]
    return [
        (
            f"open an SFT index of {r['examples']} examples, fresh process (benchmark 18)",
            f"open {r['open']}, RSS +{r['RSS after open']}; first micro batch {r['first micro batch']}, own memory"
            f" +{r['own / page cache mapped'].split(' / ')[0]} (target < 100 ms, < 100 MB:"
            f" {_verdict(md, 'SFT index of')})",
            "no peer measured (TRL and Axolotl load and tokenize the dataset at start)",
        )
    ]


def _remote(md: str) -> list[Row]:
    rows = {r["reader"]: r for r in _table(md, "The tiny training loop").rows}
    on, off = (
        rows["S3 +50 ms, prefetch on, 1 worker"],
        rows["S3 +50 ms, prefetch off (1 MiB blocks on demand), 1 worker"],
    )
    hits = {r["cache"]: r["hit rate"] for r in _table(md, "Cache hit rates").rows}
    peers = _table(md, "Peers' S3 readers").rows
    return [
        (
            "a tiny training loop reading from S3 at +50 ms per request, 8 x 2,048 tokens, 1 worker (benchmark 17)",
            f"prefetch on: {on['tokens/s']} tokens/s ({on['vs local']} local disk), data wait {on['wait share']} of"
            f" the step (targets: {_verdict(md, 'data wait')}, {_verdict(md, 'tokens/s')}); Belady hit rate"
            f" {hits['Belady, exact prefetch ahead (live run)']}, LRU of the same size"
            f" {hits['LRU, on demand only (same trace)']} ({_verdict(md, 'hit rate')})",
            "; ".join(f"{r['reader']}: {r['tokens/s']} tokens/s" for r in peers)
            + f"; ours with prefetch off: {off['tokens/s']} tokens/s",
        ),
        *_remote_node(md),
    ]


def _remote_node(md: str) -> list[Row]:
    """Issue 37's headline: a node of 8 processes over a 3-source mixture, with and without the node-shared cache."""
    try:
        node = {r["node"]: r for r in _table(md, "A node of 2 ranks x 4").rows}
    except LookupError:  # a run before issue 37
        return []
    shared, apart = node["2 ranks x 4 workers, node-shared cache"], node["2 ranks x 4 workers, per-process caches"]
    peers = _table(md, "The peers' S3 readers on the mixture").rows
    return [
        (
            "a node of 2 ranks x 4 workers reading a 3-source OLMo mixture from S3 at +50 ms (benchmark 17)",
            f"node-shared cache: {shared['bytes fetched']} fetched in {shared['GETs']} GETs,"
            f" {shared['/ distinct blocks']} the distinct blocks its plan reads (target <= 1.1x:"
            f" {_verdict(md, '8 processes')}); per-process caches: {apart['bytes fetched']},"
            f" {apart['/ distinct blocks']}",
            "; ".join(f"{r['reader']}: {r['tokens/s']} tokens/s (main process)" for r in peers),
        )
    ]


_WHOLE = "whole step (locate + costs + assignment)"


def _balance(md: str) -> list[Row]:
    modeled = _table(md, "Per-rank modeled cost").rows
    measured = _table(md, "Measured: forward")
    timing = _table(md, "Balancing one step").rows
    top = [r for r in modeled if r["ranks"] in ("64", "1024") and r["seq_len"] in ("32k", "128k")]
    wide = measured.rows[-1]
    return [
        (
            "compute-balanced plan, per-rank cost max / mean, bestfit, 8 samples per rank (benchmark 20)",
            "; ".join(f"{r['seq_len']} x {r['ranks']} ranks {r['balanced'].split(' ')[0]}" for r in top)
            + f" (target <= 1.02: {_verdict(md, 'modeled cost')}); measured straggler wait at {wide['ranks']} ranks"
            f" {wide['balanced'].split(' (')[0]} against {wide['straggler wait, position order'].split(' (')[0]}"
            f" ({wide['wait cut']} cut; target 30%: {_verdict(md, 'straggler wait')}); balancing"
            f" {max((r[_WHOLE] for r in timing), key=value)} per step of 1,024 samples at most"
            f" ({_verdict(md, 'balancing costs')})",
            "position order (every deterministic loader): "
            + "; ".join(f"{r['seq_len']} x {r['ranks']} ranks {r['position order'].split(' ')[0]}" for r in top)
            + "; Megatron balances by an all-to-all at run time (not measured)",
        )
    ]


HEADLINES: dict[str, Callable[[str], list[Row]]] = {
    "balance": _balance,
    "resume": _resume,
    "memory": _memory,
    "loader": _loader,
    "index": _index,
    "permutation": _permutation,
    "trainer": _trainer,
    "scale": _scale,
    "hf_build": _hf_build,
    "onthefly": _onthefly,
    "source_open": _source_open,
    "corpus_scale": _corpus_scale,
    "shard_build": _shard_build,
    "where": _where,
    "sft_packing": _sft_packing,
    "filter": _filter,
    "sft_mask": _sft_mask,
    "sft_open": _sft_open,
    "remote": _remote,
}


def _generic(section: Section) -> list[Row]:
    title = section.markdown.splitlines()[0].lstrip("# ")
    verdicts = [
        re.sub(r"^- \*\*(\w+)\*\* — target: ", r"\1: ", v).split(". ")[0] for v in section_verdicts(section.markdown)
    ]
    return [
        (
            f"{title} (benchmark {section.number})",
            "; ".join(verdicts) or "see docs/benchmarks.md",
            "see docs/benchmarks.md",
        )
    ]


def headline_rows(section: Section) -> list[Row]:
    """The README rows of one section: its headline function's, or the generic row when it has none or its tables
    are not the expected ones."""
    fn = HEADLINES.get(section.name)
    if fn is None:
        return _generic(section)
    try:
        return fn(section.markdown)
    except (LookupError, ValueError, IndexError, TypeError) as e:
        print(f"README row of benchmark {section.name}: its tables are not the expected ones ({e!r}); generic row")
        return _generic(section)


def readme_table(sections: list[Section]) -> str:
    """The markdown table of every section's headline rows, with the date of the section each row comes from."""
    lines = ["| measured (benchmark, its run) | detsampler | contenders, strongest first |", "|---|---|---|"]
    for s in sections:
        for what, ours, peers in headline_rows(s):
            lines.append(f"| {what}, {s.date} | {ours} | {peers} |")
    return "\n".join(lines)

"""``detsampler erase INDEX --doc D[,D...]``: overwrite the documents' stored tokens (and loss mask) in place with the
index's pad id, locally or in a bucket, every length kept (:func:`detsampler.index.erase.erase_documents`), and prove
the bytes are gone by reading them back (:func:`~detsampler.index.erase.erasure_proof`)."""

from __future__ import annotations

import argparse

from detsampler.cli.report import print_json
from detsampler.index.erase import erase_documents, erasure_proof

__all__ = ["cmd_erase", "document_ids", "erasure_proof_lines", "print_erasure_proof"]


def document_ids(text: str) -> list[int]:
    """``3,7`` -> ``[3, 7]``; one line naming the value otherwise."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected document ids (integers >= 0, comma-separated), got {text!r}")
    return [int(p) for p in parts]


def _bytes_gone(row: dict) -> bool:
    """Whether an erasure proof's row shows every stored token the neutral id (and, for chat data, the mask all 0)."""
    return row["neutral"] == row["num_tokens"] and row["mask_zero"] is not False


def erasure_proof_lines(index: object) -> tuple[list[str], bool]:
    """One line per erased document of ``index``: its stored tokens read back (through the chunk checksums) and how
    many are the neutral id; and whether every one is."""
    lines, ok = [], True
    for row in erasure_proof(index):
        gone = _bytes_gone(row)
        ok &= gone
        mask = "" if row["mask_zero"] is None else f", loss mask {'all 0' if row['mask_zero'] else 'NOT all 0'}"
        verdict = "its bytes are gone" if gone else "NOT ERASED"
        lines.append(
            f"erased doc {row['document']} (erasure {row['erasure']}): {row['neutral']} of its {row['num_tokens']}"
            f" stored tokens are the neutral id {row['neutral_id']}{mask}: {verdict}"
        )
    return lines, ok


def print_erasure_proof(index: object) -> bool:
    """Print :func:`erasure_proof_lines`; returns whether every erased document's bytes are the neutral id."""
    lines, ok = erasure_proof_lines(index)
    for line in lines:
        print(line)
    return ok


def cmd_erase(args: argparse.Namespace) -> int:
    from detsampler.index.reader import TokenIndex

    documents = sorted({d for group in args.doc for d in group})
    result = erase_documents(args.index, documents)
    index = TokenIndex.open(args.index)
    if args.json:
        proof = erasure_proof(index)
        every_gone = all(_bytes_gone(row) for row in proof)
        print_json({**result, "proof": proof, "bytes_gone": every_gone}, sort_keys=True)
        return 0 if every_gone else 1
    if result["documents"]:
        record = result["record"]
        chunks = ", ".join(f"{name} {len(c)} chunk(s)" for name, c in result["chunks"].items())
        print(
            f"erased {len(result['documents'])} document(s) {result['documents']} of {args.index}:"
            f" {record['num_tokens']:,} stored tokens overwritten in place with the pad id {record['neutral_id']}"
            f" ({chunks} rewritten, their checksums recomputed; every length kept)"
        )
    if result["already"]:
        print(f"already erased: {result['already']}")
    print(f"index identity {result['identity']} (a run resumes across the erasure: check_resume accepts exactly it)")
    return 0 if print_erasure_proof(index) else 1

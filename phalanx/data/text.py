"""Text for language models: Tiny Shakespeare or any UTF-8 text, as token windows.

- **Tokens**: characters (the vocabulary is the training text's characters, sorted; a
  character the training text lacks maps to one extra unknown token) or bytes (256).
- **Split by position**: the first 90% of the tokens train, the last 10% test, so no window
  of the test set overlaps one of the training set (nothing leaks).
- **Windows**: a sample is ``context + 1`` consecutive tokens, ``x`` the first ``context``
  and ``y`` the same shifted by one (the next token at every position). Training windows
  start every ``context // TRAIN_OVERLAP`` tokens from a seeded offset; test windows tile the
  test text without overlap, so each test token is scored once.

Workers shard the windows as they shard images (disjoint, seeded).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from phalanx.errors import DataError

SHAKESPEARE = Path(__file__).with_name("tinyshakespeare.txt")  # ../shared/data/text, copied
TOKENS = ("char", "byte")
TEST_FRACTION = 0.1
# training windows start every context // TRAIN_OVERLAP tokens: 3 windows cover each token,
# so an epoch is ~3 passes over the text's tokens at distinct offsets (Tiny Shakespeare at
# context 64: 47,799 windows, 746 steps of 64: the GPT's default run, docs/workloads.md)
TRAIN_OVERLAP = 3
MAX_TEXT_BYTES = 1 << 30


def read_text(name: str, data_dir: str | None) -> str:
    """The text of ``--data shakespeare`` or of ``--data text --data-dir PATH`` (a UTF-8 file,
    or a folder whose ``.txt`` files are joined in name order)."""
    if name == "shakespeare":
        path = Path(data_dir) if data_dir else SHAKESPEARE
        return _read_file(path, "--data-dir" if data_dir else "--data shakespeare")
    if not data_dir:
        raise DataError("--data text: needs --data-dir naming a UTF-8 file or a folder of "
                        ".txt files")
    path = Path(data_dir)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise DataError(f"--data-dir {data_dir}: a folder with no .txt file in it")
        return "\n".join(_read_file(p, "--data-dir") for p in files)
    return _read_file(path, "--data-dir")


def _read_file(path: Path, flag: str) -> str:
    if not path.is_file():
        raise DataError(f"{flag} {path}: no such file")
    size = path.stat().st_size
    if size > MAX_TEXT_BYTES:
        raise DataError(f"{flag} {path}: {size} bytes, more than the {MAX_TEXT_BYTES} a text "
                        "set is read into memory with")
    raw = path.read_bytes()
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise DataError(f"{flag} {path}: a binary file (NUL byte at {nul}), not text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{flag} {path}: not UTF-8 text (byte {e.start})") from None
    if not text.strip():
        raise DataError(f"{flag} {path}: empty (no text to learn from)")
    return text


def tokenize(text: str, tokens: str) -> tuple[np.ndarray, np.ndarray, str]:
    """(training tokens, test tokens, vocabulary) split by position; ``vocabulary`` is the
    characters in id order ("" for bytes)."""
    if tokens not in TOKENS:
        raise DataError(f"--tokens: {tokens!r} is not one of {', '.join(TOKENS)}")
    if tokens == "byte":
        ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
        cut = len(ids) - max(1, int(round(TEST_FRACTION * len(ids))))
        return ids[:cut], ids[cut:], ""
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    cut = len(points) - max(1, int(round(TEST_FRACTION * len(points))))
    known = np.unique(points[:cut])  # sorted code points of the training text
    vocab = "".join(map(chr, known.tolist()))
    ids = np.searchsorted(known, points).clip(max=len(known) - 1)
    unseen = known[ids] != points  # only in the test text: one extra "unknown" token
    if unseen.any():
        ids[unseen] = len(known)
        vocab += "\ufffd"
    return ids[:cut], ids[cut:], vocab


def windows(ids: np.ndarray, context: int, stride: int, offset: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y): every window of ``context + 1`` tokens starting at ``offset + k * stride``."""
    starts = np.arange(offset, len(ids) - context, stride)
    if len(starts) == 0:
        empty = torch.zeros(0, context, dtype=torch.int64)
        return empty, empty.clone()
    rows = starts[:, None] + np.arange(context + 1)[None, :]
    win = torch.from_numpy(np.ascontiguousarray(ids[rows]))
    return win[:, :-1].contiguous(), win[:, 1:].contiguous()


def text_splits(name: str, data_dir: str | None, seed: int, context: int, tokens: str):
    """(train x, train y, test x, test y, vocabulary, description) of a text set."""
    text = read_text(name, data_dir)
    train_ids, test_ids, vocab = tokenize(text, tokens)
    for split, ids in (("training", train_ids), ("test", test_ids)):
        if len(ids) <= context:
            raise DataError(f"--context: {context} tokens is longer than the {split} text "
                            f"({len(ids)} tokens of {len(train_ids) + len(test_ids)}; the "
                            f"test text is the last {TEST_FRACTION:.0%})")
    stride = max(1, context // TRAIN_OVERLAP)
    offset = int(np.random.default_rng(seed + 777).integers(0, stride))
    tx, ty = windows(train_ids, context, stride, offset)
    vx, vy = windows(test_ids, context, context)
    info = {"tokens": tokens, "vocab_size": len(vocab) if tokens == "char" else 256,
            "train_tokens": int(len(train_ids)), "test_tokens": int(len(test_ids)),
            "context": context, "window_stride": stride}
    return tx, ty, vx, vy, vocab, info


def decode(ids, vocab: str) -> str:
    """Token ids back to text (characters by ``vocab``; bytes when it is empty)."""
    ids = [int(i) for i in ids]
    if not vocab:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
    return "".join(vocab[i] if 0 <= i < len(vocab) else "\ufffd" for i in ids)

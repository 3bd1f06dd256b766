"""Byte-level corpus and deterministic batches.

Contract: :class:`ByteCorpus` loads a text file, or by default the Python standard library's own
top-level ``*.py`` sources in sorted order (present on every Python install), as a uint8 array.
:class:`TokenCorpus` does the same over any token array (a tokenizer's output).
:meth:`TokenCorpus.batch` is a pure function of (seed, step, global micro-batch index): no hidden RNG
state, so a rank rebuilt at step s sees exactly the bytes the old one would have seen. A missing or
too short file raises :class:`~tmslurm.core.errors.ConfigError` naming ``train.data_path``.
"""

from __future__ import annotations

import sysconfig
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from tmslurm.core.errors import ConfigError


@lru_cache(maxsize=4)
def load_corpus(path: str | None) -> np.ndarray:
    if path is None:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        files = sorted(stdlib.glob("*.py"))
        data = b"".join(f.read_bytes() for f in files)
    else:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(
                f"train.data_path={path!r} cannot be read: {exc}. Fix: point train.data_path at a text file."
            ) from None
    return np.frombuffer(data, dtype=np.uint8)


class TokenCorpus:
    """Deterministic batches of ``seq_len + 1`` consecutive tokens drawn from a 1-D token array."""

    def __init__(self, data: np.ndarray, seq_len: int, micro_batch_size: int, seed: int) -> None:
        self.data = data
        self.seq_len = seq_len
        self.mbs = micro_batch_size
        self.seed = seed
        if len(self.data) < seq_len + 2:
            raise ConfigError(
                f"train.data_path has {len(self.data)} tokens, fewer than model.seq_len+2={seq_len + 2}. "
                "Fix: use a longer file."
            )

    def batch(self, step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, step, index])
        starts = rng.integers(0, len(self.data) - self.seq_len - 1, size=self.mbs)
        rows = np.stack([self.data[s : s + self.seq_len + 1] for s in starts]).astype(np.int64)
        tokens = torch.from_numpy(rows)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class ByteCorpus(TokenCorpus):
    """The text of ``path`` (or the standard library's sources) as byte tokens."""

    def __init__(self, path: str | None, seq_len: int, micro_batch_size: int, seed: int) -> None:
        super().__init__(load_corpus(path), seq_len, micro_batch_size, seed)

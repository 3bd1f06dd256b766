"""The shadow's fingerprint (comm/shadow.py): equal states give equal fingerprints; one flipped bit
anywhere, in any dtype or shape, changes it, and so does moving values between chunks or tensors."""

from __future__ import annotations

import pytest
import torch

from tmslurm.comm.shadow import CHUNKS, fingerprint


def _state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {
            "w": torch.randn(37, 11, generator=g),
            "b": torch.randn(8, generator=g).to(torch.bfloat16),
            "scale": torch.tensor(1.5),
        },
        "optim": {
            "state": {0: {"step": torch.tensor(7, dtype=torch.int64), "exp_avg": torch.randn(1001, generator=g)}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "empty": torch.zeros(0),
        "odd": torch.arange(5, dtype=torch.uint8),
    }


def _flip(t: torch.Tensor, byte: int) -> None:
    t.reshape(-1).view(torch.uint8)[byte].bitwise_xor_(1)


CASES = {  # which tensor, which byte of it
    "float32, first byte": (lambda s: s["model"]["w"], 0),
    "float32, last byte": (lambda s: s["model"]["w"], 37 * 11 * 4 - 1),
    "float32, in the left-over tail": (lambda s: s["optim"]["state"][0]["exp_avg"], 1001 * 4 - 1),
    "bfloat16": (lambda s: s["model"]["b"], 3),
    "0-dim": (lambda s: s["model"]["scale"], 2),
    "int64 step count": (lambda s: s["optim"]["state"][0]["step"], 0),
    "uint8, fewer words than chunks": (lambda s: s["odd"], 4),
}


def test_equal_states_give_equal_fingerprints():
    assert torch.equal(fingerprint(_state()), fingerprint(_state()))
    assert fingerprint(_state()).numel() == 7 * (CHUNKS + 1)  # a row per tensor, the empty one included


@pytest.mark.parametrize("case", list(CASES))
def test_one_flipped_bit_changes_it(case):
    pick, byte = CASES[case]
    state = _state()
    _flip(pick(state), byte)
    assert not torch.equal(fingerprint(state), fingerprint(_state()))


def test_values_moved_between_chunks_or_tensors_change_it():
    state = _state()
    w = state["model"]["w"].reshape(-1)
    w[0], w[-1] = w[-1].clone(), w[0].clone()  # first and last chunk swap one value
    assert not torch.equal(fingerprint(state), fingerprint(_state()))
    state = _state()
    state["model"]["w"], state["optim"]["state"][0]["exp_avg"] = (
        state["optim"]["state"][0]["exp_avg"],
        state["model"]["w"],
    )
    assert not torch.equal(fingerprint(state), fingerprint(_state()))

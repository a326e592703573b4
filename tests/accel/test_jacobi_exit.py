"""CEED-VLA's early-exit rule on hand-built distributions: min over tokens of max probability."""

import pytest
import torch

from vlarun.accel.jacobi import (
    JacobiConfig,
    fixed_counts,
    jacobi_solve,
    min_confidence,
    should_exit,
)

V = 4  # vocabulary of the hand-built distributions


def dist(top: int, p: float) -> list[float]:
    """A distribution over V tokens with ``p`` on ``top`` and the rest spread evenly."""
    rest = (1.0 - p) / (V - 1)
    return [p if i == top else rest for i in range(V)]


def logits(rows: list[list[list[float]]]) -> torch.Tensor:
    return torch.tensor(rows).log()


class Scripted:
    """A ``step`` returning the k-th scripted logits of y_2..y_n at its k-th call."""

    def __init__(self, script: list[torch.Tensor]) -> None:
        self.script, self.calls = script, 0

    def __call__(self, state: torch.Tensor) -> torch.Tensor:
        out = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return out


def test_min_confidence_is_min_over_tokens_of_max_probability():
    x = logits([[dist(0, 0.9), dist(1, 0.55), dist(2, 0.7)]])
    assert min_confidence(x).item() == pytest.approx(0.55)
    assert should_exit(x, 0.55).item() and not should_exit(x, 0.56).item()
    assert not should_exit(x, None).item()  # no sigma: never exit


def _script():
    """n = 4 tokens. y_1 from the prefill with p = 0.9 (token 0). Iterations' y_2..y_4:
    1: tokens (1, 2, 3), min p 0.3;  2: tokens (2, 3, 1), min p 0.6;  3: (3, 1, 2), min p 0.8.
    Every iteration changes every token, so only the cap (n - 1 = 3) ends a run without exit."""
    first = logits([dist(0, 0.9)])
    it1 = logits([[dist(1, 0.3), dist(2, 0.9), dist(3, 0.9)]])
    it2 = logits([[dist(2, 0.6), dist(3, 0.95), dist(1, 0.7)]])
    it3 = logits([[dist(3, 0.8), dist(1, 0.9), dist(2, 0.9)]])
    return first, [it1, it2, it3]


@pytest.mark.parametrize(
    ("sigma", "stops_at", "tokens", "exited"),
    [
        (0.25, 1, [0, 1, 2, 3], True),  # 0.3 >= 0.25 at the first iteration
        ("exact", 1, [0, 1, 2, 3], True),  # >=, not >: sigma equal to the minimum passes
        (0.5, 2, [0, 2, 3, 1], True),  # 0.3 < 0.5, then 0.6 >= 0.5
        (0.55, 2, [0, 2, 3, 1], True),
        (0.7, 3, [0, 3, 1, 2], False),  # never >= 0.7 before the cap; the cap is exact
        (None, 3, [0, 3, 1, 2], False),
    ],
)
def test_exit_stops_where_the_definition_says(sigma, stops_at, tokens, exited):
    first, script = _script()
    if sigma == "exact":  # the first iteration's minimum, as computed (0.3 up to rounding)
        sigma = min_confidence(torch.cat((first[:, None], script[0]), dim=1)).item()
    step = Scripted(script)
    init = torch.zeros(1, 4, dtype=torch.long)
    r = jacobi_solve(first, step, init, JacobiConfig(sigma=sigma))
    assert step.calls == stops_at and r.iterations.item() == stops_at
    assert r.tokens[0].tolist() == tokens  # the exit iteration's argmax tokens
    assert r.exited.item() is exited and r.converged.item() is (not exited)


def test_first_token_confidence_counts():
    """y_1 (from the prefill) is an action token too: at p = 0.45 no sigma of 0.5 can pass."""
    _, script = _script()
    first = logits([dist(0, 0.45)])
    r = jacobi_solve(first, Scripted(script), torch.zeros(1, 4, dtype=torch.long),
                     JacobiConfig(sigma=0.5))  # fmt: skip
    assert r.iterations.item() == 3 and not r.exited.item()
    assert r.confidence.item() == pytest.approx(0.45)


def test_rows_exit_independently_and_stay_frozen():
    """Row 0 passes sigma at iteration 1, row 1 only at iteration 2; row 0 keeps its tokens."""
    first = logits([dist(0, 0.9), dist(0, 0.9)])
    it1 = logits([[dist(1, 0.9), dist(2, 0.9), dist(3, 0.9)],
                  [dist(1, 0.3), dist(2, 0.9), dist(3, 0.9)]])  # fmt: skip
    it2 = logits([[dist(3, 0.9), dist(3, 0.9), dist(3, 0.9)],
                  [dist(2, 0.9), dist(3, 0.9), dist(1, 0.9)]])  # fmt: skip
    r = jacobi_solve(first, Scripted([it1, it2]), torch.zeros(2, 4, dtype=torch.long),
                     JacobiConfig(sigma=0.5))  # fmt: skip
    assert r.iterations.tolist() == [1, 2] and r.exited.tolist() == [True, True]
    assert r.tokens.tolist() == [[0, 1, 2, 3], [0, 2, 3, 1]]
    assert torch.equal(r.trajectory[0, 1], r.trajectory[0, 2])  # frozen after exiting


def test_converged_state_stops_without_confirming_twice():
    """An iteration that reproduces its input is the fixed point: stop there."""
    first = logits([dist(0, 0.9)])
    same = logits([[dist(0, 0.9), dist(0, 0.9), dist(0, 0.9)]])
    step = Scripted([same])
    r = jacobi_solve(first, step, torch.zeros(1, 4, dtype=torch.long), JacobiConfig())
    assert step.calls == 1 and r.converged.item() and r.fixed[0].tolist() == [4, 0]


def test_fixed_counts_count_when_tokens_settle():
    traj = torch.tensor([[[0, 9, 9, 9], [0, 1, 7, 3], [0, 1, 2, 3]]])  # y_4 right from k=1
    assert fixed_counts(traj)[0].tolist() == [1, 2, 1]

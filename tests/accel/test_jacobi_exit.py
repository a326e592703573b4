"""CEED-VLA's early-exit rule on hand-built distributions: min over tokens of max probability."""

import pytest
import torch

from vlarun.accel.jacobi import (
    JacobiConfig,
    JacobiDecoder,
    exit_confidence,
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


class Table:
    """A hand-built causal model over n tokens with target sequence ``target`` (B, n):
    y_{i+1} given y_<=i puts probability right[b, i+1] on target[b, i+1] when y_<=i is the
    target's prefix, else wrong[b, i+1] on the wrong token target[b, i+1] - 1. Like the KV
    cache, it remembers the inputs of earlier calls before a call's ``start``."""

    def __init__(self, target, right, wrong) -> None:
        self.target = torch.tensor(target)
        self.right, self.wrong = right, wrong
        b, n = self.target.shape
        self.fed = torch.full((b, n - 1), -1)
        self.starts: list[int] = []

    def first(self) -> torch.Tensor:
        pairs = zip(self.target[:, 0].tolist(), self.right, strict=True)
        return logits([dist(t, r[0]) for t, r in pairs])

    def __call__(self, inputs: torch.Tensor, start: int) -> torch.Tensor:
        self.starts.append(start)
        self.fed[:, start : start + inputs.shape[1]] = inputs
        rows = []
        for b in range(self.target.shape[0]):
            row = []
            for j in range(start, start + inputs.shape[1]):  # input j predicts y[j + 1]
                good = bool((self.fed[b, : j + 1] == self.target[b, : j + 1]).all())
                tok = int(self.target[b, j + 1]) - (0 if good else 1)
                row.append(dist(tok % V, (self.right if good else self.wrong)[b][j + 1]))
            rows.append(row)
        return logits(rows)

    @property
    def calls(self) -> int:
        return len(self.starts)


def test_min_confidence_is_min_over_tokens_of_max_probability():
    x = logits([[dist(0, 0.9), dist(1, 0.55), dist(2, 0.7)]])
    assert min_confidence(x).item() == pytest.approx(0.55)
    assert should_exit(x, 0.55).item() and not should_exit(x, 0.56).item()
    assert not should_exit(x, None).item()  # no sigma: never exit


def _table(first_p: float = 0.9) -> Table:
    """Target (0, 1, 2, 3); from zeros the states are [0 1 1 2] -> [0 1 2 2] -> [0 1 2 3] with
    minimum confidences 0.3 (y_3 behind a wrong y_2), 0.55 (y_4 behind a wrong y_3), 0.6."""
    return Table([[0, 1, 2, 3]], right=[[first_p, 0.9, 0.6, 0.8]], wrong=[[0, 0, 0.3, 0.55]])


ZEROS = torch.zeros(1, 4, dtype=torch.long)


@pytest.mark.parametrize(
    ("sigma", "stops_at", "tokens", "exited"),
    [
        (0.25, 1, [0, 1, 1, 2], True),  # 0.3 >= 0.25 at the first iteration
        ("exact", 1, [0, 1, 1, 2], True),  # >=, not >: sigma equal to the minimum passes
        (0.5, 2, [0, 1, 2, 2], True),  # 0.3 < 0.5, then 0.55 >= 0.5
        (0.58, 3, [0, 1, 2, 3], False),  # reached only at the cap, where the state is exact
        (0.7, 3, [0, 1, 2, 3], False),
        (None, 3, [0, 1, 2, 3], False),
    ],
)
def test_exit_stops_where_the_definition_says(sigma, stops_at, tokens, exited):
    table = _table()
    if sigma == "exact":  # the first iteration's minimum as computed (0.3 up to rounding)
        probe = _table()
        sigma = min_confidence(torch.cat((probe.first()[:, None], probe(ZEROS[:, :-1], 0)), 1))
        sigma = sigma.item()
    r = jacobi_solve(table.first(), table, ZEROS, JacobiConfig(sigma=sigma))
    assert table.calls == stops_at and r.iterations.item() == stops_at
    assert r.tokens[0].tolist() == tokens  # the exit iteration's argmax tokens
    assert r.exited.item() is exited and r.converged.item() is (not exited)


def test_iterations_recompute_only_after_the_first_changed_input():
    table = _table()
    r = jacobi_solve(table.first(), table, ZEROS, JacobiConfig())
    assert table.starts == [0, 1, 2]  # y_2, then y_3 were the first inputs to change
    assert r.tokens[0].tolist() == [0, 1, 2, 3] and r.fixed[0].tolist() == [1, 1, 1, 1]


def test_first_token_confidence_counts():
    """y_1 (from the prefill) is an action token too: at p = 0.45 no sigma of 0.5 can pass."""
    table = _table(first_p=0.45)
    r = jacobi_solve(table.first(), table, ZEROS, JacobiConfig(sigma=0.5))
    assert r.iterations.item() == 3 and not r.exited.item()
    assert r.confidence.item() == pytest.approx(0.45)


def test_unsettled_rule_skips_the_tokens_jacobi_has_made_exact():
    """The same y_1 at p = 0.45 blocks the paper's rule for good; ``exit_over="unsettled"``
    ignores y_1..y_{k+1} after k iterations (exact by then): at iteration 1 it tests y_3, y_4
    (0.3, 0.55: no exit), at iteration 2 y_4 alone (0.55 >= 0.5: exit, y_4 still wrong)."""
    table = _table(first_p=0.45)
    cfg = JacobiConfig(sigma=0.5, exit_over="unsettled")
    r = jacobi_solve(table.first(), table, ZEROS, cfg)
    assert r.iterations.item() == 2 and r.exited.item()
    assert r.tokens[0].tolist() == [0, 1, 2, 2]  # y_1..y_3 exact, y_4 the exit's guess
    assert r.confidence.item() == pytest.approx(0.55)
    x = logits([[dist(0, 0.4), dist(1, 0.9), dist(2, 0.6)]])
    assert exit_confidence(x, 0).item() == pytest.approx(0.4)  # "all": y_1 counts
    assert exit_confidence(x, 0, "unsettled").item() == pytest.approx(0.6)
    assert exit_confidence(x, 2, "unsettled").item() == 1.0  # nothing left to test
    assert JacobiDecoder(cfg).name == "jacobi-exit-unsettled@0.5"
    with pytest.raises(ValueError, match="exit_over"):
        JacobiConfig(exit_over="some")


def test_rows_exit_independently_and_stay_frozen():
    """Row 0 is sure of everything, even behind wrong inputs: it exits at iteration 1 with
    wrong tokens (the rule trusts confidence, not convergence); row 1 is ``_table``'s row."""
    table = Table(
        [[3, 2, 1, 0], [0, 1, 2, 3]],
        right=[[0.9] * 4, [0.9, 0.9, 0.6, 0.8]],
        wrong=[[0, 0, 0.9, 0.9], [0, 0, 0.3, 0.55]],
    )
    r = jacobi_solve(
        table.first(), table, torch.zeros(2, 4, dtype=torch.long), JacobiConfig(sigma=0.5)
    )
    assert r.iterations.tolist() == [1, 2] and r.exited.tolist() == [True, True]
    assert r.tokens.tolist() == [[3, 2, 0, 3], [0, 1, 2, 2]]
    assert torch.equal(r.trajectory[0, 1], r.trajectory[0, 2])  # frozen after exiting


def test_converged_state_stops_without_confirming_twice():
    """An initial guess that is already the fixed point stops after one iteration."""
    table = _table()
    init = torch.tensor([[0, 1, 2, 3]])
    r = jacobi_solve(table.first(), table, init, JacobiConfig())
    assert table.calls == 1 and r.converged.item() and r.fixed[0].tolist() == [4, 0]


def test_fixed_counts_count_when_tokens_settle():
    traj = torch.tensor([[[0, 9, 9, 9], [0, 1, 7, 3], [0, 1, 2, 3]]])  # y_4 right from k=1
    assert fixed_counts(traj)[0].tolist() == [1, 2, 1]

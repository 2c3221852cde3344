import pytest

from kdactl.bench.order import abba, plan


def test_abba_two():
    assert abba(["A", "B"], 1) == ["A", "B", "B", "A"]
    assert abba(["A", "B"], 2) == ["A", "B", "B", "A", "A", "B", "B", "A"]


def test_abba_generalizes_forward_then_reverse():
    assert abba(["A", "B", "C"], 1) == ["A", "B", "C", "C", "B", "A"]
    assert abba(["A"], 2) == ["A", "A", "A", "A"]
    assert abba([], 3) == []


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_abba_is_counterbalanced(n):
    names = [chr(65 + i) for i in range(n)]
    sched = abba(names, 2)
    # every name appears equally often and at the same mean position: no one always goes first
    positions = {x: [i for i, y in enumerate(sched) if y == x] for x in names}
    assert {len(p) for p in positions.values()} == {4}
    means = {x: sum(p) / len(p) for x, p in positions.items()}
    assert len({round(m, 9) for m in means.values()}) == 1


@pytest.mark.parametrize(("iters", "rounds", "block"), [(2, 1, 1), (5, 2, 2), (8, 4, 1), (24, 4, 3), (100, 4, 13)])
def test_plan(iters, rounds, block):
    p = plan(iters)
    assert (p.rounds, p.block_size) == (rounds, block)
    assert p.iterations >= iters


def test_plan_needs_two():
    with pytest.raises(ValueError):
        plan(1)

"""The minimax polynomial behind the softplus gate's log(1 + e^-y) (csrc/device.cuh log1p_exp_neg):
P(u) ~ 2 atanh(s) / s on u = s^2 in [0, 1/9] (s = z / (2 + z), z = e^-y in (0, 1]), fitted for relative
error by Remez's exchange in 50-digit arithmetic (mpmath, which torch's sympy brings), then rounded to
fp32. Prints each degree's coefficients as C literals and the relative error of 2 atanh(s) as s P(s^2)
with them (exact otherwise; the kernel adds its fp32 roundings and MUFU errors, device.cuh's budget).

    python3 tools/gate_poly.py [--degrees 2 3 4]"""

import argparse

import mpmath as mp
import numpy as np

mp.mp.dps = 50
B = mp.mpf(1) / 9


def target(u):
    return mp.mpf(2) if u == 0 else 2 * mp.atanh(mp.sqrt(u)) / mp.sqrt(u)


def grid(points: int = 4000):
    """[0, B] in `points` equal steps: where the error is searched for its extremes and measured."""
    return [B * i / points for i in range(points + 1)]


def remez(n: int, rounds: int = 30):
    """Coefficients c_0 .. c_n of the polynomial of degree n with the least relative error on [0, B]."""
    xs = [B * (1 - mp.cos(mp.pi * i / (n + 1))) / 2 for i in range(n + 2)]
    us = grid()
    for _ in range(rounds):
        A = mp.matrix(n + 2, n + 2)
        rhs = mp.matrix(n + 2, 1)
        for i, x in enumerate(xs):
            for j in range(n + 1):
                A[i, j] = x**j
            A[i, n + 1] = -((-1) ** i) * target(x)
            rhs[i] = target(x)
        sol = mp.lu_solve(A, rhs)
        c = [sol[j] for j in range(n + 1)]
        err = [(mp.polyval(c[::-1], u) - target(u)) / target(u) for u in us]
        last = len(us) - 1
        turns = [0] + [i for i in range(1, last) if (err[i] - err[i - 1]) * (err[i + 1] - err[i]) <= 0] + [last]
        if len(turns) != n + 2:
            break
        xs = [us[i] for i in turns]
    return c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--degrees", type=int, nargs="+", default=[2, 3, 4])
    args = ap.parse_args()
    for n in args.degrees:
        c32 = [float(np.float32(float(x))) for x in remez(n)]
        worst = max(
            abs(mp.polyval([mp.mpf(x) for x in c32[::-1]], u) / target(u) - 1)
            for u in grid()
        )
        literals = ", ".join(f"{np.float32(x)!r}".removeprefix("np.float32(").removesuffix(")") + "f" for x in c32)
        print(f"degree {n}: c0..c{n} = {literals}; relative error {float(worst):.2e} = 2^{float(mp.log(worst, 2)):.1f}")


if __name__ == "__main__":
    main()

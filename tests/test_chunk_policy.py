"""Route chunk's launch policy (csrc/kda_chunk_policy.h), compiled on the CPU with the host C++
compiler: how many warps a walk of the recurrence takes and how many chunks it keeps in flight, how the
tuning fields override each choice, and that the launcher builds every shape it picks."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from kdactl.kda.tuning import STAGES, WARPS, Tuning

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
H200_SMS = 132

# (batch, seqlen, heads, key/value dim, varlen, tuning, SMs) -> (recurrence warps, its stages).
AUTO = Tuning()
CASES = {
    # the serving shapes: one 8-warp walk per head where 4-warp walks outnumber the SMs and 8-warp ones
    # fit one wave
    (1, 8192, 64, 128, False, AUTO, H200_SMS): (4, 8),
    (1, 8192, 96, 128, False, AUTO, H200_SMS): (8, 4),
    (2, 16384, 64, 128, False, AUTO, H200_SMS): (8, 4),
    (8, 4096, 12, 128, False, AUTO, H200_SMS): (8, 4),
    (6, 8192, 96, 128, True, AUTO, H200_SMS): (4, 4),  # varlen
    # the boundaries of the recurrence's width: one wave of 4-warp walks (132), of 8-warp ones
    (1, 8192, 66, 128, False, AUTO, H200_SMS): (4, 8),  # 132 walks: still one wave, deep ring
    (1, 8192, 67, 128, False, AUTO, H200_SMS): (8, 4),  # 134 4-warp walks, 67 8-warp ones
    (1, 8192, 132, 128, False, AUTO, H200_SMS): (8, 4),
    (1, 8192, 134, 128, False, AUTO, H200_SMS): (4, 4),  # more heads than SMs
    (1, 8192, 128, 64, False, AUTO, H200_SMS): (4, 8),  # K = 64: V = 64 is 4 warps
    (1, 8192, 256, 64, False, AUTO, H200_SMS): (4, 4),
    (1, 8192, 74, 128, False, AUTO, 148): (4, 8),  # B200: 148 walks in one wave
    # small batch x heads: few walks, 2-warp CTAs
    (1, 65536, 8, 128, False, AUTO, H200_SMS): (2, 8),
    # tuning fields
    (1, 8192, 64, 128, False, Tuning(warps=2, stages=8), H200_SMS): (2, 8),
    (1, 8192, 64, 128, False, Tuning(warps=8, stages=4), H200_SMS): (8, 4),
    (1, 8192, 64, 128, False, Tuning(warps=8), H200_SMS): (8, 4),  # 8 warps alone: 4 stages
    (1, 8192, 96, 128, False, Tuning(stages=8), H200_SMS): (8, 8),  # a shape the launcher refuses (chunk_builds)
    (1, 65536, 8, 128, False, Tuning(warps=4), H200_SMS): (4, 8),
}


def _probe(folder, statements: list[str]) -> list[str]:
    """The lines that ``statements``, each printing one, print in a main() that includes the header."""
    from kdactl.assets import csrc_dir

    src = folder / "probe.cpp"
    src.write_text(f'#include <cstdio>\n#include "{csrc_dir() / "kda_chunk_policy.h"}"\n'
                   "using namespace kdactl::chunk;\nint main() {\n" + "\n".join(statements) + "\nreturn 0; }\n")  # fmt: skip
    exe = src.with_suffix("")
    subprocess.run(["c++", "-std=c++17", "-Wall", "-Werror", "-o", str(exe), str(src)], check=True,
                   capture_output=True)  # fmt: skip
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()


def _args(B: int, T: int, H: int, D: int, varlen: bool, tuning: Tuning) -> str:
    return (f"kdactl_kda_args a{{}}; a.batch = {B}; a.seqlen = {T}; a.heads = {H}; a.key_dim = a.value_dim = {D};"
            f" a.tuning_warps = {tuning.warps}; a.tuning_stages = {tuning.stages};"
            f" a.varlen = {int(varlen)}; a.cu_seqlens = {'&a' if varlen else 'nullptr'};")  # fmt: skip


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """Every CASES row through the header's functions: {case: (warps, stages)}."""
    rows = [f"{{ {_args(*case[:6])} const RecurShape rs = pick_recur(a, {case[6]});"
            f' std::printf("%d %d\\n", rs.warps, rs.stages); }}' for case in CASES]  # fmt: skip
    out = _probe(tmp_path_factory.mktemp("policy"), rows)
    return {case: tuple(map(int, line.split())) for case, line in zip(CASES, out)}


@pytest.mark.parametrize("case", list(CASES), ids=lambda c: "B{}-T{}-H{}-D{}{}-{}-sm{}".format(
    *c[:4], "-varlen" if c[4] else "", c[5], c[6]))  # fmt: skip
def test_launch_policy(policy, case):
    assert policy[case] == CASES[case]


def test_the_launcher_builds_every_shape_auto_picks_and_no_other(tmp_path):
    """Auto's shape over batch x heads from one CTA to far past the SMs, on the H200 and on an sm_80
    part, at either head dim, is one the launcher builds (chunk_builds); and every shape it builds
    is one auto picks somewhere, or the 4-stage ring that such a pick falls back to on a part whose
    shared memory per block does not hold 8 stages: no kernel is compiled for a tuning field alone."""
    walks = [(B, H) for B in (1, 2, 8) for H in (1, 2, 8, 16, 32, 48, 64, 66, 67, 96, 132, 134, 256, 512)]
    picks = [f"{{ {_args(B, 8192, H, D, False, AUTO)} const RecurShape rs = pick_recur(a, {sms});"
             f' std::printf("%d %d %d %d\\n", rs.warps, rs.stages, {D}, chunk_builds(rs, {D}) ? 1 : 0); }}'
             for B, H in walks for D in (64, 128) for sms in (H200_SMS, 108)]  # fmt: skip
    picked = {tuple(map(int, line.split())) for line in _probe(tmp_path, picks)}
    assert all(built for *_, built in picked), sorted(picked)
    shapes = [(w, s, D) for w in (1, *WARPS, 16) for s in (2, *STAGES, 16) for D in (64, 128)]
    checks = [f'std::printf("%d\\n", chunk_builds({{{w}, {s}}}, {D}) ? 1 : 0);' for w, s, D in shapes]
    built = {shape for shape, line in zip(shapes, _probe(tmp_path, checks)) if line == "1"}
    fallbacks = {(w, 4, D) for w, s, D, _ in picked if s == 8}
    assert built == {(w, s, D) for w, s, D, _ in picked} | fallbacks

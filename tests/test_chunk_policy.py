"""Route chunk's launch policy (csrc/kda_chunk_policy.h), compiled on the CPU with the host C++
compiler: which kernels the launcher runs, with how many warps a walk, how far the fused grid's
producers may run ahead and how many run beside a walk, and how the tuning codes override each choice."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from kdactl.kernel_abi import TUNING_AHEAD, TUNING_FUSED, TUNING_PRODUCERS, TUNING_STAGES

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
H200_SMS = 132
FUSED = 2 * TUNING_FUSED
TWO_KERNELS = TUNING_FUSED

# (batch, seqlen, heads, key/value dim, varlen, tuning, SMs) -> (fused walk warps, producers' lead in
# chunks, two-kernel recurrence warps, its stages, producers beside a fused walk). The lead and the
# recurrence are what the launcher would use for the fused grid and for the two kernels; the producers
# are out of the 8 that the grid holds on the H200 at either walk width, 0 without it.
CASES = {
    # the serving shapes: the two kernels, whose recurrence takes one 8-warp walk per head where 4-warp
    # walks outnumber the SMs and 8-warp ones fit one wave
    (1, 8192, 64, 128, False, 0, H200_SMS): (0, 24, 4, 8, 0),
    (1, 8192, 96, 128, False, 0, H200_SMS): (0, 24, 8, 4, 0),
    (2, 16384, 64, 128, False, 0, H200_SMS): (0, 24, 8, 4, 0),
    (8, 4096, 12, 128, False, 0, H200_SMS): (0, 24, 8, 4, 0),
    (6, 8192, 96, 128, True, 0, H200_SMS): (0, 0, 4, 4, 0),  # varlen: never paced
    # the boundaries of the recurrence's width: one wave of 4-warp walks (132), of 8-warp ones
    (1, 8192, 66, 128, False, 0, H200_SMS): (0, 24, 4, 8, 0),  # 132 walks: still one wave, deep ring
    (1, 8192, 67, 128, False, 0, H200_SMS): (0, 24, 8, 4, 0),  # 134 4-warp walks, 67 8-warp ones
    (1, 8192, 132, 128, False, 0, H200_SMS): (0, 24, 8, 4, 0),
    (1, 8192, 134, 128, False, 0, H200_SMS): (0, 24, 4, 4, 0),  # more heads than SMs
    (1, 8192, 128, 64, False, 0, H200_SMS): (0, 24, 4, 8, 0),  # K = 64: V = 64 is 4 warps
    (1, 8192, 256, 64, False, 0, H200_SMS): (0, 24, 4, 4, 0),
    (1, 8192, 74, 128, False, 0, 148): (0, 24, 4, 8, 0),  # B200: 148 walks in one wave
    # small batch x heads: few walks, two kernels with 2-warp CTAs
    (1, 65536, 8, 128, False, 0, H200_SMS): (0, 24, 2, 8, 0),
    # tuning codes
    (1, 8192, 96, 128, False, TWO_KERNELS, H200_SMS): (0, 24, 8, 4, 0),
    (1, 8192, 96, 128, False, FUSED, H200_SMS): (4, 24, 8, 4, 6),
    (1, 8192, 96, 128, False, FUSED + 8, H200_SMS): (8, 24, 8, 4, 8),
    (1, 1024, 4, 128, True, FUSED + 8, H200_SMS): (8, 0, 8, 4, 8),
    (1, 8192, 64, 128, False, FUSED + 2 * TUNING_AHEAD, H200_SMS): (4, 4, 4, 8, 6),  # at least 4 chunks
    (1, 8192, 64, 128, False, FUSED + 48 * TUNING_AHEAD, H200_SMS): (4, 48, 4, 8, 6),
    (1, 8192, 64, 128, False, FUSED + 7 * TUNING_PRODUCERS, H200_SMS): (4, 24, 4, 8, 7),
    (1, 8192, 64, 128, False, FUSED + 9 * TUNING_PRODUCERS, H200_SMS): (4, 24, 4, 8, 8),  # at most all
    (1, 8192, 96, 128, False, FUSED + 8 + 3 * TUNING_PRODUCERS + 16 * TUNING_AHEAD, H200_SMS): (8, 16, 8, 4, 3),
    (1, 8192, 64, 128, False, 8 * TUNING_STAGES + 2, H200_SMS): (0, 24, 2, 8, 0),
    (1, 8192, 64, 128, False, 4 * TUNING_STAGES + 8, H200_SMS): (0, 24, 8, 4, 0),
    (1, 8192, 64, 128, False, 8, H200_SMS): (0, 24, 8, 4, 0),  # 8 warps alone: 4 stages
    (1, 8192, 64, 128, False, FUSED + 8 * TUNING_STAGES + 2, H200_SMS): (4, 24, 2, 8, 6),  # warps 2: 4-warp walks
}


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """Every CASES row through the header's functions: {case: (walk warps, lead, warps, stages, producers)}."""
    from kdactl.assets import csrc_dir

    rows = []
    for (B, T, H, D, varlen, tuning, sms) in CASES:
        rows.append(
            f"{{ kdactl_kda_args a{{}}; a.batch = {B}; a.seqlen = {T}; a.heads = {H}; a.key_dim = a.value_dim = {D};"
            f" a.tuning = {tuning}; a.varlen = {int(varlen)}; a.cu_seqlens = {'&a' if varlen else 'nullptr'};"
            f" const int w = fused_walk_warps(a); const RecurShape rs = pick_recur(a, {sms});"
            f" std::printf(\"%d %d %d %d %d\\n\", w, fused_ahead(a), rs.warps, rs.stages,"
            f" w ? fused_producers(a, w, 8) : 0); }}"
        )
    src = tmp_path_factory.mktemp("policy") / "probe.cpp"
    src.write_text(f'#include <cstdio>\n#include "{csrc_dir() / "kda_chunk_policy.h"}"\n'
                   "using namespace kdactl::chunk;\nint main() {\n" + "\n".join(rows) + "\nreturn 0; }\n")  # fmt: skip
    exe = src.with_suffix("")
    subprocess.run(["c++", "-std=c++17", "-Wall", "-Werror", "-o", str(exe), str(src)], check=True,
                   capture_output=True)  # fmt: skip
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    return {case: tuple(map(int, line.split())) for case, line in zip(CASES, out)}


@pytest.mark.parametrize("case", list(CASES), ids=lambda c: "B{}-T{}-H{}-D{}{}-t{}-sm{}".format(
    *c[:4], "-varlen" if c[4] else "", *c[5:]))  # fmt: skip
def test_launch_policy(policy, case):
    assert policy[case] == CASES[case]

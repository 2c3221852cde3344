"""Route chunk's launch policy (csrc/kda_chunk_policy.h), compiled on the CPU with the host C++
compiler: which kernels the launcher runs, with how many warps a walk, how far the fused grid's
producers may run ahead, and how the tuning codes override each choice."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from kdactl.kda.routes import TUNING_AHEAD, TUNING_FUSED, TUNING_STAGES

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
H200_SMS = 132
FUSED = 2 * TUNING_FUSED
TWO_KERNELS = TUNING_FUSED

# (batch, seqlen, heads, key/value dim, varlen, tuning, SMs) -> (fused walk warps, producers' lead in
# chunks, two-kernel recurrence warps, its stages). The lead and the recurrence are what the launcher
# would use for the fused grid (at its walk width, 4 when it takes the two kernels) and the two kernels.
CASES = {
    # the serving shapes: 4-warp walks where they fill one wave, else one walk per head
    (1, 8192, 64, 128, False, 0, H200_SMS): (4, 0, 4, 8),
    (1, 8192, 96, 128, False, 0, H200_SMS): (8, 24, 4, 4),
    (2, 16384, 64, 128, False, 0, H200_SMS): (8, 0, 4, 4),
    (8, 4096, 12, 128, False, 0, H200_SMS): (8, 24, 4, 4),
    (6, 8192, 96, 128, True, 0, H200_SMS): (0, 0, 4, 4),  # varlen: the two kernels, and never paced
    # the boundaries: 2/3 of the SMs (88 walks), one wave, 128 chunks
    (1, 8192, 44, 128, False, 0, H200_SMS): (4, 24, 4, 8),
    (1, 8192, 43, 128, False, 0, H200_SMS): (0, 24, 4, 8),
    (1, 8192, 66, 128, False, 0, H200_SMS): (4, 0, 4, 8),  # 132 walks: still one wave
    (1, 8192, 67, 128, False, 0, H200_SMS): (0, 0, 4, 4),  # 134 4-warp walks, 67 8-warp ones
    (1, 8192, 88, 128, False, 0, H200_SMS): (8, 24, 4, 4),
    (1, 8192, 80, 128, False, 0, H200_SMS): (0, 0, 4, 4),  # 80 heads: measured no faster fused
    (1, 8192, 134, 128, False, 0, H200_SMS): (0, 0, 4, 4),  # more heads than SMs
    (1, 2048, 64, 128, False, 0, H200_SMS): (4, 0, 4, 8),
    (1, 2047, 64, 128, False, 0, H200_SMS): (0, 0, 4, 8),
    (1, 8192, 128, 64, False, 0, H200_SMS): (0, 0, 4, 8),  # K = 64 has no fused grid of its own choice
    (1, 8192, 64, 128, False, 0, 148): (4, 24, 4, 8),  # B200: 128 walks leave 20 SMs without one
    # small batch x heads: few walks, two kernels with 2-warp CTAs
    (1, 65536, 8, 128, False, 0, H200_SMS): (0, 24, 2, 8),
    # tuning codes
    (1, 8192, 96, 128, False, TWO_KERNELS, H200_SMS): (0, 0, 4, 4),
    (1, 8192, 96, 128, False, FUSED, H200_SMS): (4, 0, 4, 4),
    (1, 8192, 96, 128, False, FUSED + 8, H200_SMS): (8, 24, 8, 8),
    (1, 1024, 4, 128, True, FUSED + 8, H200_SMS): (8, 0, 8, 8),
    (1, 8192, 64, 128, False, FUSED + 2 * TUNING_AHEAD, H200_SMS): (4, 4, 4, 8),  # at least 4 chunks
    (1, 8192, 64, 128, False, FUSED + 48 * TUNING_AHEAD, H200_SMS): (4, 48, 4, 8),
    (1, 8192, 64, 128, False, 8 * TUNING_STAGES + 2, H200_SMS): (4, 0, 2, 8),
    (1, 8192, 64, 128, False, 4 * TUNING_STAGES + 8, H200_SMS): (4, 0, 8, 4),
}


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """Every CASES row through the header's functions: {case: (walk warps, lead, warps, stages)}."""
    from kdactl.assets import csrc_dir

    rows = []
    for (B, T, H, D, varlen, tuning, sms) in CASES:
        rows.append(
            f"{{ kdactl_kda_args a{{}}; a.batch = {B}; a.seqlen = {T}; a.heads = {H}; a.key_dim = a.value_dim = {D};"
            f" a.tuning = {tuning}; a.cu_seqlens = {'&a' if varlen else 'nullptr'};"
            f" const int w = fused_walk_warps(a, {sms}); const RecurShape rs = pick_recur(a, {sms});"
            f" std::printf(\"%d %d %d %d\\n\", w, fused_ahead(a, recur_units(a, {D}, w ? w : 4), {sms}),"
            f" rs.warps, rs.stages); }}"
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

"""Route chunk's launch policy (csrc/kda_chunk_policy.h), compiled on the CPU with the host C++
compiler: how many warps a walk of the recurrence takes and how many chunks it keeps in flight, and how
the tuning codes override each choice."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from kdactl.kda.routes import TUNING_STAGES

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
H200_SMS = 132

# (batch, seqlen, heads, key/value dim, varlen, tuning, SMs) -> (recurrence warps, its stages).
CASES = {
    # the serving shapes: one 8-warp walk per head where 4-warp walks outnumber the SMs and 8-warp ones
    # fit one wave
    (1, 8192, 64, 128, False, 0, H200_SMS): (4, 8),
    (1, 8192, 96, 128, False, 0, H200_SMS): (8, 4),
    (2, 16384, 64, 128, False, 0, H200_SMS): (8, 4),
    (8, 4096, 12, 128, False, 0, H200_SMS): (8, 4),
    (6, 8192, 96, 128, True, 0, H200_SMS): (4, 4),  # varlen
    # the boundaries of the recurrence's width: one wave of 4-warp walks (132), of 8-warp ones
    (1, 8192, 66, 128, False, 0, H200_SMS): (4, 8),  # 132 walks: still one wave, deep ring
    (1, 8192, 67, 128, False, 0, H200_SMS): (8, 4),  # 134 4-warp walks, 67 8-warp ones
    (1, 8192, 132, 128, False, 0, H200_SMS): (8, 4),
    (1, 8192, 134, 128, False, 0, H200_SMS): (4, 4),  # more heads than SMs
    (1, 8192, 128, 64, False, 0, H200_SMS): (4, 8),  # K = 64: V = 64 is 4 warps
    (1, 8192, 256, 64, False, 0, H200_SMS): (4, 4),
    (1, 8192, 74, 128, False, 0, 148): (4, 8),  # B200: 148 walks in one wave
    # small batch x heads: few walks, 2-warp CTAs
    (1, 65536, 8, 128, False, 0, H200_SMS): (2, 8),
    # tuning codes
    (1, 8192, 64, 128, False, 8 * TUNING_STAGES + 2, H200_SMS): (2, 8),
    (1, 8192, 64, 128, False, 4 * TUNING_STAGES + 8, H200_SMS): (8, 4),
    (1, 8192, 64, 128, False, 8, H200_SMS): (8, 4),  # 8 warps alone: 4 stages
}


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """Every CASES row through the header's functions: {case: (warps, stages)}."""
    from kdactl.assets import csrc_dir

    rows = []
    for (B, T, H, D, varlen, tuning, sms) in CASES:
        rows.append(
            f"{{ kdactl_kda_args a{{}}; a.batch = {B}; a.seqlen = {T}; a.heads = {H}; a.key_dim = a.value_dim = {D};"
            f" a.tuning = {tuning}; a.cu_seqlens = {'&a' if varlen else 'nullptr'};"
            f" const RecurShape rs = pick_recur(a, {sms}); std::printf(\"%d %d\\n\", rs.warps, rs.stages); }}"
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

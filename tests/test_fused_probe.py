"""tools/fused_probe.py, the fused single-pass measurement: its segment plan and scope on the CPU, and
(nvcc tier) that tools/fused_probe.cu still compiles against the kernel headers, in every variant."""

import importlib.util
import subprocess
from pathlib import Path

import pytest
import torch

TOOL = Path(__file__).resolve().parents[1] / "tools" / "fused_probe.py"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("fused_probe", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("batch", "heads", "seqlen", "segment_chunks", "ctas"),
    [
        (1, 8, 65536, 256, 128),  # 16 segments of 256 chunks
        (1, 12, 32768, 187, 132),  # 11 segments, the last one shorter
        (1, 1, 1048576, 497, 132),
        (2, 64, 16384, 1024, 128),  # a sequence a segment: no warm start needed
        (1, 96, 8192, 512, 96),  # more heads than SMs: still one segment, one wave short of full
        (1, 12, 100, 1, 84),  # 7 chunks, fewer than the 11 segments the SMs would take: a chunk each
    ],
)
def test_segments_fill_the_sms_once(probe, batch, heads, seqlen, segment_chunks, ctas):
    seg = probe.probe_segment_chunks(batch, heads, seqlen, sms=132)
    assert seg == segment_chunks
    chunks = -(-seqlen // 16)
    assert batch * heads * -(-chunks // seg) == ctas
    assert batch * heads * -(-chunks // seg) <= max(132, batch * heads)


def _inputs(**change):
    x = {"q": torch.zeros(1, 32, 2, 128, dtype=torch.bfloat16), "v": torch.zeros(1, 32, 2, 128, dtype=torch.bfloat16),
         "g": torch.zeros(1, 32, 2, 128, dtype=torch.bfloat16), "cu_seqlens": None}  # fmt: skip
    x.update(change)
    return x


def test_scope_is_said_by_name(probe):
    assert probe.unsupported(_inputs()) is None
    assert "fixed-length" in probe.unsupported(_inputs(cu_seqlens=torch.tensor([0, 32])))
    assert "K = V = 128" in probe.unsupported(_inputs(q=torch.zeros(1, 32, 2, 64, dtype=torch.bfloat16)))
    assert "bf16" in probe.unsupported(_inputs(g=torch.zeros(1, 32, 2, 128)))
    assert "bf16" in probe.unsupported(_inputs(q=torch.zeros(1, 32, 2, 128, dtype=torch.float16)))


@pytest.mark.nvcc
@pytest.mark.parametrize(
    "defines",
    [
        (),
        ("PROBE_PREFETCH",),
        ("PROBE_TRACE",),
        ("PROBE_SAME_INPUTS", "PROBE_NO_WALK", "PROBE_TRACE"),
        ("PROBE_PREP_WARPS=2",),
    ],
)
def test_the_probe_compiles_for_sm90a(probe, tmp_path, defines):
    so = tmp_path / "probe.so"
    done = subprocess.run(probe.compile_command(so, defines), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert so.stat().st_size > 0
    assert "kda_fused_probe" in done.stderr  # ptxas compiled the kernel itself, not only the host side

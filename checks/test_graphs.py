"""CUDA graphs: capture with a caller-owned workspace, change the inputs in place, fill the outputs
with NaN, replay several times, equal to eager; a workspace used from a second stream or reused by a
second capture is refused with a ValueError that says so."""

from __future__ import annotations

import pytest
import torch

from kdactl.kda import KdaWorkspace, prefill
from kdactl.smoke import SmokeRow, make_inputs, replay_equals_eager, second_capture_refused

pytestmark = pytest.mark.gpu
ROW = SmokeRow("serving", 1, 157, 4, (60, 0, 97))  # captured varlen, with an empty sequence
SMALL = SmokeRow("small_bh", 1, 64, 2, (64,))
REPLAYS = 3


@pytest.mark.quick
def test_capture_replay_equals_eager(device):
    x, s0, cu = make_inputs(ROW, True, True, device, seed=4)
    o = torch.empty_like(x["v"])
    s = torch.empty_like(s0)
    ws = KdaWorkspace(device)
    call = dict(initial_state=s0, output_final_state=True, cu_seqlens=cu, out=(o, s), workspace=ws)
    prefill(**x, **call)  # warm up: loads the library, binds the workspace
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prefill(**x, **call)
    for seed in range(5, 5 + REPLAYS):
        fresh, s_fresh, _ = make_inputs(ROW, True, True, device, seed=seed)
        replay_equals_eager(graph, x, s0, cu, o, s, (fresh, s_fresh))


def test_workspace_refuses_second_stream(device):
    x, _, _ = make_inputs(SMALL, False, False, device, seed=1)
    ws = KdaWorkspace(device)
    prefill(**x, workspace=ws)
    other = torch.cuda.Stream(device)
    other.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(other), pytest.raises(ValueError, match="workspace is bound to stream"):
        prefill(**x, workspace=ws)
    torch.cuda.synchronize(device)


def test_workspace_refuses_second_capture(device):
    x, _, _ = make_inputs(SMALL, False, False, device, seed=2)
    ws = KdaWorkspace(device)
    o = torch.empty_like(x["v"])
    prefill(**x, workspace=ws, out=o)  # warm up: sizes the workspace's scratch before any capture
    torch.cuda.synchronize(device)
    second_capture_refused(x, ws, o)
    torch.cuda.synchronize(device)

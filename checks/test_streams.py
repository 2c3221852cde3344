"""The op on CUDA streams: on a side stream while the default stream is busy, and on two streams at
once; results must be bit-identical to a serial run on the default stream."""

from __future__ import annotations

import pytest
import torch

from kdactl.kda import prefill
from kdactl.smoke import SmokeRow, make_inputs

pytestmark = pytest.mark.gpu
ROW_A = SmokeRow("serving", 2, 256, 8, (256, 256))
ROW_B = SmokeRow("decode_like", 3, 12, 4, (12, 12, 12))


def _serial(row, device, seed):
    x, s0, _ = make_inputs(row, False, True, device, seed)
    o, s = prefill(**x, initial_state=s0, output_final_state=True)
    torch.cuda.synchronize(device)
    return x, s0, o.clone(), s.clone()


def _busy(device) -> None:
    a = torch.randn(4096, 4096, device=device)
    for _ in range(4):
        a = a @ a.T / 64.0  # queued on the default stream; the side stream must not wait on it


@pytest.mark.quick
def test_side_stream_while_default_busy(device):
    x, s0, o_ref, s_ref = _serial(ROW_A, device, 1)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))  # inputs are ready before the busy work
    _busy(device)
    with torch.cuda.stream(side):
        o, s = prefill(**x, initial_state=s0, output_final_state=True)
    torch.cuda.synchronize(device)
    assert torch.equal(o, o_ref) and torch.equal(s, s_ref), "side-stream result differs from the serial run"


def test_two_streams_at_once(device):
    runs = [_serial(ROW_A, device, 2), _serial(ROW_B, device, 3)]
    streams = [torch.cuda.Stream(device) for _ in runs]
    outs = []
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream(device))
    for stream, (x, s0, _, _) in zip(streams, runs):
        with torch.cuda.stream(stream):
            outs.append(prefill(**x, initial_state=s0, output_final_state=True))
    torch.cuda.synchronize(device)
    for i, ((o, s), (_, _, o_ref, s_ref)) in enumerate(zip(outs, runs)):
        assert torch.equal(o, o_ref) and torch.equal(s, s_ref), f"stream {i}: result differs from the serial run"

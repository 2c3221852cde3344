"""A caller-owned, reusable workspace, so that prefill can be captured in a CUDA graph.

A workspace carries the rules that keep two users of a route's scratch state apart: eager calls are
bound to the first stream that used it, and once a CUDA graph capture has used it, that graph owns
it (a replay would race any other user). It also holds the routes' scratch buffer (the chunked
route's prepared factors), grown by eager calls and never allocated under capture.
"""

from __future__ import annotations

import torch

from kdactl.kda.device import capture_id, capturing, current_stream_ptr


class KdaWorkspace:
    def __init__(self, device: torch.device | str | int | None = None):
        device = torch.device("cuda") if device is None else torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"KdaWorkspace: device must be a CUDA device, got {device}")
        # "cuda" means the current device; pin its index so that it compares equal to q.device.
        self.device = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
        self.stream: int | None = None  # eager stream bound on first use
        self.capture_id: int | None = None  # graph capture that owns it
        self.buffer: torch.Tensor | None = None  # uint8 scratch for the routes that need it

    def reserve(self, nbytes: int) -> torch.Tensor | None:
        """The scratch buffer, at least ``nbytes`` long: grown outside capture, never during one."""
        if nbytes and (self.buffer is None or self.buffer.numel() < nbytes):
            if capturing(self.device):
                have = 0 if self.buffer is None else self.buffer.numel()
                raise ValueError(
                    f"kdactl.kda.prefill: workspace holds {have} bytes and this call needs {nbytes}; make one "
                    f"eager call with these shapes before capturing, so that the capture allocates nothing"
                )
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self.buffer

    def claim(self, device: torch.device) -> int:
        """Check that this call may use the workspace, and bind it; ValueError naming the conflict.
        Returns the raw pointer of the current stream, which the launch goes on."""
        if device != self.device:
            raise ValueError(f"kdactl.kda.prefill: workspace is for {self.device}, inputs are on {device}")
        stream = current_stream_ptr(device)
        capture = capture_id(stream) if capturing(device) else 0
        if self.capture_id is not None and capture != self.capture_id:
            where = f"graph capture {capture}" if capture else f"eager work on stream {stream:#x}"
            raise ValueError(
                f"kdactl.kda.prefill: workspace is owned by graph capture {self.capture_id} and cannot be "
                f"reused by {where}; give each captured graph its own KdaWorkspace"
            )
        if capture:
            self.capture_id = capture
        elif self.stream is None:
            self.stream = stream
        elif stream != self.stream:
            raise ValueError(
                f"kdactl.kda.prefill: workspace is bound to stream {self.stream:#x} and was used from stream "
                f"{stream:#x}; give each stream its own KdaWorkspace"
            )
        return stream

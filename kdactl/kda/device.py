"""The GPU side of the op: the kernel library this process uses, a device's routing facts, and its
current stream (raw pointers, as the launchers take them) and graph capture."""

from __future__ import annotations

import functools

import torch

from kdactl.jit.library import Kernels, load_kernels
from kdactl.kda.routes import DeviceInfo
from kdactl.settings import Settings


@functools.cache
def kernels() -> Kernels:
    """The kernel library for this process, built or loaded once (first call only touches disk)."""
    return load_kernels(Settings.from_env())


def device_info(device: torch.device | int) -> DeviceInfo:
    """Routing facts of a CUDA device (a torch.device or an index)."""
    index = device if isinstance(device, int) else device.index
    return _device_info(index if index is not None else torch.cuda.current_device())


@functools.cache
def _device_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(sm_count=props.multi_processor_count, cc=(props.major, props.minor), target=kernels().target)


def capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` is capturing a CUDA graph (never, off the GPU)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def current_stream_ptr(device: torch.device) -> int:
    """The raw cudaStream_t of ``device``'s current stream, without building a torch Stream object
    (torch.cuda.current_stream costs several microseconds a call, on the launch path)."""
    return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else torch.cuda.current_device())


def capture_id(stream: int) -> int:
    """The id of the CUDA graph capture under way on ``stream`` (0 when it is not capturing)."""
    return kernels().capture_id(stream)

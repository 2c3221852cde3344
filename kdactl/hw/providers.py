"""The set of providers node detection reads from: real adapters by default, fakes in tests."""

from __future__ import annotations

import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kdactl.hw.cuda_torch import TorchCuda, TorchCudaProvider
from kdactl.hw.driver import DriverProvider
from kdactl.hw.nvml import PynvmlDriver
from kdactl.hw.smi import SmiDriver
from kdactl.hw.toolkit import Toolkit, find_toolkit
from kdactl.settings import Settings
from kdactl.skus import SkuSpec, load_skus


@dataclass(frozen=True)
class Providers:
    driver: DriverProvider  # NVML
    fallback: DriverProvider | None  # nvidia-smi, asked only when NVML cannot be loaded
    torch: TorchCudaProvider
    toolkit: Callable[[], Toolkit]  # raises ToolMissing / Inconclusive
    machine: Callable[[], str]  # host CPU architecture
    skus: Callable[[], Mapping[str, SkuSpec]]  # the SKU matrix


def real_providers(settings: Settings) -> Providers:
    return Providers(
        driver=PynvmlDriver(),
        fallback=SmiDriver(),
        torch=TorchCuda(),
        toolkit=lambda: find_toolkit(settings.nvcc),
        machine=platform.machine,
        skus=load_skus,
    )

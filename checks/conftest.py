"""The node validation suite's pytest wiring (run by ``kdactl certify`` through kdactl.suite, or by
hand: ``python -m pytest checks/``).

Without a CUDA GPU every check skips with the reason "no CUDA GPU"; kdactl.suite turns a run where
everything skipped into an inconclusive error, never a pass. ``-m quick`` selects the subset that
``kdactl certify --quick`` runs. KDACTL_FAULT=hang|crash (kdactl.faults) fires in the first check.
"""

from __future__ import annotations

import os

import pytest

NO_GPU = "no CUDA GPU"


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch or a broken driver: nothing can run here
        return False


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: part of the subset that kdactl certify --quick runs")
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU")


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in items:
        item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _injected_fault():
    """KDACTL_FAULT=hang sleeps forever, =crash aborts: the suite's runner must catch both."""
    from kdactl.faults import hang_or_crash

    hang_or_crash()


@pytest.fixture(scope="session")
def settings():
    from kdactl.settings import Settings

    return Settings.from_env()


@pytest.fixture(scope="session")
def device():
    import torch

    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(scope="session")
def kernels():
    """The kernel library this process uses (built or loaded once); failing to load is an error."""
    from kdactl.kda.device import kernels as load

    return load()


@pytest.fixture(scope="session")
def device_info(device, kernels):
    from kdactl.kda.device import device_info as info

    return info(device)


@pytest.fixture(scope="session")
def gpu_sku(device):
    """(SKU name, its SkuSpec or None when the SKU is not in fleet/skus.toml)."""
    import torch

    from kdactl.node import classify_sku
    from kdactl.skus import load_skus

    props = torch.cuda.get_device_properties(device)
    # certify passes the SKU it classified; a run by hand classifies this GPU itself
    sku = os.environ.get("KDACTL_SKU") or classify_sku(
        props.name, (props.major, props.minor), props.multi_processor_count
    )
    return sku, load_skus().get(sku)

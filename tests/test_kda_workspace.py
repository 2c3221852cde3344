"""KdaWorkspace rules that need no GPU: device normalization and refusal of non-CUDA devices."""

import pytest
import torch

from kdactl.kda import KdaWorkspace


def test_plain_cuda_means_the_current_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert KdaWorkspace("cuda").device == torch.device("cuda", 3)
    assert KdaWorkspace(None).device == torch.device("cuda", 3)
    assert KdaWorkspace("cuda:1").device == torch.device("cuda", 1)


def test_cpu_workspace_refused():
    with pytest.raises(ValueError, match="device must be a CUDA device, got cpu"):
        KdaWorkspace("cpu")

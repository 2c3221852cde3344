"""kdactl: certify GPU nodes for KDA prefill, and measure the kernels it certifies.

Importing this package touches neither the disk nor the GPU (``kdactl gate`` must start fast).
"""

__version__ = "0.1.0"

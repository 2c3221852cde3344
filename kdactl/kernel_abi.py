"""What the kernel library's C ABI (csrc/kdactl_api.h) and Python must agree on, in one place.

The route table's names and ids, the constants the library is built with, the element type codes,
the ``kdactl_kda_args`` struct as ctypes sees it, and the order of a planned call's tensors (the
slots of csrc/host/kdactl_host.cpp). The loader refuses a library whose ABI version, route table or
constants differ (kdactl.jit.library.check_tables); kdactl_host refuses a Python side whose tensor
order or constants differ from its own (``configure``); tests compare the struct's layout and the
header's tables with a C compiler's.

The bottom layer: no torch and no other kdactl module here, so that the build layer, the fault
parser and the SKU table read it without loading the op.
"""

from __future__ import annotations

import ctypes

ABI_VERSION = 8  # KDACTL_ABI_VERSION: a library of another version is refused

# The route table, KDACTL_ROUTES(X): a route's id is its index here.
ROUTES: tuple[str, ...] = ("direct", "chunk", "small_bh")
ROUTE_IDS: dict[str, int] = {name: i for i, name in enumerate(ROUTES)}

# Facts the kernel library is built with, each KDACTL_<name> in csrc/kdactl_api.h.
MAX_GRID_DIM = 65535  # heads, sequences and segment slots each map to one grid dimension (y or z)
CHUNK = 16  # tokens per chunk of the chunked kernels
SMALL_BH_CTAS_PER_SM = 2  # small_bh's recurrence CTAs one SM holds: its plan fills one wave
SMALL_BH_MAX_UNSTITCHED = 4  # small_bh stitches no sequence cut into at most this many segments
SHARED_CONSTANTS: dict[str, int] = {
    "MAX_GRID_DIM": MAX_GRID_DIM, "CHUNK": CHUNK, "SMALL_BH_CTAS_PER_SM": SMALL_BH_CTAS_PER_SM,
    "SMALL_BH_MAX_UNSTITCHED": SMALL_BH_MAX_UNSTITCHED,
}  # fmt: skip

# The input transforms fla fuses (kdactl.kda.fused.Fused holds a call's choice).
BETA_AS_GIVEN, BETA_SIGMOID, BETA_SIGMOID2 = 0, 1, 2
GATE_AS_GIVEN, GATE_SOFTPLUS, GATE_LOWER_BOUND = 0, 1, 2
# Element type codes of g, beta and the checkpoints (kdactl_kda_args.g_dtype, ...).
DTYPE_FP32, DTYPE_BF16, DTYPE_FP16 = 0, 1, 2
FUSED_CONSTANTS: dict[str, int] = {
    "BETA_SIGMOID": BETA_SIGMOID, "BETA_SIGMOID2": BETA_SIGMOID2,
    "GATE_SOFTPLUS": GATE_SOFTPLUS, "GATE_LOWER_BOUND": GATE_LOWER_BOUND,
    "DTYPE_BF16": DTYPE_BF16, "DTYPE_FP16": DTYPE_FP16,
}  # fmt: skip

# kdactl's own error codes, above the cudaError_t range.
ERR_WRONG_DEVICE = 10001  # the device cannot run this build's target
ERR_UNSUPPORTED = 10003  # a configuration the build has no kernel for on this device

# Every constant the Python side relies on: KDACTL_<name> -> the value the library must have.
EXPECTED_CONSTANTS: dict[str, int] = {
    **SHARED_CONSTANTS,
    **FUSED_CONSTANTS,
    "ERR_WRONG_DEVICE": ERR_WRONG_DEVICE,
    "ERR_UNSUPPORTED": ERR_UNSUPPORTED,
}


class KdaArgs(ctypes.Structure):
    """Mirrors ``kdactl_kda_args`` in csrc/kdactl_api.h field for field (tests compare the layout
    with the C compiler's). Pointers are c_void_p so that ``tensor.data_ptr()`` assigns directly."""

    _fields_ = [
        ("q", ctypes.c_void_p),  # const void*
        ("k", ctypes.c_void_p),  # const void*
        ("v", ctypes.c_void_p),  # const void*
        ("g", ctypes.c_void_p),  # const void*
        ("beta", ctypes.c_void_p),  # const void*
        ("initial_state", ctypes.c_void_p),  # const float*, may be NULL
        ("o", ctypes.c_void_p),  # void*
        ("final_state", ctypes.c_void_p),  # float*, may be NULL
        ("cu_seqlens", ctypes.c_void_p),  # const void*, varlen only (else NULL)
        ("batch", ctypes.c_int64),
        ("seqlen", ctypes.c_int64),
        ("heads", ctypes.c_int32),
        ("key_dim", ctypes.c_int32),
        ("value_dim", ctypes.c_int32),
        ("g_dtype", ctypes.c_int32),  # DTYPE_*
        ("beta_dtype", ctypes.c_int32),
        ("cu_seqlens_is_int32", ctypes.c_int32),
        ("tuning_warps", ctypes.c_int32),  # kdactl.kda.tuning.Tuning; 0: the launcher's choice
        ("tuning_stages", ctypes.c_int32),
        ("scale", ctypes.c_float),
        ("workspace", ctypes.c_void_p),  # void*, route scratch memory
        ("workspace_bytes", ctypes.c_uint64),
        ("segment_chunks", ctypes.c_int32),  # route small_bh's plan
        ("qk_heads", ctypes.c_int32),  # the fused input transforms (kdactl.kda.fused)
        ("qk_l2norm", ctypes.c_int32),
        ("beta_mode", ctypes.c_int32),
        ("gate_mode", ctypes.c_int32),
        ("A_log", ctypes.c_void_p),  # const float*, may be NULL
        ("dt_bias", ctypes.c_void_p),  # const float*, may be NULL
        ("lower_bound", ctypes.c_float),
        ("state_indices", ctypes.c_void_p),  # const int32_t*, the state pool's slots; may be NULL
        ("qkv_fp16", ctypes.c_int32),  # 1: q, k, v, o fp16
        ("state_v_first", ctypes.c_int32),  # 1: states [V, K] per head
        ("checkpoints", ctypes.c_void_p),  # void*, prefix checkpoints; may be NULL
        ("checkpoint_every", ctypes.c_int32),
        ("checkpoint_dtype", ctypes.c_int32),
        ("varlen", ctypes.c_int32),  # 1: packed sequences, bounds in cu_seqlens; 0: fixed length
    ]


# KdaArgs starts with these pointers, in this order: a launch sets them all with one write.
LEADING_POINTERS = ("q", "k", "v", "g", "beta", "initial_state", "o", "final_state", "cu_seqlens")

# The leading fields of a call (kdactl.kda.call.PrefillCall), in the order kdactl_host's Slot enum
# reads them: its tensors, then the outputs given, the host copy of cu_seqlens and the workspace.
CALL_TENSORS = ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "A_log", "dt_bias", "state_pool",
                "state_indices")  # fmt: skip
CALL_FIELDS = (*CALL_TENSORS, "out", "cu_seqlens_cpu", "workspace")
MAX_PLANS = 1024  # distinct call shapes a plan table keeps; more and it starts over
# What kdactl_host is built with that Python relies on; its check_abi refuses other values.
HOST_CONSTANTS: dict[str, int] = {
    "ABI_VERSION": ABI_VERSION,
    "ARGS_SIZE": ctypes.sizeof(KdaArgs),
    "MAX_PLANS": MAX_PLANS,
}

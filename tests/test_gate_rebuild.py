"""The gate after a rebuild: the fingerprint names the library's build inputs (sources, flags,
target, kdactl, nvcc), not its bytes, so a rebuild of the same inputs passes while a tampered
library, another source, flag or nvcc fails.

The real builder (build.ninja, ninja, the cache, its manifest) runs with a fake nvcc that, like the
real one, writes temporary file names into its output: no two builds are bit-identical. One test
does the same with the real nvcc (marker nvcc)."""

import os
import sys
from dataclasses import replace
from datetime import timedelta

from kdactl.certify import fingerprint as fp
from kdactl.certify.command import CertifyOptions, certify_command
from kdactl.certify.gate import gate_command
from kdactl.hw.toolkit import Toolkit
from kdactl.jit import aot, cache, spec
from kdactl.jit.build import build_library
from kdactl.targets import get_target
from tests import certify_fakes as cf

NODE = fp.NodeNow(tuple(cf.uuid(i) for i in range(8)), ((9, 0),) * 8, "580.159.04", (13, 0))
BANNER = "Build cuda_13.0.r13.0/compiler.36424714_0"
FAKE_NVCC = """#!{python}
import hashlib, os, sys
args = sys.argv[1:]
out = args[args.index("-o") + 1]
h = hashlib.sha256(" ".join(a for a in args if a != out).encode())
for a in args:
    if a != out and os.path.isfile(a):
        h.update(open(a, "rb").read())
# as nvcc does, the names of its temporary files end up in what it writes
open(out, "wb").write(b"\\x7fELF" + h.digest() + b"/tmp/tmpxft_" + os.urandom(8).hex().encode())
"""


def fake_toolkit(tmp_path, banner=BANNER):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir(exist_ok=True)
    nvcc.write_text(FAKE_NVCC.format(python=sys.executable))
    nvcc.chmod(0o755)
    return Toolkit(str(nvcc), (13, 0), banner)


def build(s, csrc, toolkit, fresh=False):
    """The cache entry for sm_90a; ``fresh``: the old entry is discarded first (a corrupt entry is
    rebuilt just so)."""
    library_spec = spec.kernel_library_spec(get_target("sm_90a"), csrc)
    if fresh:
        cache.discard_dir(library_spec.key_dir(s.cache_dir))
    return build_library(library_spec, s.cache_dir, toolkit)


def artifacts(csrc):
    return lambda settings, targets: fp.artifacts_for(settings, targets, csrc)


def certify(s, csrc):
    deps = replace(cf.deps(cf.node(8)), artifacts=artifacts(csrc))
    return certify_command(s, CertifyOptions(), deps).cert


def gate(s, csrc):
    return gate_command(s, now=lambda: cf.NOW + timedelta(hours=1), node_reader=lambda _: NODE, artifacts=artifacts(csrc))


def test_a_rebuild_of_the_same_inputs_passes_the_gate(tmp_path, tiny_csrc):
    s, tk = cf.settings(tmp_path), fake_toolkit(tmp_path)
    first = build(s, tiny_csrc, tk)
    cert = certify(s, tiny_csrc)
    assert cert["gpus"][0]["artifact_sha256"] == first.manifest["files"]["libkdactl.so"]
    assert cert["node"]["fingerprint"]["artifact_build"] == {"sm_90a": cache.build_key(first.manifest)}
    assert gate(s, tiny_csrc).exit_code == 0
    again = build(s, tiny_csrc, tk, fresh=True)
    assert again.built and again.manifest["files"] != first.manifest["files"]  # other bytes
    rep = gate(s, tiny_csrc)
    assert rep.exit_code == 0 and rep.failures == [], rep.failures


def test_a_tampered_library_fails_the_gate(tmp_path, tiny_csrc):
    s, tk = cf.settings(tmp_path), fake_toolkit(tmp_path)
    library = build(s, tiny_csrc, tk).library
    certify(s, tiny_csrc)
    library.write_bytes(library.read_bytes()[:-4] + b"evil")
    rep = gate(s, tiny_csrc)
    assert rep.exit_code == 1 and len(rep.failures) == 1, rep.failures
    assert rep.failures[0].startswith("kernel library sm_90a: build inputs ") and "no valid library now" in rep.failures[0]
    assert "does not match the manifest" in rep.failures[0]


def test_a_changed_source_fails_the_gate_before_and_after_its_build(tmp_path, tiny_csrc):
    s, tk = cf.settings(tmp_path), fake_toolkit(tmp_path)
    build(s, tiny_csrc, tk)
    certify(s, tiny_csrc)
    with open(tiny_csrc / "common.cuh", "a") as f:
        f.write("\n// one more line\n")
    rep = gate(s, tiny_csrc)
    assert rep.exit_code == 1 and "no valid library now" in rep.failures[0] and "not built yet" in rep.failures[0]
    build(s, tiny_csrc, tk)
    rep = gate(s, tiny_csrc)
    assert rep.exit_code == 1 and "kernel library sm_90a changed: build inputs" in rep.failures[0], rep.failures


def test_a_changed_flag_fails_the_gate(tmp_path, tiny_csrc, monkeypatch):
    s, tk = cf.settings(tmp_path), fake_toolkit(tmp_path)
    build(s, tiny_csrc, tk)
    certify(s, tiny_csrc)
    monkeypatch.setattr(spec, "COMMON_CFLAGS", (*spec.COMMON_CFLAGS, "--use_fast_math"))
    build(s, tiny_csrc, tk)
    rep = gate(s, tiny_csrc)
    assert rep.exit_code == 1 and "kernel library sm_90a changed: build inputs" in rep.failures[0], rep.failures


def test_a_rebuild_by_another_nvcc_fails_the_gate(tmp_path, tiny_csrc):
    """Same CUDA version, another nvcc build: the toolkit version alone would not tell."""
    s = cf.settings(tmp_path)
    build(s, tiny_csrc, fake_toolkit(tmp_path))
    certify(s, tiny_csrc)
    build(s, tiny_csrc, fake_toolkit(tmp_path, "Build cuda_13.0.r13.0/compiler.99999999_0"), fresh=True)
    rep = gate(s, tiny_csrc)
    assert rep.exit_code == 1 and "kernel library sm_90a changed: build inputs" in rep.failures[0], rep.failures


def test_a_rebuilt_aot_bundle_passes_the_gate(tmp_path, tiny_csrc):
    bundle = tmp_path / "aot"
    s, tk = cf.settings(tmp_path, KDACTL_AOT_DIR=str(bundle)), fake_toolkit(tmp_path)
    aot.write_bundle(bundle, [build(s, tiny_csrc, tk)])
    certify(s, tiny_csrc)
    before = (bundle / "sm_90a" / "libkdactl.so").read_bytes()
    rebuilt = build(s, tiny_csrc, tk, fresh=True)
    aot.write_bundle(bundle, [rebuilt])
    cache.discard_dir(rebuilt.directory)  # the bundle alone, as on a node without nvcc
    assert (bundle / "sm_90a" / "libkdactl.so").read_bytes() != before
    assert gate(s, tiny_csrc).exit_code == 0
    os.chmod(bundle / "sm_90a" / "libkdactl.so", 0o644)
    (bundle / "sm_90a" / "libkdactl.so").write_bytes(before)  # bytes the bundle's manifest does not name
    rep = gate(s, tiny_csrc)
    assert rep.exit_code == 1 and "no valid library now" in rep.failures[0], rep.failures


def test_a_certificate_without_build_keys_still_compares_the_bytes():
    """Certificates written before build keys were recorded stay judged as they were."""
    now = fp.Fingerprint(NODE.gpu_uuids, NODE.driver_version, "13.0", {"sm_90a": fp.Artifact("cd" * 32, cf.BUILD)})
    old = {k: v for k, v in now.to_json().items() if k != "artifact_build"}
    assert fp.compare({**old, "artifact_sha256": {"sm_90a": "cd" * 32}}, now) == []
    assert fp.compare({**old, "artifact_sha256": {"sm_90a": cf.SHA}}, now) == [
        "kernel library sm_90a changed: sha256 abababababababab... at certification, cdcdcdcdcdcdcdcd... now"]


def test_a_rebuild_by_the_real_nvcc_passes_the_gate(tmp_path, tiny_csrc, nvcc_toolkit):
    s = cf.settings(tmp_path)
    first = build(s, tiny_csrc, nvcc_toolkit)
    certify(s, tiny_csrc)
    again = build(s, tiny_csrc, nvcc_toolkit, fresh=True)
    assert again.built
    rep = gate(s, tiny_csrc)
    assert rep.exit_code == 0 and rep.failures == [], rep.failures
    print("real nvcc rebuild bit-identical:", again.manifest["files"] == first.manifest["files"])

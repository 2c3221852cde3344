"""kdactl.jit.spec and the generated build.ninja: the build unit as data, no compiler needed."""

import shutil

import pytest

from kdactl.jit.build import render_build_ninja
from kdactl.jit.spec import kernel_library_spec
from kdactl.targets import TARGETS, get_target

ARCH_FLAGS = ("-gencode", "-arch", "--gpu-architecture", "-DKDACTL_TARGET")  # the flags that name an architecture


def _flags(spec):
    return [*spec.compile_flags(), *spec.link_flags()]


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_exactly_one_gencode_per_compile_and_link(name, tiny_csrc):
    spec = kernel_library_spec(get_target(name), tiny_csrc)
    for flags in (spec.compile_flags(), spec.link_flags()):
        gencodes = [f for f in flags if f.startswith("-gencode") or f in ("-arch", "--gpu-architecture")]
        assert gencodes == [TARGETS[name].gencode]
    assert f"-D{TARGETS[name].define}" in spec.compile_flags()


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_no_other_target_leaks_into_the_flags(name, tiny_csrc):
    flags = " ".join(_flags(kernel_library_spec(get_target(name), tiny_csrc)))
    for other in TARGETS.values():
        if other.name != name:
            assert other.define not in flags
            assert other.gencode not in flags


def test_sm90a_flags_name_no_blackwell_arch(tiny_csrc):
    # those flags only: a path (pytest's numbered temporary folders) may hold "100"
    arch = [f for f in _flags(kernel_library_spec(get_target("sm_90a"), tiny_csrc)) if f.startswith(ARCH_FLAGS)]
    assert any("compute_90a" in f for f in arch) and not any("100" in f or "120" in f for f in arch), arch


def test_common_flags(tiny_csrc):
    spec = kernel_library_spec(get_target("sm_90a"), tiny_csrc)
    flags = spec.compile_flags()
    for flag in ("-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo", f"-I{tiny_csrc.resolve()}"):
        assert flag in flags
    assert flags[flags.index("-Xcompiler") + 1] == "-fPIC"
    assert "-shared" in spec.link_flags()


def test_sources_are_every_cu_sorted_and_headers_every_cuh_and_h(tiny_csrc):
    (tiny_csrc / "kda_new.cu").write_text("// new kernel file\n")
    spec = kernel_library_spec(get_target("sm_90a"), tiny_csrc)
    assert [p.name for p in spec.sources] == ["kda_new.cu", "kda_stub.cu", "library.cu", "selftest.cu"]
    assert {"common.cuh", "kdactl_api.h"} <= {p.name for p in spec.headers}
    assert not set(spec.sources) & set(spec.headers)


def test_key_changes_when_a_header_changes(tiny_csrc):
    spec = kernel_library_spec(get_target("sm_90a"), tiny_csrc)
    before = spec.source_hash()
    with open(tiny_csrc / "common.cuh", "a") as f:
        f.write("\n// a comment is enough\n")
    after = spec.source_hash()
    assert before != after
    assert spec.key_dir("/c", before) != spec.key_dir("/c", after)


def test_key_changes_when_a_kernel_file_is_added(tiny_csrc):
    before = kernel_library_spec(get_target("sm_90a"), tiny_csrc).source_hash()
    (tiny_csrc / "kda_new.cu").write_text("// new\n")
    assert kernel_library_spec(get_target("sm_90a"), tiny_csrc).source_hash() != before


def test_key_differs_per_target_and_version(tiny_csrc):
    a = kernel_library_spec(get_target("sm_90a"), tiny_csrc)
    b = kernel_library_spec(get_target("sm_100f"), tiny_csrc)
    assert a.source_hash() != b.source_hash()
    from dataclasses import replace

    assert replace(a, version="9.9.9").source_hash() != a.source_hash()


def test_key_does_not_depend_on_where_csrc_lives(tiny_csrc, tmp_path):
    moved = tmp_path / "elsewhere" / "csrc"
    shutil.copytree(tiny_csrc, moved)
    a = kernel_library_spec(get_target("sm_90a"), tiny_csrc).source_hash()
    assert kernel_library_spec(get_target("sm_90a"), moved).source_hash() == a


def test_key_dir_layout(tiny_csrc, tmp_path):
    spec = kernel_library_spec(get_target("sm_100f"), tiny_csrc)
    key = spec.key_dir(tmp_path)
    assert key.parent == tmp_path / spec.version / "sm_100f"
    assert key.name == f"kdactl-{spec.source_hash()[:16]}"


def test_real_csrc_spec_has_the_library_and_selftest():
    spec = kernel_library_spec(get_target("sm_90a"))
    names = {p.name for p in spec.sources}
    assert {"library.cu", "selftest.cu"} <= names
    assert "kdactl_api.h" in {p.name for p in spec.headers}


def test_build_ninja_has_one_compile_edge_per_source_and_one_link(tiny_csrc):
    spec = kernel_library_spec(get_target("sm_90a"), tiny_csrc)
    text = render_build_ninja(spec, "/opt/cuda/bin/nvcc")
    compile_edges = [ln for ln in text.splitlines() if ln.startswith("build ") and ": compile " in ln]
    link_edges = [ln for ln in text.splitlines() if ln.startswith("build ") and ": link " in ln]
    assert len(compile_edges) == len(spec.sources)
    assert link_edges == ["build libkdactl.so: link kda_stub.o library.o selftest.o"]
    assert text.count("-gencode") == 2  # compile flags and link flags, one each
    assert "nvcc = /opt/cuda/bin/nvcc" in text


def test_build_ninja_escapes_paths_with_spaces(tmp_path, tiny_csrc):
    spaced = tmp_path / "with space" / "csrc"
    shutil.copytree(tiny_csrc, spaced)
    text = render_build_ninja(kernel_library_spec(get_target("sm_90a"), spaced), "nvcc")
    assert "with$ space" in text  # ninja path escape in the edge
    assert "'" in text  # shell quoting in the command variables

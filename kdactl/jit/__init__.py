"""Build and load the kernel library: described as data (spec), built by one ninja/nvcc builder
into a per-user cache (build, cache), bundled ahead of time (aot), loaded through ctypes (library),
proved by a device self-test (selftest); which target a node loads is the resolver's answer
(resolver). ``kdactl build`` is kdactl.build_command.

Importing this package does nothing: submodules are imported where used.
"""

"""The node validation suite that `kdactl certify` runs on a GPU node (see issue: validation suite)."""

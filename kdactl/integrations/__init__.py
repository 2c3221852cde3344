"""How kdactl plugs into the schedulers that act on its certificate: Slurm (drain/resume) and
Kubernetes (Node Feature Discovery labels)."""

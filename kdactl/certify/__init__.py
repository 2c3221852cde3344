"""``kdactl certify``, ``verify`` and ``gate``: run every check of the node in time-limited worker
processes (orchestrate, worker, stages), write a signed certificate (certificate) and its JUnit and
Prometheus companions (outputs), check one (verify), and answer fast from the cached one (gate).

Importing this package does nothing: ``kdactl gate`` imports only gate.py and what it needs, and
never torch.
"""

"""Fleet: many nodes' certificates in one SQLite store (store), and the report over them (report)."""

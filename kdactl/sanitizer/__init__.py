"""compute-sanitizer in one place: ``parse`` judges a tool's own output (SPEC:
``kdactl.sanitizer.parse_output``), ``faultlib`` builds and launches the planted faults that prove
each tool (the positive controls), ``run`` runs the controls and the routes' payload under each tool
(``kdactl sanitize``, and certify's sanitize stage)."""

from kdactl.sanitizer.parse import TOOLS, SanitizerResult, detect_tool, parse_output

__all__ = ["TOOLS", "SanitizerResult", "detect_tool", "parse_output"]

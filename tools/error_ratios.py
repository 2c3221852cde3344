"""Summarize the error ratios the GPU tests print into their JUnit files (pytest -o junit_logging=system-out):
one line per test, then the largest o and state ratios.   python3 tools/error_ratios.py OUT/gpu.xml ..."""
import re
import sys
import xml.etree.ElementTree as ET

worst = {"o": (0.0, ""), "state": (0.0, "")}
for path in sys.argv[1:]:
    for case in ET.parse(path).iter("testcase"):
        out = case.findtext("system-out") or ""
        for m in re.finditer(r"error ratio o=([0-9.eE+-]+) state=([0-9.eE+-]+)", out):
            name = case.get("name")
            print(f"{name}: o={m[1]} state={m[2]}")
            for key, val in (("o", float(m[1])), ("state", float(m[2]))):
                if val >= worst[key][0]:
                    worst[key] = (val, name)
print(f"max o {worst['o'][0]:.3e} ({worst['o'][1]}); max state {worst['state'][0]:.3e} ({worst['state'][1]})")

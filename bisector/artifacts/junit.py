"""JUnit XML for CI servers: one test case per model output, failures carrying the numbers."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from typing import Mapping

from bisector.compare import OutputComparison
from bisector.files import write_bytes_atomic
from bisector.text import xml_text


@dataclass
class Case:
    model: str
    name: str
    passed: bool
    message: str = ""
    seconds: float = 0.0
    error: bool = False  # an error (exit 2/3), not an accuracy failure


@dataclass
class Suite:
    name: str = "bisector"
    cases: list[Case] = field(default_factory=list)

    def add_outputs(self, model: str, outputs: Mapping[str, OutputComparison], seconds: float = 0.0) -> None:
        for out, r in outputs.items():
            msg = "" if r.passed else (
                f"output {out!r} exceeds tolerance ({r.stat}: needs abs {r.required_abs:.4g} / rel {r.required_rel:.4g}, "
                f"tolerance abs {r.atol:g} / rel {r.rtol:g})" + (f"; {r.reason}" if r.reason else ""))
            self.cases.append(Case(model, out, r.passed, msg, seconds))

    def to_xml(self) -> bytes:
        failures = sum(1 for c in self.cases if not c.passed and not c.error)
        errors = sum(1 for c in self.cases if c.error)
        root = ET.Element("testsuites", name=self.name, tests=str(len(self.cases)), failures=str(failures), errors=str(errors))
        suites: dict[str, ET.Element] = {}
        for c in self.cases:
            suite = suites.get(c.model)
            if suite is None:
                suite = suites[c.model] = ET.SubElement(root, "testsuite", name=xml_text(c.model))
            tc = ET.SubElement(suite, "testcase", classname=xml_text(c.model), name=xml_text(c.name),
                               time=f"{c.seconds:.3f}")
            if not c.passed:  # names come from the model: XML 1.0 cannot carry control characters at all
                message = xml_text(c.message)
                ET.SubElement(tc, "error" if c.error else "failure", message=message[:500]).text = message
        for model, suite in suites.items():
            cases = [c for c in self.cases if c.model == model]
            suite.set("tests", str(len(cases)))
            suite.set("failures", str(sum(1 for c in cases if not c.passed and not c.error)))
            suite.set("errors", str(sum(1 for c in cases if c.error)))
        return ET.tostring(root, encoding="utf-8", xml_declaration=True)

    def write(self, path: Path) -> None:
        write_bytes_atomic(path, self.to_xml())

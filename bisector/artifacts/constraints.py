"""`constraints.json`: the versioned, machine-readable result of a search (DESIGN §8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, Field

from bisector.errors import UsageError
from bisector.files import write_text_atomic

SCHEMA_VERSION = 1


class Evaluations(BaseModel):
    total: int = Field(description="distinct plans judged for this search (new + cached)")
    new: int
    cached: int = Field(description="answered from the journal of an earlier run")


class Golden(BaseModel):
    source: str = Field(description="computed | cache | file")
    reference_runs: int = 0
    runner: Optional[str] = Field(default=None, description="source file: the runner of --load-outputs used as golden")


class Constraints(BaseModel):
    schema_version: int = SCHEMA_VERSION
    tool_version: str
    model: str
    model_sha256: str
    backend: dict[str, str]
    precision: str = "fp16"
    tolerances: dict[str, Any]
    inputs: dict[str, Any]
    fp32_nodes: list[str]
    passed: bool
    minimal: bool
    stop_reason: Optional[str] = None
    evaluations: Evaluations
    golden: Golden
    strategy: str
    candidates: int
    pinned: dict[str, str] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)
    outputs: dict[str, Any] = Field(default_factory=dict, description="per-output comparison of the final plan, "
                                    "on its worst input set")
    headroom: Optional[float] = Field(None, description="1 - (worst error / tolerance) of the final set on the "
                                      "backend that judged it; None when it does not pass")
    objective: str = Field("count", description="what the search minimised: count (nodes) or flops")
    fp32_cost: dict[str, float] = Field(default_factory=dict, description="estimated FP32 cost (MACs/elements, "
                                        "bisector.costs) of the set and of all candidates")
    confirmed_on: Optional[str] = Field(None, description="the backend that re-judged (and, where needed, extended) "
                                        "the final set with --confirm-on")
    machine: dict[str, str] = Field(default_factory=dict, description="CPU, instruction set and ONNX Runtime "
                                    "version the verdicts were measured with")
    worst_input_set: int = Field(0, description="index of the input set on which the final plan is furthest from "
                                 "tolerance (a plan passes only if it passes on every set)")

    def write(self, path: Path) -> None:
        write_text_atomic(path, self.model_dump_json(indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> "Constraints":
        try:
            return cls.model_validate_json(Path(path).read_text())
        except FileNotFoundError:
            raise UsageError(f"constraints file not found: {path}") from None
        except Exception as exc:
            raise UsageError(f"{path} is not a bisector constraints.json ({str(exc).splitlines()[0]})") from None

"""`constraints.json`: the versioned, machine-readable result of a search (DESIGN §8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, Field, ValidationError, model_validator

from bisector.errors import UsageError
from bisector.files import write_text_atomic

SCHEMA_VERSION = 1


class Evaluations(BaseModel):
    total: int = Field(description="distinct plans judged for this search (new + cached)")
    new: int
    cached: int = Field(description="answered from the journal of an earlier run")
    emulator_runs: int = Field(0, description="single-node CPU emulator runs of the predicted ranking of a diffuse "
                               "search (not evaluations: no plan judged, no engine built)")
    screened: int = Field(0, description="new evaluations that failed on the batch item(s) judged first, without "
                          "running the whole batch (their verdict is the batch's; bisector.search.screen)")


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
    strategy_options: dict[str, Any] = Field(default_factory=dict, description="--strategy-option values given")
    candidates: int
    pinned: dict[str, str] = Field(default_factory=dict)
    unjudged_branches: dict[str, int] = Field(default_factory=dict, description="If candidates whose branches "
                                              "computed FP32 in every verdict (each If lowered as one unit) -> "
                                              "their computing nodes: FP16 inside them was not judged")
    fp16_unreachable: dict[str, Any] = Field(default_factory=dict, description="outputs with golden values no "
                                             "FP16 value meets within the tolerance (bisector.search.unreachable): "
                                             "how many, an example, the share near FP16's resolution "
                                             "(`coarse_share`) and the nodes every passing set keeps FP32")
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
    node_by_node: Optional[dict[str, Any]] = Field(None, description="the final set judged again on emulate with "
                                                   "every node of its FP16 cone run alone (bisector.app."
                                                   "second_opinion): passed, excess, whether the set the search "
                                                   "found passed so, and whether the search went on from it "
                                                   "(`extended`); None: not judged so (another backend, "
                                                   "--confirm-on, --second-opinion off, nothing FP16, no time left)")
    held_out: Optional[dict[str, Any]] = Field(None, description="the final set judged on input sets the search did "
                                               "not use (--held-out; bisector.app.held_out): input_sets, seeds, "
                                               "passed, failed_sets, excess (worst) and excess_per_set; with "
                                               "--grow-inputs, grown (per round: seeds, set_before, set_after, added, "
                                               "dropped, evaluations, passed) and searched_input_sets, passed None "
                                               "where the set grown last was not judged; None: not judged so (inputs "
                                               "from files or a script, --held-out 0, a failing search, no time "
                                               "left)")
    machine: dict[str, str] = Field(default_factory=dict, description="CPU, instruction set, ONNX Runtime "
                                    "version and its threads (`ort_threads`) the verdicts were measured with")
    worst_input_set: int = Field(0, description="index of the input set on which the final plan is furthest from "
                                 "tolerance (a plan passes only if it passes on every set)")

    @model_validator(mode="before")
    @classmethod
    def _utf8(cls, data: Any) -> Any:
        """A non-UTF-8 file name (surrogate escapes) is recorded readably (`caf\\xe9.onnx`) instead of failing."""
        from bisector.text import utf8_tree

        return utf8_tree(data) if isinstance(data, dict) else data

    def write(self, path: Path) -> None:
        write_text_atomic(path, self.model_dump_json(indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> "Constraints":
        """Load and check a constraints.json: its schema_version first (a file of a newer bisector, or of an unknown
        schema, is refused by name instead of being half understood), then every field."""
        import json

        try:
            raw = Path(path).read_bytes()
        except FileNotFoundError:
            raise UsageError(f"constraints file not found: {path}") from None
        except IsADirectoryError:
            raise UsageError(f"{path} is a directory, not a constraints.json") from None
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: [[[[… nested too deep
            raise UsageError(f"{path} is not a bisector constraints.json (not JSON: {exc})") from None
        if not isinstance(doc, dict):
            raise UsageError(f"{path} is not a bisector constraints.json (not a JSON object)")
        version = doc.get("schema_version")
        if type(version) is not int:
            raise UsageError(f"{path}: schema_version is {version!r}; a bisector constraints.json has an integer "
                             f"schema_version (this bisector reads {SCHEMA_VERSION})")
        if version != SCHEMA_VERSION:
            newer = " (written by a newer bisector: upgrade bisector to read it)" if version > SCHEMA_VERSION else ""
            raise UsageError(f"{path}: schema_version {version} is not supported; this bisector reads "
                             f"schema_version {SCHEMA_VERSION}{newer}")
        try:
            return cls.model_validate(doc)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ())) or "?"
            raise UsageError(f"{path} is not a valid bisector constraints.json: field {where!r}: {first.get('msg')}"
                             + (f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else "")) from None


class DebugConstraints(Constraints):
    """constraints.json of `debug precision`: the usual record plus the check and every verdict."""

    check: dict[str, Any] = Field(default_factory=dict, description="the check command, how its end is read, "
                                  "and every verdict (status, exit code or signal, seconds)")

"""The check-command backend of `debug precision`: a candidate FP32 set in, a pass/fail/error outcome out.

Per candidate it writes what the user's command expects where Polygraphy's `debug precision` would put it (the
iteration artifact, `polygraphy_debug.*` in the current directory by default):

- `<base>.onnx`: the strongly typed mixed-precision model of the candidate (`fp16.mixed.build_mixed_model`;
  BF16 with `--bf16`);
- `<base>.json`: the candidate's constraints (`fp32_nodes`, `fp16_nodes`, Polygraphy `--layer-precisions` and
  trtexec strings, model digest, iteration), readable by `bisector run --constraints`;
- `<base>.engine`: a TensorRT engine built with the candidate's precisions, only where TensorRT is installed (the
  TensorRT backend's builder);

then runs the command and classifies its end the way Polygraphy's `CheckCmdArgs` does (`--fail-code`,
`--ignore-fail-code`, `--fail-regex`), with two outcomes Polygraphy folds into "fail": a check that ran past
`--check-timeout` (`timeout`) and one killed by a signal (`crash`). See `OUTCOMES`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from bisector.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from bisector.fp16.plan import Plan
    from bisector.model.catalog import Catalog

log = logging.getLogger("bisector")

# status -> meaning (README "debug precision"): the first two are answers, the others are not
OUTCOMES = {
    "pass": "the check passed (exit code 0, or not a --fail-code, or an --ignore-fail-code; no --fail-regex match)",
    "fail": "the check failed: a failing exit code, or its output matched --fail-regex",
    "timeout": "the check ran past --check-timeout and was killed (with its process group)",
    "crash": "the check was killed by a signal (segfault, OOM killer, kill -9)",
    "error": "the candidate could not be prepared (engine build failure) or the check could not start",
}
ANSWERS = frozenset({"pass", "fail"})
OUTPUT_TAIL = 4000  # characters of the check's output kept per verdict (report, journal)


@dataclass
class CheckSpec:
    """The check command and how its end is read (Polygraphy's CheckCmdArgs)."""

    command: list[str]
    fail_codes: list[int] | None = None
    ignore_fail_codes: list[int] | None = None
    fail_regex: list[str] | None = None
    show_output: bool = False
    hide_fail_output: bool = False
    timeout: float | None = None

    def __post_init__(self) -> None:
        if not self.command:
            raise UsageError("--check needs a command: everything after --check is the check command "
                             "(e.g. --check polygraphy run polygraphy_debug.onnx --onnxrt --load-outputs golden.json)")
        if self.fail_codes and self.ignore_fail_codes:
            raise UsageError("--fail-code and --ignore-fail-code exclude each other (as in Polygraphy)")
        try:
            self.patterns = [re.compile(p) for p in (self.fail_regex or [])]
        except re.error as exc:
            raise UsageError(f"--fail-regex: not a regular expression: {exc}") from None
        if self.timeout is not None and not self.timeout > 0:
            raise UsageError(f"--check-timeout {self.timeout}: must be a positive number of seconds")

    def describe(self) -> dict[str, Any]:
        """What decides a verdict (the journal key): the command and how its end is read."""
        return {"command": list(self.command), "fail_codes": self.fail_codes,
                "ignore_fail_codes": self.ignore_fail_codes, "fail_regex": self.fail_regex}


@dataclass
class CheckOutcome:
    status: str  # a key of OUTCOMES
    returncode: int | None
    seconds: float
    reason: str
    signal: str | None = None
    output: str = ""  # the tail of stdout + stderr
    timeout: float | None = None  # the limit the check ran under


def classify(spec: CheckSpec, returncode: int, output: str) -> tuple[bool, str]:
    """Polygraphy's `is_status_success`, with the reason spelled out."""
    if spec.ignore_fail_codes and returncode in spec.ignore_fail_codes:
        return True, f"exit code {returncode} is an --ignore-fail-code"
    matched = None
    if spec.patterns:
        matched = next((p.pattern for p in spec.patterns if p.search(output)), None)
    if spec.fail_codes is not None:
        failed = returncode in spec.fail_codes
        if spec.patterns:
            failed = failed and matched is not None
        if failed:
            return False, (f"exit code {returncode} is a --fail-code" + (f" and the output matched --fail-regex "
                                                                       f"{matched!r}" if matched else ""))
        return True, f"exit code {returncode}: not a failure under --fail-code" + (
            "/--fail-regex" if spec.patterns else "")
    if spec.patterns:
        if matched is not None:
            return False, f"output matched --fail-regex {matched!r} (exit code {returncode})"
        return True, f"no --fail-regex match (exit code {returncode})"
    return (returncode == 0), f"exit code {returncode}"


def run_check(spec: CheckSpec, timeout: float | None = None, env: dict[str, str] | None = None) -> CheckOutcome:
    """Run the command once (in the current directory, like Polygraphy) and classify its end. `timeout`: the
    limit for this run (the smaller of --check-timeout and what --time-limit leaves)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(spec.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, env={**os.environ, **(env or {})})
    except OSError as exc:
        return CheckOutcome("error", None, time.perf_counter() - t0, f"the check could not start: {exc}")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        text = _text(out) + _text(err)
        return CheckOutcome("timeout", None, time.perf_counter() - t0, f"ran past {timeout:g}s and was killed",
                            output=text[-OUTPUT_TAIL:], timeout=timeout)
    except BaseException:  # Ctrl-C: take the check down with us
        _kill_group(proc)
        raise
    seconds = time.perf_counter() - t0
    stdout, stderr = _text(out), _text(err)
    text = stdout + stderr
    rc = proc.returncode
    if rc < 0:
        name = _signal_name(-rc)
        return CheckOutcome("crash", rc, seconds, f"killed by signal {name}", signal=name, output=text[-OUTPUT_TAIL:],
                            timeout=timeout)
    ok, reason = classify(spec, rc, text)
    outcome = CheckOutcome("pass" if ok else "fail", rc, seconds, reason, output=text[-OUTPUT_TAIL:], timeout=timeout)
    if (spec.show_output or (not ok and not spec.hide_fail_output)) and text.strip():
        level = logging.INFO if ok else logging.WARNING
        log.log(level, "check output (%s):\n========== CAPTURED STDOUT ==========\n%s"
                "========== CAPTURED STDERR ==========\n%s", outcome.status, stdout, stderr)
    return outcome


def in_process_command(command: Sequence[str]) -> list[str] | None:
    """The argv of `bisector …` when the check is bisector itself (`bisector run …`, `python -m bisector.cli.main
    run …`), else None. Such a check can run in this process: no interpreter start per candidate."""
    cmd = list(command)
    if cmd and Path(cmd[0]).name == "bisector":
        rest = cmd[1:]
    elif len(cmd) >= 3 and Path(cmd[0]).name.startswith("python") and cmd[1] == "-m" and \
            cmd[2] in ("bisector", "bisector.cli", "bisector.cli.main"):
        rest = cmd[3:]
    else:
        return None
    return rest if rest and rest[0] in ("run", "verify") else None


def run_in_process(spec: CheckSpec, argv: list[str]) -> CheckOutcome:
    """`bisector run …` as the check, called in this process with its output captured (no --check-timeout: it
    cannot be killed; use --subprocess-check for that)."""
    import contextlib
    import io

    from bisector.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    if rc == 130:  # the inner command caught Ctrl-C: it is ours
        raise KeyboardInterrupt
    seconds = time.perf_counter() - t0
    stdout, stderr = out.getvalue(), err.getvalue()
    text = stdout + stderr
    ok, reason = classify(spec, rc, text)
    if (spec.show_output or (not ok and not spec.hide_fail_output)) and text.strip():
        log.log(logging.INFO if ok else logging.WARNING, "check output (%s):\n========== CAPTURED STDOUT "
                "==========\n%s========== CAPTURED STDERR ==========\n%s", "pass" if ok else "fail", stdout, stderr)
    return CheckOutcome("pass" if ok else "fail", rc, seconds, reason + " (in process)", output=text[-OUTPUT_TAIL:])


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the check's process group, SIGKILL what is left after two seconds."""
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _text(data: bytes | None) -> str:
    return (data or b"").decode(errors="replace")


# ---- what a check command names ----------------------------------------------------------------------------


def names_engine(command: Sequence[str], engine_path: str | None = None) -> str | None:
    """The token of `command` that makes it need a TensorRT engine (a `*.engine` path, `--trt`, `--model-type
    engine`), or None."""
    for i, tok in enumerate(command):
        if tok.endswith(".engine") or (engine_path is not None and tok == engine_path):
            return tok
        if tok == "--trt":
            return tok
        if tok in ("--model-type", "--model-type=engine") and (tok.endswith("=engine") or
                                                             (i + 1 < len(command) and command[i + 1] == "engine")):
            return "--model-type engine"
    return None


def tensorrt_installed() -> bool:
    """A real TensorRT (not the stubs' empty namespace package) imports here."""
    try:
        from bisector.backends.trt_import import import_tensorrt

        import_tensorrt()
        return True
    except Exception:
        return False


# ---- the candidate's files ---------------------------------------------------------------------------------


@dataclass
class CandidateFiles:
    """Writes a candidate's iteration artifacts: `<base>.onnx`, `<base>.json` and (TensorRT) `<base>.engine`."""

    catalog: "Catalog"
    base: Path  # e.g. Path("polygraphy_debug")
    precision: str = "fp16"  # fp16 | bf16
    engine_builder: Any = None  # an EngineWriter, or None (no TensorRT)
    written: list[Path] = field(default_factory=list)

    @property
    def onnx_path(self) -> Path:
        return self.base.with_name(self.base.name + ".onnx")

    @property
    def json_path(self) -> Path:
        return self.base.with_name(self.base.name + ".json")

    @property
    def engine_path(self) -> Path:
        return self.base.with_name(self.base.name + ".engine")

    def paths(self) -> list[Path]:
        return [self.onnx_path, self.json_path] + ([self.engine_path] if self.engine_builder is not None else [])

    def write(self, plan: "Plan", iteration: int) -> dict[str, float]:
        """Write the files of `plan`; returns seconds per step."""
        from bisector.fp16.mixed import build_mixed_model

        t0 = time.perf_counter()
        model = build_mixed_model(self.catalog, plan)
        if self.precision == "bf16":
            model = to_bf16(model, self.catalog)
        _replace(self.onnx_path, model.SerializeToString())
        _replace(self.json_path, (json.dumps(self.document(plan, iteration), indent=2) + "\n").encode())
        seconds = {"write": time.perf_counter() - t0}
        if self.engine_builder is not None:
            t1 = time.perf_counter()
            data = self.engine_builder.build(plan)  # BuildFailure propagates: its own verdict
            _replace(self.engine_path, data)
            seconds["engine"] = time.perf_counter() - t1
        self.written = self.paths()
        return seconds

    def document(self, plan: "Plan", iteration: int) -> dict[str, Any]:
        """`<base>.json`: a constraints.json (so `bisector run --constraints <base>.json` and `verify` read it)
        with `passed: false` until judged, plus the FP16 nodes, layer-precision strings and the iteration."""
        from bisector import __version__
        from bisector.artifacts.add_constraints import layer_precision_strings_for
        from bisector.artifacts.constraints import Constraints, Evaluations, Golden

        order = {n: i for i, n in enumerate(self.catalog.candidates)}
        doc = Constraints(
            tool_version=__version__, model=str(self.catalog.path), model_sha256=self.catalog.sha256,
            backend={"backend": "candidate"}, precision=self.precision, tolerances={}, inputs={},
            fp32_nodes=sorted(plan.fp32), passed=False, minimal=False, evaluations=Evaluations(total=0, new=0, cached=0),
            golden=Golden(source="none"), strategy="debug precision candidate", candidates=len(self.catalog.candidates),
            pinned=dict(self.catalog.pinned), headroom=None, worst_input_set=0).model_dump(mode="json")
        doc.update({f"{self.precision}_nodes": sorted(plan.fp16, key=order.__getitem__), "iteration": iteration,
                    "onnx": self.onnx_path.name, "candidate": True,
                    "layer_precisions": layer_precision_strings_for(self.catalog, sorted(plan.fp32))})
        return doc

    def remove(self) -> None:
        for p in self.written:
            try:
                p.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("could not clean up %s: %s", p, exc)
        self.written = []


def _replace(path: Path, data: bytes) -> None:
    """Write then rename (the check never sees half a file), without fsync: these files live for one check, and a
    durable write costs more than the check's own start on some disks (docs/benchmarks.md)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot write the candidate file {path}: {exc.strerror or exc}") from None


def to_bf16(model, catalog: "Catalog"):
    """The FP16 mixed model retyped to BF16: FP16 tensors and Casts become BF16, and weights are converted again
    from the exact FP32 originals (round to nearest even; BF16 has FP32's range, so nothing clamps)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, numpy_helper

    FP16, BF16 = TensorProto.FLOAT16, TensorProto.BFLOAT16
    originals = {i.name: i for i in catalog.model.graph.initializer}
    constants = {n.output[0]: n for n in catalog.model.graph.node if n.op_type == "Constant"}

    def original(name: str):
        for suffix in ("__fp16_param", "__fp16"):
            if name.endswith(suffix):
                src = name[: -len(suffix)]
                if src in originals:
                    return numpy_helper.to_array(originals[src])
                if src in constants:
                    attr = next((a for a in constants[src].attribute if a.name == "value"), None)
                    if attr is not None:
                        return numpy_helper.to_array(attr.t)
        return None

    def bf16_tensor(name: str, values) -> onnx.TensorProto:
        bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        rounded = np.where(np.isnan(values), np.uint16(0x7FC0), rounded)
        t = onnx.helper.make_tensor(name, BF16, list(np.shape(values)), rounded.tobytes(), raw=True)
        return t

    def retype_graph(graph) -> None:
        for i, init in enumerate(graph.initializer):
            if init.data_type == FP16:
                src = original(init.name)
                values = src if src is not None else numpy_helper.to_array(init).astype(np.float32)
                graph.initializer[i].CopyFrom(bf16_tensor(init.name, values.astype(np.float32)))
        for vi in list(graph.value_info) + list(graph.input) + list(graph.output):
            if vi.type.tensor_type.elem_type == FP16:
                vi.type.tensor_type.elem_type = BF16
        for node in graph.node:
            for a in node.attribute:
                if node.op_type in ("Cast", "EyeLike", "RandomNormal", "RandomUniform") and a.name in ("to", "dtype") \
                        and a.i == FP16:
                    a.i = BF16
                if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == FP16:
                    src = numpy_helper.to_array(a.t).astype(np.float32)
                    a.t.CopyFrom(bf16_tensor(a.t.name, src))
                if a.type == onnx.AttributeProto.GRAPH:
                    retype_graph(a.g)
                for g in (a.graphs if a.type == onnx.AttributeProto.GRAPHS else []):
                    retype_graph(g)

    out = onnx.ModelProto()
    out.CopyFrom(model)
    retype_graph(out.graph)
    return out


class EngineWriter:
    """Serialized TensorRT engines of plans, through the TensorRT backend's builder (one timing cache for the
    whole search). Only constructed where TensorRT is installed."""

    def __init__(self, catalog: "Catalog", backend_options: dict[str, Any], precision: str = "fp16") -> None:
        from bisector.backends.tensorrt import TensorRTBackend

        accepted = ("precision_constraints", "strongly_typed", "load_timing_cache", "save_timing_cache",
                    "builder_optimization_level", "tactic_sources", "input_shapes", "module", "cudart")
        self.backend = TensorRTBackend(**{k: v for k, v in backend_options.items() if k in accepted and v is not None})
        self.backend.open(catalog)
        self.catalog = catalog
        self.precision = precision

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Build shapes: the model's static shapes, dynamic dimensions 1 (Polygraphy's default), --input-shapes."""
        shapes = {}
        for vi in self.catalog.model.graph.input:
            if vi.name not in self.catalog.input_names:
                continue
            dims = vi.type.tensor_type.shape.dim
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in dims)
        shapes.update(self.backend.options.input_shapes)
        return shapes

    def build(self, plan: "Plan") -> bytes:
        b = self.backend
        engines = b._engines
        if engines is None:
            from bisector.errors import BackendFailure

            raise BackendFailure("the TensorRT engine writer was used after close()")
        shapes = self.shapes()
        if b.path == "weak":
            assert b._weak is not None
            network = b._weak.apply(plan)
            config = engines.make_config(network, shapes)
            b._weak.set_flags(config)
        else:
            from bisector.fp16.mixed import build_mixed_model

            model = build_mixed_model(self.catalog, plan)
            if self.precision == "bf16":
                model = to_bf16(model, self.catalog)
            network, _parser = engines.parse(model.SerializeToString(), plan=plan)
            config = engines.make_config(network, shapes)
        return bytes(engines.build(network, config, plan))

    def describe(self) -> dict[str, str]:
        return self.backend.describe()

    def close(self) -> None:
        self.backend.close()

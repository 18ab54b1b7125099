"""Type-check the TensorRT backends against the installed `tensorrt-stubs` (no TensorRT needed).

    .venv/bin/python typecheck/check_tensorrt.py          # exit status is mypy's

Why a script and not just `mypy`: the stubs package installs `tensorrt/__init__.pyi` without a `py.typed` marker
(mypy then skips it and every `trt.X` silently becomes Any), and its generated `tensorrt_bindings/tensorrt.pyi`
has a few lines Python cannot parse (parameters named `in`, a parameter without default after defaulted ones).
This script copies the stubs to a temporary folder, repairs those lines mechanically (nothing else changes),
points MYPYPATH at the copy and runs mypy with typecheck/mypy-tensorrt.ini. It refuses to pass when the stubs
are missing or resolve to Any, so a green run means the TRT API calls were really checked.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIG = HERE / "mypy-tensorrt.ini"
PROBE = '''from typing import TYPE_CHECKING
if TYPE_CHECKING:
    import tensorrt as trt
def probe(layer: "trt.ILayer") -> None:
    x: int = layer.metadata  # must be an error: metadata is str in the stubs
'''


def _stub_root() -> Path:
    spec = importlib.util.find_spec("tensorrt_stubs")
    if spec is None or not spec.origin:
        sys.exit("tensorrt-stubs is not installed: pip install --no-deps 'tensorrt-stubs>=10.0'")
    return Path(spec.origin).resolve().parent.parent


def _repair(text: str) -> str:
    text = re.sub(r"(\(|, )in: ", r"\1in_: ", text)  # `in` is a keyword
    fixed = []
    for line in text.splitlines():
        m = re.match(r"^(\s*def \w+\()(.*)(\) -> .*:)$", line)
        if m and "=" in m.group(2):
            params, seen_default, out = m.group(2).split(", "), False, []
            for p in params:
                if "=" in p:
                    seen_default = True
                elif seen_default and not p.startswith("*") and ":" in p:
                    p += " = ..."
                out.append(p)
            line = m.group(1) + ", ".join(out) + m.group(3)
        fixed.append(line)
    return "\n".join(fixed) + "\n"


def main() -> int:
    site = _stub_root()
    with tempfile.TemporaryDirectory(prefix="trt-stubs-") as tmp:
        stubs = Path(tmp)
        for pkg in ("tensorrt", "tensorrt_bindings"):
            for src in (site / pkg).glob("*.pyi"):
                dst = stubs / pkg / src.name
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_text(_repair(src.read_text()))
        (stubs / "tensorrt_libs.pyi").write_text("")  # the stubs import it; it carries no API
        env = dict(os.environ, MYPYPATH=str(stubs))
        probe = stubs / "probe_any.py"
        probe.write_text(PROBE)
        check = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(CONFIG), str(probe)],
                               cwd=ROOT, env=env, capture_output=True, text=True)
        if "Incompatible types in assignment" not in check.stdout:
            print(check.stdout + check.stderr)
            print("the TensorRT stubs resolve to Any: this check would prove nothing", file=sys.stderr)
            return 2
        return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(CONFIG)], cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())

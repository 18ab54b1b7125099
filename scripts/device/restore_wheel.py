"""Rewrite wheels with every member STORED (uncompressed), byte-identical contents: `restore_wheel.py OUTDIR WHEEL...`.

Used by prepare.sh so that xz sees the raw bytes (much better ratio than over deflate). RECORD hashes are hashes
of the member contents, so the re-stored wheel installs exactly like the original.
"""

import sys
import zipfile
from pathlib import Path


def main(out: str, wheels: list[str]) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    for w in wheels:
        target = Path(out) / Path(w).name
        with zipfile.ZipFile(w) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as dst:
            for info in src.infolist():
                data = src.read(info)
                info.compress_type = zipfile.ZIP_STORED
                dst.writestr(info, data)
        print(f"stored {target} ({target.stat().st_size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

"""Pack a wheel from a CMake install tree, for a CPython that cannot run here.

scripts/build_wheels.sh builds the extension in a Debian 11 root for CPythons
whose headers it has but whose interpreters need a newer glibc than that root's:
pip cannot build those wheels, so this packs what scikit-build-core would have
(the package, `cmake --install`'s extension and patches, the metadata from
scikit-build-core's prepare_metadata_for_build_wheel) under the given tag.
Runs on the root's own Python (3.9), so it keeps to what 3.9 has.

    python assemble_wheel.py --source . --install STAGE --metadata META \
        --stub _native.pyi --tag cp311-cp311-linux_x86_64 --out DIR
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import sys
import zipfile
from pathlib import Path

SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = {".pyc", ".so"}


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"{name},sha256={digest.decode()},{len(data)}"


def _package_files(package: Path) -> list[tuple[str, Path]]:
    files = []
    for dirpath, dirnames, filenames in os.walk(package):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for filename in sorted(filenames):
            path = Path(dirpath) / filename
            if path.suffix in SKIP_SUFFIXES:
                continue
            files.append((f"mineru_health/{path.relative_to(package).as_posix()}", path))
    return files


def _installed_files(install: Path) -> list[tuple[str, Path]]:
    return [
        (path.relative_to(install).as_posix(), path)
        for path in sorted(install.rglob("*"))
        if path.is_file()
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--install", type=Path, required=True)
    parser.add_argument("--metadata", type=Path, required=True, help="the .dist-info directory")
    parser.add_argument("--stub", type=Path, required=True,
                        help="_native.pyi, generated where an interpreter could import the extension")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    dist_info = args.metadata.name
    name_version = dist_info[: -len(".dist-info")]
    members: dict[str, bytes] = {}
    for arcname, path in _package_files(args.source / "python" / "mineru_health"):
        members[arcname] = path.read_bytes()
    for arcname, path in _installed_files(args.install):
        members[arcname] = path.read_bytes()
    members["mineru_health/_native.pyi"] = args.stub.read_bytes()
    if not any(n.startswith("mineru_health/_native.") and n.endswith(".so") for n in members):
        print(f"no extension under {args.install}", file=sys.stderr)
        return 1
    for meta in ("METADATA", "entry_points.txt"):
        members[f"{dist_info}/{meta}"] = (args.metadata / meta).read_bytes()
    members[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\n"
        "Generator: mineru-health scripts/assemble_wheel.py\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {args.tag}\n"
    ).encode()

    record = [_record_line(name, data) for name, data in members.items()]
    record.append(f"{dist_info}/RECORD,,")
    members[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()

    args.out.mkdir(parents=True, exist_ok=True)
    wheel = args.out / f"{name_version}-{args.tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            if name.endswith(".so"):
                info.external_attr = 0o755 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

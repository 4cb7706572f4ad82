"""The build backend of the workd package (PEP 517 and PEP 660), standard
library only, so that `pip install ./clients/python` needs nothing from a
package index: setuptools would need `wheel`, and a build in isolation would
download both. It packs workd/ into a pure-Python wheel (or an sdist) with
the metadata below, the one place it is written."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "workd"


def _version() -> str:
    text = (ROOT / PACKAGE / "__init__.py").read_text(encoding="utf-8")
    m = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if not m:
        raise RuntimeError("workd/__init__.py: no __version__")
    return m.group(1)


NAME = "workd"
VERSION = _version()
METADATA_FIELDS: List[Tuple[str, str]] = [
    ("Metadata-Version", "2.1"),
    ("Name", NAME),
    ("Version", VERSION),
    ("Summary", "Client and worker for workd, a distributed work queue"),
    ("License", "Apache-2.0"),
    ("Requires-Python", ">=3.9"),
    ("Classifier", "License :: OSI Approved :: Apache Software License"),
    ("Classifier", "Programming Language :: Python :: 3"),
    ("Classifier", "Typing :: Typed"),
    ("Classifier", "Operating System :: OS Independent"),
    ("Description-Content-Type", "text/markdown"),
]
DIST_INFO = f"{NAME}-{VERSION}.dist-info"
TAG = "py3-none-any"


def _metadata() -> bytes:
    head = "".join(f"{k}: {v}\n" for k, v in METADATA_FIELDS)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return (head + "\n" + readme).encode("utf-8")


def _wheel_file() -> bytes:
    return (f"Wheel-Version: 1.0\nGenerator: workd_build {VERSION}\n"
            f"Root-Is-Purelib: true\nTag: {TAG}\n").encode()


def _sources() -> List[Path]:
    return [p for p in sorted((ROOT / PACKAGE).rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".typed")]


def _write_wheel(directory: str, files: Dict[str, bytes]) -> str:
    """Writes a wheel holding ``files`` (archive name: bytes) and the dist-info; returns its name."""
    files = dict(files)
    files[f"{DIST_INFO}/METADATA"] = _metadata()
    files[f"{DIST_INFO}/WHEEL"] = _wheel_file()
    record = io.StringIO()
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{name},sha256={digest},{len(data)}\n")
    record.write(f"{DIST_INFO}/RECORD,,\n")
    files[f"{DIST_INFO}/RECORD"] = record.getvalue().encode()
    name = f"{NAME}-{VERSION}-{TAG}.whl"
    stamp = _timestamp()
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in files.items():
            info = zipfile.ZipInfo(arcname, date_time=stamp)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return name


def _timestamp() -> Tuple[int, int, int, int, int, int]:
    """SOURCE_DATE_EPOCH when set (reproducible builds), else 1980-01-01."""
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
    return time.gmtime(max(epoch, 315532800))[:6]


# ---- PEP 517

def get_requires_for_build_wheel(config_settings: Optional[Dict[str, object]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, object]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict[str, object]] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: Optional[Dict[str, object]] = None) -> str:
    target = Path(metadata_directory) / DIST_INFO
    target.mkdir(parents=True, exist_ok=True)
    (target / "METADATA").write_bytes(_metadata())
    (target / "WHEEL").write_bytes(_wheel_file())
    return DIST_INFO


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, object]] = None,
                metadata_directory: Optional[str] = None) -> str:
    files = {p.relative_to(ROOT).as_posix(): p.read_bytes() for p in _sources()}
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory: str, config_settings: Optional[Dict[str, object]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    """A wheel whose .pth file puts this source tree on sys.path."""
    return _write_wheel(wheel_directory, {f"_{NAME}_editable.pth": f"{ROOT}\n".encode()})


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, object]] = None) -> str:
    base = f"{NAME}-{VERSION}"
    members = [ROOT / "pyproject.toml", ROOT / "README.md", Path(__file__).resolve(),
               *_sources()]
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        def add(arcname: str, data: bytes) -> None:
            info = tarfile.TarInfo(f"{base}/{arcname}")
            info.size, info.mode, info.mtime = len(data), 0o644, 315532800
            t.addfile(info, io.BytesIO(data))
        add("PKG-INFO", _metadata())
        for p in members:
            add(p.relative_to(ROOT).as_posix(), p.read_bytes())
    return name

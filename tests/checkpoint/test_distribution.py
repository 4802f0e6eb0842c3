"""fence/ is a distribution of its own, for training images: built from the repo
into a wheel (offline, with the venv's setuptools), it holds the dispatch_fence
package only, declares the Python it is tested on and its extras, and,
installed alone into an empty directory, publishes and reads a POSIX root under
`python -I -S` (no site-packages, no toolkit, no click)."""

from __future__ import annotations

import email.parser
import pathlib
import shutil
import subprocess
import sys
import zipfile

from tests.checkpoint import kit

RUN_MODULE = "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); runpy.run_module('dispatch_fence', run_name='__main__')"


def test_the_wheel_installs_alone_and_publishes(tmp_path: pathlib.Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(kit.REPO / "fence", source, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "build"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                            "-w", str(tmp_path / "wheels"), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheels").iterdir()
    assert wheel.name == "dispatch_fence-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = email.parser.Parser().parsestr(z.read("dispatch_fence-0.1.0.dist-info/METADATA").decode())
    assert sorted(n for n in names if ".dist-info/" not in n) == [
        f"dispatch_fence/{p.name}" for p in sorted(kit.FENCE.glob("*.py"))]
    assert meta["Requires-Python"] == ">=3.11"
    assert sorted(meta.get_all("Provides-Extra")) == ["dcp", "gcs", "lightning", "s3"]
    assert sorted(meta.get_all("Requires-Dist")) == ['google-cloud-storage==3.17.1; extra == "gcs"',
                                                     'lightning==2.6.6; extra == "lightning"',
                                                     'numpy==2.4.6; extra == "dcp"', 'obstore==0.12.1; extra == "s3"',
                                                     'torch==2.15.0; extra == "dcp"', 'torch==2.15.0; extra == "lightning"']

    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                                str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    staging, root = kit.staging(tmp_path, "j.1.0.1.0"), tmp_path / "root"
    for argv, want in ((["publish", str(staging), str(root)], 0), (["latest", str(root)], 0)):
        out = subprocess.run([sys.executable, "-I", "-S", "-c", RUN_MODULE, str(site), *argv], cwd=tmp_path,
                             env=kit.env(3, "j.1.0.1.0"), capture_output=True, text=True, timeout=60)
        assert (out.returncode, out.stderr) == (want, "")
        assert out.stdout == f"{root}/ckpt-0000000000000000003-000001-j.1.0.1.0\n"

"""fence/ is a distribution of its own, for training images: built from the repo
into a wheel (offline, with the venv's setuptools), it holds the dispatch_fence
package only (typed: py.typed), declares its license, the oldest Python it keeps
to and its extras, and, installed alone into an empty directory, publishes and
reads a POSIX root under `python -I -S` (no site-packages, no toolkit, no click).

The oldest Python is checked statically: vermin finds nothing in the fence that
3.10 lacks (and does find a 3.11 feature in a sample, so the check can fail).
The integrations' extras are ranges whose lower ends are the versions
`devcluster/build-torch-venv.sh lowest` installs, which the Lightning and
Hugging Face suites run besides the pinned set."""

from __future__ import annotations

import email.parser
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

from tests.checkpoint import kit

REQUIRES = ['obstore<0.13,>=0.7; extra == "s3"', 'google-cloud-storage<4,>=3; extra == "gcs"',
            'torch>=2.4; extra == "dcp"', 'numpy>=1.26; extra == "dcp"',
            'lightning<3,>=2.4; extra == "lightning"', 'torch>=2.4; extra == "lightning"',
            'transformers<6,>=4.46.1; extra == "huggingface"', 'accelerate>=1.0; extra == "huggingface"',
            'torch>=2.4; extra == "huggingface"']
"""The wheel's Requires-Dist: every extra a range."""
BUILD_TORCH = kit.REPO / "devcluster" / "build-torch-venv.sh"
LOWEST = kit.REPO / "devcluster" / "torch-lowest-constraints.txt"
VERMIN = pathlib.Path(sys.executable).parent / "vermin"
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
        license_text = z.read("dispatch_fence-0.1.0.dist-info/licenses/LICENSE")
    assert sorted(n for n in names if ".dist-info/" not in n) == sorted(
        [f"dispatch_fence/{p.name}" for p in kit.FENCE.glob("*.py")] + ["dispatch_fence/py.typed"])
    assert (meta["License-Expression"], meta["License-File"]) == ("Apache-2.0", "LICENSE")
    assert license_text == (kit.REPO / "LICENSE").read_bytes()
    assert meta["Requires-Python"] == ">=3.10"
    assert "Typing :: Typed" in meta.get_all("Classifier")
    assert sorted(meta.get_all("Provides-Extra")) == ["dcp", "gcs", "huggingface", "lightning", "s3"]
    assert sorted(meta.get_all("Requires-Dist")) == sorted(REQUIRES)

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


def vermin(*paths: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VERMIN), "--no-tips", "--violations", "--eval-annotations", "-t=3.10-", *map(str, paths)],
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_fence_needs_nothing_python_3_10_lacks() -> None:
    out = vermin(kit.FENCE)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_check_finds_what_3_10_lacks(tmp_path: pathlib.Path) -> None:
    (tmp_path / "newer.py").write_text("import tomllib\n")  # the standard library's since 3.11
    out = vermin(tmp_path / "newer.py")
    assert out.returncode != 0 and "tomllib" in out.stdout, out.stdout + out.stderr


def test_each_extras_lower_bound_is_what_the_lowest_venv_installs() -> None:
    lowest = dict(line.split("==") for line in LOWEST.read_text().splitlines() if not line.startswith("#"))
    pins = re.search(r"lowest\)\n\s+pins='([^']*)'", BUILD_TORCH.read_text())
    assert pins is not None
    installed = dict(pin.split("==") for pin in pins.group(1).split())
    floors = {m["name"]: m["floor"] for r in REQUIRES if (m := re.match(r"(?P<name>[\w-]+)[^;]*>=(?P<floor>[\d.]+)", r))}
    assert floors == {"obstore": "0.7", "google-cloud-storage": "3", "torch": "2.4", "numpy": "1.26", "lightning": "2.4",
                      "transformers": "4.46.1", "accelerate": "1.0"}
    for name, floor in floors.items():
        assert installed[name] == lowest[name], name
        assert [int(x) for x in installed[name].split(".")][:len(floor.split("."))] == [int(x) for x in floor.split(".")], (
            f"{name}: the lowest venv installs {installed[name]}, the extra allows {floor}")

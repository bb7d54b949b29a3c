"""The package as a user meets it: import, the library it loads, the version,
the whole C API bound, NCCL_NVLS_ENABLE, the runtime facts."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import megamoe
from fakes import gpu_visible
from megamoe import _lib

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "include" / "megamoe.h"


def _header_text():
    text = HEADER.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def test_import_loads_the_library():
    path = Path(megamoe.library_path())
    assert path.is_file()
    if os.environ.get("MEGAMOE_LIBRARY"):
        assert path == Path(os.environ["MEGAMOE_LIBRARY"])
    assert path.name.startswith("libmegamoe.so")


def test_version_matches_the_header_and_pyproject():
    text = HEADER.read_text()
    major = int(re.search(r"#define MEGAMOE_VERSION_MAJOR (\d+)", text).group(1))
    minor = int(re.search(r"#define MEGAMOE_VERSION_MINOR (\d+)", text).group(1))
    assert megamoe.__version__ == f"{major}.{minor}"
    assert _lib.lib.megamoe_version() == major * 1000 + minor
    pyproject = (ROOT / "python" / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1) == f"{major}.{minor}"


def test_every_function_of_the_header_is_bound():
    declared = set(re.findall(r"\b(megamoe_[a-z0-9_]+)\s*\(", _header_text()))
    bound = {name for name, _, _ in _lib.PROTOTYPES}
    assert declared, "no declaration found in the header"
    assert declared - bound == set(), "declared in megamoe.h, not bound in _lib.PROTOTYPES"
    assert bound - declared == set(), "bound, not declared in megamoe.h"
    for name in declared:
        assert getattr(_lib.lib, name) is not None


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm not installed")
def test_the_library_exports_exactly_the_header_api():
    out = subprocess.run(["nm", "-D", "--defined-only", megamoe.library_path()], capture_output=True, text=True,
                         check=True).stdout
    symbols = [line.split() for line in out.splitlines() if len(line.split()) >= 3]
    exported = {s[-1] for s in symbols if s[-1].startswith("megamoe_")}
    declared = set(re.findall(r"\b(megamoe_[a-z0-9_]+)\s*\(", _header_text()))
    assert exported == declared
    others = [s[-1] for s in symbols if s[1] in "TtDdBbRr" and not s[-1].startswith(("megamoe_", "_"))]
    assert others == [], f"symbols beyond the API exported: {others[:10]}"


def _python(code, env_update):
    env = dict(os.environ)
    env.pop("NCCL_NVLS_ENABLE", None)
    env.update(env_update)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_import_sets_nvls_off_when_unset():
    r = _python("import os, megamoe; print(os.environ['NCCL_NVLS_ENABLE'])", {})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"


def test_import_keeps_a_zero_the_c_layer_accepts():
    r = _python("import os, megamoe; print(os.environ['NCCL_NVLS_ENABLE'])", {"NCCL_NVLS_ENABLE": "00"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "00"


@pytest.mark.parametrize("value", ["1", "2", "", "0x0", "no"])
def test_import_refuses_any_other_value(value):
    r = _python("import megamoe", {"NCCL_NVLS_ENABLE": value})
    assert r.returncode != 0
    assert "ImportError" in r.stderr
    assert f"NCCL_NVLS_ENABLE is {value!r}, not 0" in r.stderr
    assert "multicast" in r.stderr


def test_nvls_rule_is_the_c_layers():
    for ok in ("0", "00", "-0", "+0", " 0"):
        assert megamoe.nvls_problem({"NCCL_NVLS_ENABLE": ok}) is None, ok
    for bad in ("1", "0 ", "0x0", "", "zero"):
        assert "NCCL_NVLS_ENABLE" in megamoe.nvls_problem({"NCCL_NVLS_ENABLE": bad}), bad
    assert "unset" in megamoe.nvls_problem({})


def test_runtime_info():
    info = megamoe.runtime_info()
    assert info["version"] == megamoe.__version__
    assert info["library"] == megamoe.library_path()
    major, minor, _ = (int(p) for p in info["nccl_header"].split("."))
    assert (major, minor) >= (2, 28)
    assert re.fullmatch(r"\d+\.\d+\.\d+", info["nccl_loaded"])
    assert any("libnccl" in f for f in info["nccl_files"])
    assert info["nvls_enable"] is not None


def test_unique_id_is_128_fresh_bytes():
    a, b = megamoe.unique_id(), megamoe.unique_id()
    assert isinstance(a, bytes) and len(a) == 128
    assert a != b


@pytest.mark.skipif(gpu_visible(), reason="a GPU is visible")
def test_device_calls_without_a_gpu_say_so():
    with pytest.raises(megamoe.NoDeviceError, match="no CUDA device"):
        megamoe.current_device()
    with pytest.raises(megamoe.NoDeviceError):
        megamoe.set_device(0)

"""Golden vectors: the set shipped in fp4sim/golden/data is bit-identical to what the emulators give now,
and ``check`` catches a corrupted file, a changed emulator bit, a missing or extra case, and a
shrunk set, each time naming the case."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import fp4sim.formats
from fp4sim import golden

STORED = golden.DATA_DIR
CASE = "formats.e2m1.all_codes"  # a small case the failure tests tamper with


def test_stored_golden_set_is_bit_identical():
    n = golden.check(STORED)
    assert n == len(golden.CASES) >= 20


def test_manifest_describes_every_array():
    manifest = json.loads((STORED / "manifest.json").read_text())
    assert manifest["format_version"] == golden.FORMAT_VERSION
    assert manifest["min_cases"] == len(manifest["cases"]) == len(golden.CASES)
    assert "golden write" in manifest["regenerate"]
    for name, entry in manifest["cases"].items():
        with np.load(STORED / entry["file"], allow_pickle=False) as z:
            assert sorted(z.files) == sorted(entry["arrays"]), name
            for key, meta in entry["arrays"].items():
                a = z[key]
                assert a.dtype in golden.PLAIN_DTYPES, (name, key, a.dtype)
                assert a.dtype.str == meta["dtype"] and list(a.shape) == meta["shape"], (name, key)
                assert golden.array_sha256(a) == meta["sha256"], (name, key)


def test_format_doc_exists_and_names_the_layout():
    text = (STORED / "FORMAT.md").read_text()
    for word in ("manifest.json", "sha256", ".npy", "uint8", "float32", "little-endian"):
        assert word in text


def test_write_is_byte_reproducible(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    golden.write(a, [CASE])
    golden.write(b, [CASE])
    name = golden.CASES[CASE].name + ".npz"
    assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / name).read_bytes() == (STORED / name).read_bytes()


def test_all_codes_case_matches_an_independent_ml_dtypes_decode():
    arrays = golden.generate(CASE)
    codes, values = arrays["codes"], arrays["values"]
    assert codes.dtype == np.uint8 and values.dtype == np.float32
    np.testing.assert_array_equal(values, codes.view(fp4sim.formats.E2M1.dtype).astype(np.float32))


@pytest.fixture
def stored_copy(tmp_path) -> Path:
    d = tmp_path / "golden"
    shutil.copytree(STORED, d)
    return d


def test_corrupted_file_fails_naming_the_case(stored_copy):
    path = stored_copy / f"{CASE}.npz"
    blob = bytearray(path.read_bytes())
    blob[-40] ^= 0x01
    path.write_bytes(bytes(blob))
    with pytest.raises(golden.GoldenMismatch) as e:
        golden.check(stored_copy, [CASE])
    assert CASE in str(e.value) and "corrupted" in str(e.value)


def test_changed_emulator_bit_fails_naming_the_case_and_array(stored_copy, monkeypatch):
    real = fp4sim.formats.decode

    def decode_with_one_flipped_bit(codes, fmt):
        v = np.array(real(codes, fmt), dtype=np.float32)
        bits = v.view(np.uint32)
        bits[3] ^= 1
        return v

    monkeypatch.setattr(fp4sim.formats, "decode", decode_with_one_flipped_bit)
    with pytest.raises(golden.GoldenMismatch) as e:
        golden.check(stored_copy, [CASE])
    msg = str(e.value)
    assert CASE in msg and "'values'" in msg and "1 of 16" in msg and "index (3,)" in msg


def test_missing_file_and_missing_case_fail(stored_copy):
    (stored_copy / f"{CASE}.npz").unlink()
    with pytest.raises(golden.GoldenMismatch, match=f"{CASE}: file .* is missing"):
        golden.check(stored_copy, [CASE])
    manifest = json.loads((stored_copy / "manifest.json").read_text())
    del manifest["cases"][CASE]
    (stored_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(golden.GoldenMismatch) as e:
        golden.check(stored_copy)
    assert f"{CASE}: registered but absent from the manifest" in str(e.value)
    assert "fewer than min_cases" in str(e.value)


def test_registry_rejects_bad_cases():
    with pytest.raises(ValueError, match="registered twice"):
        golden.register(CASE, description="dup")(lambda: {"a": np.zeros(1)})
    with pytest.raises(ValueError, match="package.topic.variant"):
        golden.GoldenCase(name="nodots", make=dict, description="")
    bad = golden.GoldenCase(
        name="x.y.z", make=lambda: {"a": np.zeros(2, np.float16)}, description=""
    )
    with pytest.raises(TypeError, match="float16"):
        bad.generate()
    with pytest.raises(ValueError, match="not a golden case"):
        golden.generate("x.y.nope")


def test_every_shipped_file_is_package_data():
    # the wheel must carry the whole set: `python -m fp4sim golden check` reads it from there
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parents[1]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["fp4sim.golden"]
    base = Path(golden.__file__).resolve().parent
    files = [p.relative_to(base).as_posix() for p in golden.DATA_DIR.rglob("*") if p.is_file()]
    assert len(files) > len(golden.CASES)
    left_out = [
        f
        for f in files
        if not any(fnmatch.fnmatch(f, g) and f.count("/") == g.count("/") for g in globs)
    ]
    assert not left_out, f"files in {golden.DATA_DIR} that the wheel would not carry: {left_out}"

"""ISA detection (x86 levels and AVX-512 extensions, aarch64 NEON/SVE) and the AUTOFUSION_ISA override."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from graph_autofusion.backend.cpu import isa
from graph_autofusion.backend.cpu.compiler import compiler_identity
from graph_autofusion.errors import InvalidConfigError

V2 = {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}
V3 = V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
V4 = V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
ICE_LAKE = V4 | {"avx512_vnni", "avx512ifma", "avx512_vbmi2"}
SAPPHIRE_RAPIDS = ICE_LAKE | {"avx512_bf16", "avx512_fp16", "amx_tile"}


def test_level_from_cpuinfo_flags() -> None:
    assert isa.level_from_flags(set()) == 1
    assert isa.level_from_flags(V2) == 2
    assert isa.level_from_flags(V3) == 3
    assert isa.level_from_flags(V4) == 4
    assert isa.level_from_flags(V3 - {"fma"}) == 2  # one missing flag drops the level
    assert isa.level_from_flags(V4 - V3 | V2) == 2  # AVX-512 without AVX2 is not v4


@pytest.mark.parametrize(
    ("arch", "flags", "name"),
    [
        ("x86_64", V3, "x86-64-v3"),
        ("x86_64", V4, "x86-64-v4"),
        ("x86_64", ICE_LAKE, "x86-64-v4+avx512vnni"),
        ("x86_64", SAPPHIRE_RAPIDS, "x86-64-v4+avx512bf16+avx512vnni"),
        # VNNI without the AVX-512 foundation (a masked VM) is not usable: EVEX needs v4
        ("x86_64", V3 | {"avx512_vnni"}, "x86-64-v3"),
        ("aarch64", {"fp", "asimd", "evtstrm", "aes", "crc32"}, "aarch64"),
        ("aarch64", {"fp", "asimd", "asimdhp", "asimddp", "sve", "sve2", "bf16", "i8mm"},
         "aarch64+bf16+dotprod+fp16+i8mm+sve+sve2"),
        ("riscv64", {"rv64imafdc"}, "riscv64"),
    ],
)  # fmt: skip
def test_isa_from_cpuinfo_flags(arch: str, flags: set[str], name: str) -> None:
    assert isa.isa_from_flags(arch, flags).name == name


def test_cpuinfo_flags_read_x86_flags_and_arm_features(tmp_path: Path) -> None:
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: A CPU\nflags\t\t: fpu avx2 avx512_vnni\n\nprocessor\t: 1\n")
    assert isa.cpuinfo_flags(x86) == {"fpu", "avx2", "avx512_vnni"}
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve\nCPU implementer\t: 0x41\n")
    assert isa.cpuinfo_flags(arm) == {"fp", "asimd", "sve"}
    assert isa.cpuinfo_flags(tmp_path / "missing") == frozenset()


@pytest.mark.parametrize(
    ("text", "arch", "name"),
    [
        ("v2", "x86_64", "x86-64-v2"),
        ("x86-64-v3", "x86_64", "x86-64-v3"),
        ("4", "x86_64", "x86-64-v4"),
        ("generic", "x86_64", "x86-64"),
        (" V4+AVX512VNNI ", "x86_64", "x86-64-v4+avx512vnni"),
        ("x86-64-v4+avx512vnni+avx512bf16", "x86_64", "x86-64-v4+avx512bf16+avx512vnni"),
        ("aarch64", "aarch64", "aarch64"),
        ("generic", "aarch64", "aarch64"),
        ("aarch64+sve+dotprod", "aarch64", "aarch64+dotprod+sve"),
    ],
)
def test_parse_isa(text: str, arch: str, name: str) -> None:
    assert isa.parse_isa(text, arch).name == name
    assert isa.parse_isa(name, arch) == isa.parse_isa(text, arch)  # a name parses back to itself


@pytest.mark.parametrize(
    ("text", "arch"),
    [
        ("pentium", "x86_64"),
        ("v9", "x86_64"),
        ("v3+avx512vnni", "x86_64"),  # an AVX-512 extension needs v4
        ("v4+sve", "x86_64"),
        ("aarch64", "x86_64"),
        ("v3", "aarch64"),
        ("host+sve", "aarch64"),
    ],
)
def test_unknown_isa_is_a_config_error(text: str, arch: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        isa.parse_isa(text, arch)
    assert info.value.code == "invalid_isa"


def test_default_is_the_host_and_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOFUSION_ISA", raising=False)
    host = isa.host_isa()
    assert isa.target_isa() == host == isa.isa_from_flags(isa.machine(), isa.cpuinfo_flags())
    monkeypatch.setenv("AUTOFUSION_ISA", "host")
    assert isa.target_isa() == host
    if host.arch != "x86_64":
        return
    monkeypatch.setenv("AUTOFUSION_ISA", "v2")
    assert isa.target_isa().name == "x86-64-v2"
    assert isa.target_isa().march_flags() == ["-march=x86-64-v2"]
    monkeypatch.setenv("AUTOFUSION_ISA", "pentium")
    with pytest.raises(InvalidConfigError):
        isa.target_isa()


def test_what_runs_where() -> None:
    v3, v4 = isa.IsaTarget("x86_64", 3), isa.IsaTarget("x86_64", 4)
    ice_lake = isa.isa_from_flags("x86_64", ICE_LAKE)
    spr = isa.isa_from_flags("x86_64", SAPPHIRE_RAPIDS)
    assert v3.runs_on(v4) and v3.runs_on(spr) and v4.runs_on(ice_lake)
    assert v4.missing_on(v3) == ["x86-64-v4"]
    assert spr.missing_on(ice_lake) == ["avx512bf16"]
    assert spr.missing_on(v3) == ["x86-64-v4", "avx512bf16", "avx512vnni"]
    arm = isa.parse_isa("aarch64", "aarch64")
    assert not v3.runs_on(arm) and "aarch64" in v3.missing_on(arm)[0]
    assert isa.parse_isa("aarch64+sve", "aarch64").missing_on(arm) == ["sve"]


def test_flags_spell_every_extension() -> None:
    spr = isa.isa_from_flags("x86_64", SAPPHIRE_RAPIDS)
    assert spr.march_flags() == ["-march=x86-64-v4", "-mavx512bf16", "-mavx512vnni"]
    explicit = spr.explicit_flags()
    assert {"-mavx2", "-mfma", "-mavx512f", "-mavx512vl", "-mavx512vnni"} <= set(explicit)
    assert "-mavx2" not in isa.IsaTarget("x86_64", 2).explicit_flags()
    assert isa.parse_isa("aarch64+sve+dotprod", "aarch64").march_flags() == ["-march=armv8-a+dotprod+sve"]


@pytest.mark.skipif(isa.machine() != "x86_64", reason="the x86 spellings need an x86 compiler")
@pytest.mark.parametrize("name", ["x86-64-v3", "x86-64-v4", "x86-64-v4+avx512bf16+avx512vnni"])
def test_the_compiler_accepts_every_x86_isa(name: str) -> None:
    target = isa.parse_isa(name, "x86_64")
    for flags in (target.march_flags(), target.explicit_flags()):
        done = subprocess.run(
            [*compiler_identity().command, *flags, "-x", "c", "-fsyntax-only", "-"],
            input="int probe;\n",
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr

"""ISA level detection and the AUTOFUSION_ISA override."""

from __future__ import annotations

import pytest

from graph_autofusion.backend.cpu import isa
from graph_autofusion.errors import InvalidConfigError

V2 = {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}
V3 = V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
V4 = V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


def test_level_from_cpuinfo_flags() -> None:
    assert isa.level_from_flags(set()) == 1
    assert isa.level_from_flags(V2) == 2
    assert isa.level_from_flags(V3) == 3
    assert isa.level_from_flags(V4) == 4
    assert isa.level_from_flags(V3 - {"fma"}) == 2  # one missing flag drops the level
    assert isa.level_from_flags(V4 - V3 | V2) == 2  # AVX-512 without AVX2 is not v4


@pytest.mark.parametrize(("text", "level"), [("v2", 2), ("x86-64-v3", 3), ("4", 4), ("generic", 1)])
def test_parse_level(text: str, level: int) -> None:
    assert isa.parse_level(text) == level


def test_bad_level_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOFUSION_ISA", "native")
    with pytest.raises(InvalidConfigError) as info:
        isa.target_isa()
    assert info.value.code == "invalid_isa"


def test_default_is_capped_at_v3_and_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOFUSION_ISA", raising=False)
    target = isa.target_isa()
    if target.arch != "x86_64":
        assert target.level == 0 and target.march_flags() == []
        return
    assert target.level == min(isa.host_level(), 3)
    monkeypatch.setenv("AUTOFUSION_ISA", "v2")
    assert isa.target_isa().name == "x86-64-v2"
    assert isa.target_isa().march_flags() == ["-march=x86-64-v2"]
    assert "-mavx2" in isa.target_isa("v3").explicit_flags()
    assert "-mavx2" not in isa.target_isa("v2").explicit_flags()

"""The host line every benchmark prints (hardware.py)."""

from __future__ import annotations

from graph_autofusion.hardware import describe_host, model_from_cpuinfo

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu avx2 avx512f

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
"""

ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd sve
CPU implementer\t: 0x41
"""


def test_a_generic_model_name_carries_its_family_and_model() -> None:
    """Two hosts that both call themselves "AMD EPYC" (a Zen 3 AVX2 one and a Zen 5 AVX-512
    one) print apart; the first processor's block is the one read."""
    assert model_from_cpuinfo(EPYC) == "AMD EPYC (family 26, model 2)"


def test_a_model_name_without_x86_numbers_is_kept_as_it_is() -> None:
    assert model_from_cpuinfo("model name\t: Some CPU\ncpu family\t: \n") == "Some CPU"


def test_cpuinfo_without_a_model_name_gives_none() -> None:
    assert model_from_cpuinfo(ARM) is None


def test_the_host_line_names_this_host() -> None:
    line = describe_host()
    assert line.startswith("host: ") and " CPUs, ISA " in line

"""benchmarks._common: the line that says which machine a report section was measured on."""

from __future__ import annotations

from pathlib import Path

from benchmarks._common import cpu_line, machine_line, write_section

_XEON = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni amx_int8 amx_tile
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni amx_int8 amx_tile
"""
_EPYC = "model name\t: AMD EPYC\nflags\t\t: fpu sse2 fma avx avx2\n"


def test_the_cpu_line_names_the_model_and_its_matrix_features() -> None:
    assert cpu_line(_XEON) == (
        "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz, amx_int8/avx512_vnni/avx512f/avx2"
    )
    assert cpu_line(_EPYC) == "AMD EPYC, avx2"
    assert cpu_line("flags: fpu sse2\n") == "unknown CPU, no avx2"


def test_every_section_is_stamped_with_this_machines_cpu(tmp_path: Path) -> None:
    report = tmp_path / "benchmarks.md"
    write_section("x", "A section", "| a |\n|---|\n| 1 |\n", report=report)
    text = report.read_text(encoding="utf-8")
    assert machine_line().rsplit(", ", 1)[0] in text  # the same line but for the time
    if Path("/proc/cpuinfo").is_file():
        assert f"({cpu_line()})" in text

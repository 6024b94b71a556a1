"""OpenMP thread control through libgomp and the usable-core count."""

from __future__ import annotations

import os

from graph_autofusion.backend.cpu import threads


def test_available_cpus_is_within_the_machine() -> None:
    assert 1 <= threads.available_cpus() <= (os.cpu_count() or 1)


def test_set_and_restore_omp_threads() -> None:
    before = threads.get_omp_threads()
    with threads.omp_threads(3):
        assert threads.get_omp_threads() == 3
        threads.set_omp_threads(1)
        assert threads.get_omp_threads() == 1
    assert threads.get_omp_threads() == before
